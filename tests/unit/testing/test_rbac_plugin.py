"""harness/rbac_plugin.py as a test run sees it: a 403 the apiserver answered to DDS's ServiceAccount during a test
fails that test, naming the request, and the tests after it are not blamed. Runs pytest on a small test file in a
child process; the audit log is written by the test itself instead of an apiserver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

REFUSING_TEST = '''
import json
from harness import audit

def test_refused(tmp_path):
    log = tmp_path / "audit.log"
    audit.register(log)
    log.write_text(json.dumps({
        "verb": "patch", "user": {"username": "system:serviceaccount:dds-system:dds"},
        "objectRef": {"resource": "resourceclaims", "subresource": "status", "apiGroup": "resource.k8s.io",
                      "namespace": "demo", "name": "claim-1"},
        "responseStatus": {"code": 403}, "requestURI": "/apis/resource.k8s.io/v1/namespaces/demo/resourceclaims/claim-1",
        "requestReceivedTimestamp": "2026-01-01T00:00:00Z"}) + "\\n")

def test_after():
    pass
'''


def test_a_403_to_dds_fails_the_test_that_caused_it(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["harness.rbac_plugin"]\n')
    (tmp_path / "test_refusal.py").write_text(REFUSING_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rE",
                           f"--basetemp={tmp_path / 'base'}", "test_refusal.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ERROR at teardown of test_refused" in done.stdout, done.stdout
    assert ("system:serviceaccount:dds-system:dds: patch resource.k8s.io/resourceclaims/status claim-1 in namespace "
            "demo -> 403") in done.stdout, done.stdout
    assert "2 passed, 1 error" in done.stdout, done.stdout
