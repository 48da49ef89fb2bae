"""`dds serve` against a cluster it cannot use ends with one line saying what is wrong and what to do, and the exit
code docs/configuration.md gives for it — never a traceback, in text and in JSON logs. The cases that need an
apiserver's answer (credentials refused, permission denied, a CRD missing) are in
tests/integration/kube/test_preflight.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from dds.cli import main
from dds.commands.failures import EXIT_CLUSTER_NOT_READY, EXIT_NO_CLUSTER, EXIT_USAGE, Failure
from dds.kube.preflight import ProblemKind, explain

UNREACHABLE = {  # nothing listens on port 1: a real connection refused, no stand-in
    "apiVersion": "v1", "kind": "Config", "current-context": "c",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "users": [{"name": "u", "user": {"token": "t"}}]}


@pytest.fixture(autouse=True)
def _outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "DDS_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DDS_FABRIC", "simulated")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level  # `dds serve` points logging at this test's captured stderr


def serve(*flags: str) -> list[str]:
    return ["serve", "--insecure", *flags]


def kubeconfig(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    return str(path)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_missing_kubeconfig_is_a_usage_error_naming_the_file(tmp_path: Path, capsys) -> None:
    assert main(serve("--kubeconfig", str(tmp_path / "nope"))) == EXIT_USAGE
    line = one_line(capsys)
    assert line.startswith(f"dds serve: kubeconfig {tmp_path / 'nope'} does not exist") and "to fix:" in line, line


@pytest.mark.parametrize("text", ["hello", "::: [", "apiVersion: v1\nkind: Config\n", "[1, 2]"])
def test_a_garbage_kubeconfig_is_a_usage_error_naming_the_file(tmp_path: Path, capsys, text: str) -> None:
    path = kubeconfig(tmp_path, text)
    assert main(serve("--kubeconfig", path)) == EXIT_USAGE
    line = one_line(capsys)
    assert f"kubeconfig {path} is not a usable kubeconfig" in line and f"kubectl --kubeconfig {path}" in line, line


def test_in_cluster_outside_a_pod_says_so(capsys) -> None:
    assert main(serve("--in-cluster")) == EXIT_NO_CLUSTER
    line = one_line(capsys)
    assert "--in-cluster, but this is not a pod with a ServiceAccount" in line and "--kubeconfig FILE" in line, line


def test_an_unreachable_apiserver_is_one_line_with_the_address(tmp_path: Path, capsys) -> None:
    assert main(serve("--kubeconfig", kubeconfig(tmp_path, yaml.safe_dump(UNREACHABLE)))) == EXIT_NO_CLUSTER
    line = one_line(capsys)
    assert line.startswith("dds serve: cannot reach the apiserver at https://127.0.0.1:1: ") and "refused" in line
    assert "kubectl cluster-info" in line, line


@pytest.mark.parametrize("how", ["env", "flag"])
def test_the_failure_is_one_json_line_with_json_logs(tmp_path: Path, capsys, monkeypatch, how: str) -> None:
    flags = ["--kubeconfig", kubeconfig(tmp_path, yaml.safe_dump(UNREACHABLE))]
    if how == "env":
        monkeypatch.setenv("DDS_LOG_FORMAT", "json")
    else:
        flags += ["--log-format", "json"]
    assert main(serve(*flags)) == EXIT_NO_CLUSTER
    entry = json.loads(one_line(capsys))
    assert entry["level"] == "ERROR" and entry["logger"] == "dds.serve" and entry["exit_code"] == EXIT_NO_CLUSTER
    assert entry["reason"] == "unreachable" and entry["msg"].startswith("cannot reach the apiserver")
    assert "kubeconfig's server address" in entry["fix"]


def test_a_settings_error_is_json_too_when_logs_are(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DDS_LOG_FORMAT", "json")
    monkeypatch.setenv("DDS_POLICY", "no-such-policy")
    assert main(serve("--kubeconfig", "x")) == EXIT_USAGE
    entry = json.loads(one_line(capsys))
    assert "unknown policy 'no-such-policy'" in entry["msg"] and entry["exit_code"] == EXIT_USAGE


def test_plan_reports_an_unreachable_cluster_the_same_way(tmp_path: Path, capsys) -> None:
    assert main(["plan", "--kubeconfig", kubeconfig(tmp_path, yaml.safe_dump(UNREACHABLE))]) == EXIT_NO_CLUSTER
    assert one_line(capsys).startswith("dds plan: cannot reach the apiserver at https://127.0.0.1:1")


@pytest.mark.parametrize("status, kind, code", [
    (401, ProblemKind.CREDENTIALS, EXIT_NO_CLUSTER),
    (403, ProblemKind.PERMISSION, EXIT_CLUSTER_NOT_READY),
    (404, ProblemKind.MISSING_API, EXIT_CLUSTER_NOT_READY),
])
def test_an_apiserver_refusal_met_while_starting_maps_to_its_exit_code(status: int, kind: ProblemKind,
                                                                      code: int) -> None:
    body = json.dumps({"kind": "Status", "message": "the server said why"})
    problem = explain(client.ApiException(status=status, reason="refused", http_resp=None), "https://k8s:6443")
    assert problem is not None and problem.kind == kind and problem.fix
    assert Failure.of(problem).exit_code == code
    exc = client.ApiException(status=status, reason="refused")
    exc.body = body
    assert "the server said why" in explain(exc, "https://k8s:6443").message


@pytest.mark.parametrize("fabric", ["simulated", "composability-request", "redfish"])
def test_what_the_start_checks_is_what_the_shipped_rbac_grants(fabric: str) -> None:
    """The preflight asks only for what manifests/dds/rbac.yaml grants: a cluster set up as shipped passes it."""
    from dds.config import Settings
    from dds.kube.preflight import needed_access
    from harness.audit import Grant
    from harness.rbac import DDS, granted

    shipped = granted(DDS)
    for access in needed_access(Settings(fabric=fabric, leader_election=True)):
        assert Grant(access.verb, access.resource, access.subresource, access.group) in shipped, access


@pytest.mark.parametrize("variable, value, said", [
    ("DDS_POLICY", "nope", "invalid settings: policy (from DDS_POLICY): Value error, unknown policy 'nope'"),
    ("DDS_LEADER_ELECTION", "maybe", "invalid settings: leader_election (from DDS_LEADER_ELECTION): "),
    ("DDS_REDFISH__TIMEOUT_SECONDS", "x", "redfish.timeout_seconds (from DDS_REDFISH__TIMEOUT_SECONDS): "),
    ("DDS_MACHINESET_NAMESPACES", "[bad", "cannot load settings: DDS_MACHINESET_NAMESPACES is not valid JSON"),
])
def test_a_malformed_variable_is_named(monkeypatch, capsys, variable: str, value: str, said: str) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["serve", "--insecure", "--node-groups", "examples/node-groups.yaml"]) == EXIT_USAGE
    assert said in one_line(capsys)
