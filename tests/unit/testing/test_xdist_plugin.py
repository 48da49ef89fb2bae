"""harness/xdist_plugin.py and the per-worker ports of harness/controlplane.py, as a parallel run sees them: a test
file's tests stay in one worker; each worker has a network namespace of its own where the machine allows one, and
where it does not (or DDS_TEST_NETNS=0) the modules using the CDI operator (one webhook port per network) run in one
worker; the `rbac_audit` tests start only after every other test has ended and see the other workers' records; the
file expected to take longest goes first, and each run's file durations are kept for the next; each worker's ports
come from its own block. Runs pytest with 3 workers (1 for the order) on small test files in a child process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import audit, controlplane, netns, rbac_plugin, xdist_plugin

ROOT = Path(__file__).resolve().parents[3]

RECORDING = '''
import json, os, time
import pytest

@pytest.fixture(autouse=True)
def record(request):
    began = time.time()
    yield
    with open(os.environ["TEST_LOG"], "a") as log:
        log.write(json.dumps({"test": request.node.nodeid.split("@")[0], "worker": os.environ["PYTEST_XDIST_WORKER"],
                              "network": os.readlink("/proc/self/ns/net"), "began": began,
                              "ended": time.time()}) + "\\n")
'''

PLAIN = '''
import time

def test_one():
    time.sleep(0.5)

def test_two():
    time.sleep(0.5)
'''

AUDIT = '''
import json, os
import pytest

pytestmark = pytest.mark.rbac_audit

def test_sees_the_whole_run(rbac_audit):
    runs = [json.loads(line) for line in open(os.environ["TEST_LOG"])]
    assert len(runs) == 9, runs
    assert "test_second.py::test_fails (call)" in rbac_audit.failed, rbac_audit.failed
    assert {"test_first.py", "test_second.py", "test_op_a.py", "test_op_b.py"} <= rbac_audit.collected_files
'''


OWN_NETWORK, HOW = netns.worker_prefix(ROOT)


def _run_pytest(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--dist", "loadgroup", f"--basetemp={folder / 'base'}",
                           *args], cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", params=["own network", "shared network"])
def parallel_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[subprocess.CompletedProcess[str], list, str]]:
    if request.param == "own network" and OWN_NETWORK is None:
        pytest.skip(f"this machine gives a worker no network namespace of its own: {HOW}")
    folder = tmp_path_factory.mktemp("xdist-run")
    plugins = 'pytest_plugins = ["harness.rbac_plugin", "harness.xdist_plugin"]\n'
    (folder / "conftest.py").write_text(plugins + RECORDING)
    (folder / "test_first.py").write_text(PLAIN)
    (folder / "test_second.py").write_text(PLAIN + "\ndef test_fails():\n    assert False\n")
    (folder / "test_op_a.py").write_text("from harness.cdi_operator import WEBHOOK_PORT\n" + PLAIN)
    (folder / "test_op_b.py").write_text("from harness import cdi_stack\n" + PLAIN)
    (folder / "test_zz_audit.py").write_text(AUDIT)
    log = folder / "runs.jsonl"
    env = {"TEST_LOG": str(log), netns.DISABLE_ENV: "1" if request.param == "own network" else "0"}
    done = _run_pytest(folder, env, "-p", "no:cacheprovider", "-n", "3")
    yield done, [json.loads(line) for line in log.read_text().splitlines()], request.param


def test_every_test_ran_and_the_failure_is_named(
        parallel_run: tuple[subprocess.CompletedProcess[str], list, str]) -> None:
    done, runs, _ = parallel_run
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 9 passed" in done.stdout, done.stdout
    assert "FAILED test_second.py::test_fails" in done.stdout, done.stdout


def test_a_files_tests_share_a_worker_and_the_operators_users_do_when_the_network_is_shared(
        parallel_run: tuple[subprocess.CompletedProcess[str], list, str]) -> None:
    _, runs, network = parallel_run
    workers: dict[str, set[str]] = {}
    for run in runs:
        workers.setdefault(run["test"].split("::")[0], set()).add(run["worker"])
    assert all(len(used) == 1 for used in workers.values()), workers
    networks = {run["worker"]: run["network"] for run in runs}
    if network == "own network":
        # Each worker its own network (so its own port 9443), none the machine's: the operator's users may spread.
        assert len(set(networks.values())) == len(networks) > 1, networks
        assert os.readlink("/proc/self/ns/net") not in networks.values(), networks
    else:
        assert set(networks.values()) == {os.readlink("/proc/self/ns/net")}, networks
        assert workers["test_op_a.py"] == workers["test_op_b.py"], workers


def test_the_audit_test_starts_after_every_other_test_ended(
        parallel_run: tuple[subprocess.CompletedProcess[str], list, str]) -> None:
    _, runs, _ = parallel_run
    audit = next(run for run in runs if "test_zz_audit" in run["test"])
    others = [run for run in runs if run is not audit]
    assert len(others) == 9
    assert audit["began"] >= max(run["ended"] for run in others), runs


@pytest.fixture
def as_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[range]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    controlplane._worker_ports.cache_clear()
    first = controlplane.WORKER_PORT_BASE + 2 * controlplane.WORKER_PORT_BLOCK
    yield range(first, first + controlplane.WORKER_PORT_BLOCK)
    controlplane._worker_ports.cache_clear()


def test_a_worker_picks_distinct_ports_from_its_own_block_and_passes_over_taken_ones(as_worker: range) -> None:
    first = controlplane.free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        # The next port of the round, held by someone else: it must be passed over.
        after = first[-1] + 1 if first[-1] + 1 in as_worker else as_worker.start
        taken.bind(("127.0.0.1", after))
        taken.listen()
        second = controlplane.free_ports(3)
    assert all(port in as_worker for port in first + second), (first, second)
    assert len(set(first + second)) == 6, (first, second)
    assert after not in second


def test_the_longest_unit_goes_first_a_spread_modules_tests_are_units_and_durations_are_kept(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["harness.xdist_plugin"]\n' + RECORDING)
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / name).write_text(PLAIN)
    (tmp_path / "test_d.py").write_text("import pytest\npytestmark = pytest.mark.spread\n" + PLAIN)
    (tmp_path / "test_e.py").write_text("def test_long():\n    pass\n")
    # Measured before (seconds, tests): e one long test; c 40 s; d 50 s as a file but spread (25 s a test); a 10 s;
    # b never timed (guessed: a fraction of a second).
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "file_durations.json").write_text(json.dumps({
        "test_a.py": [10.0, 2], "test_c.py": [40.0, 2], "test_d.py": [50.0, 2], "test_e.py": [1000.0, 1]}))
    log = tmp_path / "runs.jsonl"
    done = _run_pytest(tmp_path, {"TEST_LOG": str(log)}, "-n", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    order = [json.loads(line)["test"] for line in log.read_text().splitlines()]
    # e first (the longest); as the worker cannot start e's one test before it has a next one, that next one is the
    # shortest (b: e keeps the worker busy long after); then, longest first, c, d's tests one by one, a.
    assert order == ["test_e.py::test_long", "test_b.py::test_one", "test_b.py::test_two",
                     "test_c.py::test_one", "test_c.py::test_two", "test_d.py::test_one", "test_d.py::test_two",
                     "test_a.py::test_one", "test_a.py::test_two"], order
    kept = json.loads((tmp_path / ".pytest_cache" / "v" / "dds" / "file_durations").read_text())
    assert set(kept) == {"test_a.py", "test_b.py", "test_c.py", "test_d.py", "test_e.py"}, kept
    assert all(tests == 2 and 1.0 <= seconds < 60 for path, (seconds, tests) in kept.items()
               if path != "test_e.py"), kept
    assert kept["test_e.py"][1] == 1, kept


def test_a_workers_part_carries_what_dds_used_per_set_of_features_to_the_audit() -> None:
    """The per-fabric audit (tests/integration/ops/test_rbac_audit.py) reads what DDS used with each fabric's grants
    in every worker: a part written by one worker and merged in another keeps it, test names and all."""
    watch = audit.Grant("watch", "composabilityrequests", "", "cro.hpsys.ibm.ie.com")
    written = rbac_plugin.AuditRecord()
    written.dds_used[watch] = "tests/e2e/test_cdi_operator.py::test_a"
    written.dds_used_with[("composability-request",)] = {watch: "tests/e2e/test_cdi_operator.py::test_a"}
    part = json.loads(json.dumps(xdist_plugin.record_to_json(written)))
    merged = rbac_plugin.AuditRecord()
    merged.dds_used_with[("composability-request",)] = {}
    xdist_plugin.merge_part(merged, part)
    assert merged.dds_used_with == {("composability-request",): {watch: "tests/e2e/test_cdi_operator.py::test_a"}}
    assert merged.dds_used == {watch: "tests/e2e/test_cdi_operator.py::test_a"}
