"""pytest plugin: the suite in parallel workers (pytest-xdist; `make test`: `-n $DDS_TEST_WORKERS --dist loadgroup`,
6 workers by default).

Registered by tests/conftest.py only when pytest-xdist is installed; without `-n` it changes nothing.

What a worker may not share with another, and how each is kept apart:
- its tests' module- and session-scoped fixtures (a control plane, a whole stack): work goes to workers a test file at a
  time (`SuiteScheduling`), so a module's stack is started once, in one worker;
- loopback ports: harness/controlplane.py `free_ports` hands each worker its own block (`PYTEST_XDIST_WORKER`);
- work folders and pytest's tmp dirs: xdist gives each worker `<basetemp>/gw<N>`;
- the CDI operator's admission webhook, fixed by the operator at port 9443 on all interfaces (no flag moves it): each
  worker runs in a network namespace of its own (harness/netns.py), so each has its own port 9443 and the operator's
  modules spread over the workers like any other. Where a namespace cannot be made (the run's header says why),
  every test module that uses harness/cdi_operator.py (directly or through harness/cdi_stack.py) is put in the xdist
  group OPERATOR_GROUP instead, so those modules run one after another in one worker;
- a module marked `spread` (pyproject.toml) is the exception to a file at a time: each of its tests is a unit of its
  own and may go to another worker, which then sets the module's fixtures up again (for a long module whose tests
  share only their fixtures: side by side they end sooner);
- the whole-run RBAC record of harness/rbac_plugin.py: each worker writes its part at its end (`rbac-gw<N>.json` in
  the run's folder, a temporary folder the controller makes and removes),
  the tests marked `rbac_audit` are held back (group LAST_GROUP) until every other worker has finished and then read
  every part, and the controller merges the parts into the run's report.

Which file a free worker gets next: the one expected to take longest (longest processing time first, so the run ends
when its longest file does rather than when a long file started last does). Expected from the seconds each file took
in this checkout's last parallel runs (pytest's cache, `dds/file_durations`: every file a run ran), else from
tests/file_durations.json (files' seconds measured on the 2-core machine, for a fresh clone: after a whole `make test`
there, copy `.pytest_cache/v/dds/file_durations` over it to refresh it), else guessed from the file's tier and number
of tests (`_GUESS_S`). A worker asks for its next file when
its current one is down to its last test (xdist's own default, two, held a second file back while one test of the
first still ran for minutes); as a worker cannot start its last test before it has a next one, a worker whose last
test is expected to be long (over LONG_LAST_TEST_S) is given the shortest file instead.

So a new test: takes its ports from `free_ports`/`free_port` (never a fixed one, never the kernel's port 0 handed on
to a process started later), its files from `tmp_path`/`tmp_path_factory`, and keeps its state in its process; a
test using something else one per machine (a fixed port, a fixed path) names it with
`@pytest.mark.xdist_group("<what it holds>")` (tests in one group run in one worker, one after another) or, for
a new module that starts the CDI operator, joins OPERATOR_MODULES.
"""

from __future__ import annotations

import ast
import functools
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

from harness import audit, netns, rbac_plugin

# Modules whose use means the CDI operator runs (its webhook port is one per network namespace).
OPERATOR_MODULES = frozenset({"harness.cdi_operator", "harness.cdi_stack", "harness.demo_cdi"})
OPERATOR_GROUP = "cdi-operator-webhook-port"
# The tests that read the whole run's RBAC record: run by one worker once all the others have finished.
LAST_GROUP = "after-every-other-test"
SPREAD_MARKER = "spread"
_RUN_DIR_KEY = "dds_xdist_run"
_OWN_NETWORK_KEY = "dds_own_network"
_run_dir_key = pytest.StashKey[Path]()
_merged_key = pytest.StashKey[bool]()
# Whether each worker has a network of its own (harness/netns.py), and if not why not.
_own_network_key = pytest.StashKey[tuple[bool, str]]()
_seconds_key = pytest.StashKey["FileSeconds"]()
DURATIONS_CACHE_KEY = "dds/file_durations"
DURATIONS_FILE = Path("tests") / "file_durations.json"
# A file nobody has timed yet: (seconds once, seconds per test) by tier. An e2e module starts a whole stack (etcd,
# apiserver, scheduler, kwok, DDS, CA: about a minute here) and its tests wait on CA's scans; integration modules
# start a control plane at most; unit tests are quick.
_GUESS_S = {"e2e": (70.0, 35.0), "integration": (3.0, 2.0)}
_GUESS_OTHER_S = (0.2, 0.05)
# A worker whose last test is expected to run longer than this is not about to be free (SuiteScheduling).
LONG_LAST_TEST_S = 30.0


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    return not _is_worker(config) and bool(getattr(config.option, "numprocesses", None)) \
        and config.option.dist != "no"


# --- grouping (in each worker; sent to the controller's scheduler through the run's folder) ---
# (pytest 9 builds a node id from its parts, so xdist's own `--dist loadgroup`, which appends "@group" to node ids in
# the worker, no longer reaches the scheduler: the groups travel in a file instead.)

@functools.lru_cache(maxsize=None)
def uses_operator(path: Path) -> bool:
    """Whether the test module at `path` imports one of OPERATOR_MODULES (or something from one), itself or through
    another test module it imports (fixtures shared from a test module that starts the operator)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name in OPERATOR_MODULES for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module in OPERATOR_MODULES or any(f"{node.module}.{alias.name}" in OPERATOR_MODULES
                                                      for alias in node.names):
                return True
            if node.module.startswith("tests.") and _test_module_uses_operator(node.module, path):
                return True
    return False


def _test_module_uses_operator(module: str, importer: Path) -> bool:
    top = next((parent for parent in importer.parents if (parent / "tests").is_dir()), None)
    candidate = top / Path(*module.split(".")).with_suffix(".py") if top is not None else None
    return candidate is not None and candidate != importer and candidate.is_file() and uses_operator(candidate)


def group_of(item: pytest.Item, own_network: bool) -> Optional[str]:
    """The group whose tests run in one worker one after another, if any (else the test goes with its file).
    `own_network`: whether each worker has a network namespace of its own (then the operator's port is per worker)."""
    if item.get_closest_marker(rbac_plugin.MARKER) is not None:
        return LAST_GROUP
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    if not own_network and uses_operator(Path(str(item.path))):
        return OPERATOR_GROUP
    # A long module whose tests share only fixtures: each test a unit of its own, so they can run side by side (its
    # module-scoped fixtures are then set up once in each worker that runs one).
    return item.nodeid if item.get_closest_marker(SPREAD_MARKER) is not None else None


@pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection is finished
def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not _is_worker(config) or _run_dir_key not in config.stash:
        return
    own_network = bool(config.workerinput.get(_OWN_NETWORK_KEY))  # type: ignore[attr-defined]
    groups = {item.nodeid: group for item in session.items if (group := group_of(item, own_network)) is not None}
    name = config.workerinput["workerid"]  # type: ignore[attr-defined]
    scratch = config.stash[_run_dir_key] / f"groups-{name}.tmp"
    scratch.write_text(json.dumps(groups))
    scratch.rename(scratch.with_suffix(".json"))


def _groups(run_dir: Path) -> dict[str, str]:
    """The groups the workers found (each collects the whole run, so any worker's file will do)."""
    found = sorted(run_dir.glob("groups-*.json"))
    return json.loads(found[0].read_text()) if found else {}


# --- scheduling (in the controller) ---

def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def seconds_per_test(collection: list[str], timed: dict[str, list[float]]) -> dict[str, float]:
    """Each collected file's expected seconds per collected test: from `timed` (file -> [seconds, tests] of a run;
    a run of part of a file counts in proportion), else guessed (`_GUESS_S`)."""
    counts: dict[str, int] = {}
    for nodeid in collection:
        counts[file_of(nodeid)] = counts.get(file_of(nodeid), 0) + 1
    expected = {}
    for path, count in counts.items():
        seconds, tests = timed.get(path, (0.0, 0.0))
        if tests > 0:
            expected[path] = seconds / tests
        else:
            once, each = _GUESS_S.get(Path(path).parts[1] if len(Path(path).parts) > 2 else "", _GUESS_OTHER_S)
            expected[path] = once / count + each
    return expected


def timed_files(config: pytest.Config) -> dict[str, list[float]]:
    """file -> [seconds, tests]: tests/file_durations.json, overridden by this checkout's last runs (pytest's cache)."""
    timed: dict[str, list[float]] = {}
    baseline = config.rootpath / DURATIONS_FILE
    if baseline.is_file():
        timed.update(json.loads(baseline.read_text()))
    cache = getattr(config, "cache", None)
    if cache is not None:
        timed.update(cache.get(DURATIONS_CACHE_KEY, {}))
    return timed


class SuiteScheduling(LoadGroupScheduling):
    """`--dist loadgroup` with four changes: a test without an xdist group goes with its file (as `--dist loadfile`: a
    module's fixtures are built once); a free worker gets the unit expected to take longest (LPT); it asks for it
    only when down to its last test; and the LAST_GROUP tests go to one worker after every other worker has run all
    its tests and ended (so every worker's part of the RBAC record is written)."""

    def __init__(self, config: pytest.Config, log: Optional[Producer] = None) -> None:
        super().__init__(config, log)
        self._final: Optional[WorkerController] = None
        self._run_dir = config.stash[_run_dir_key]
        self._group_of: Optional[dict[str, str]] = None
        self._timed = timed_files(config)
        self._per_test: Optional[dict[str, float]] = None
        self._expected: dict[str, float] = {}

    def _split_scope(self, nodeid: str) -> str:
        if self._group_of is None:  # first called once every worker has sent its collection
            self._group_of = _groups(self._run_dir)
        return self._group_of.get(nodeid) or file_of(nodeid)

    def _expected_seconds(self, scope: str) -> float:
        if self._per_test is None:
            self._per_test = seconds_per_test(self.collection or [], self._timed)
        if scope not in self._expected:
            self._expected[scope] = sum(self._per_test.get(file_of(nodeid), 0.0) for nodeid in self.workqueue[scope])
        return self._expected[scope]

    def _reschedule(self, node: WorkerController) -> None:
        """xdist's, but a worker gets more work only once down to its last test (which it cannot start before it knows
        what follows it), so the next unit is chosen when the worker is about to be free, not a whole test early."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) <= 1:
            self._assign_work_unit(node)

    def _still_busy_for(self, node: WorkerController) -> float:
        """The expected seconds of the tests `node` has yet to run."""
        assert self._per_test is not None
        return sum(self._per_test.get(file_of(nodeid), 0.0) for unit in self.assigned_work.get(node, {}).values()
                   for nodeid, done in unit.items() if not done)

    def _assign_work_unit(self, node: WorkerController) -> None:
        ready = [scope for scope in self.workqueue if scope != LAST_GROUP]
        if ready:
            longest = max(ready, key=self._expected_seconds)
            # A worker starts its last test only once it has a next one. If that last test is a long one (a unit of
            # one test), the next unit will wait for it: the shortest then, leaving the long ones to workers that will
            # be free sooner.
            pick = longest if self._still_busy_for(node) <= LONG_LAST_TEST_S else min(ready, key=self._expected_seconds)
            self.workqueue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)
            return
        # Only the held-back group is left: this worker will run it; every other one finishes what it has and ends.
        if self._final is None:
            self._final = node
            for other in self.nodes:
                if other is not node and not other.shutting_down:
                    other.shutdown()
        elif node is not self._final:
            node.shutdown()
        self._release_last()

    def remove_node(self, node: WorkerController) -> Optional[str]:
        if node is self._final:
            self._final = None  # it crashed: the group goes to whichever worker asks next
        crashed = super().remove_node(node)
        self._release_last()
        return crashed

    def _release_last(self) -> None:
        if self._final is not None and self.nodes == [self._final] and LAST_GROUP in self.workqueue:
            super()._assign_work_unit(self._final)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Optional[SuiteScheduling]:
    return SuiteScheduling(config, log) if config.option.dist == "loadgroup" and _run_dir_key in config.stash else None


# --- each worker's network, the files' durations, the RBAC record's parts ---

def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config):
        config.stash[_run_dir_key] = Path(tempfile.mkdtemp(prefix="dds-xdist-run-"))
        config.stash[_own_network_key] = _isolate_workers(config)
        config.stash[_seconds_key] = FileSeconds()
        config.pluginmanager.register(config.stash[_seconds_key], "dds-file-seconds")
    elif _is_worker(config) and _RUN_DIR_KEY in config.workerinput:  # type: ignore[attr-defined]
        config.stash[_run_dir_key] = Path(config.workerinput[_RUN_DIR_KEY])  # type: ignore[attr-defined]
        if config.workerinput.get(_OWN_NETWORK_KEY):  # type: ignore[attr-defined]
            netns.loopback_up()  # before anything of this worker listens


def _isolate_workers(config: pytest.Config) -> tuple[bool, str]:
    """Start each worker in a network namespace of its own when the machine allows it; whether it does, and how or
    why not."""
    specs = list(config.option.tx)
    if any(spec != "popen" for spec in specs):
        return False, "workers given with --tx"
    prefix, how = netns.worker_prefix(config.rootpath)
    if prefix is None:
        return False, how
    config.option.tx = [f"popen//python={shlex.join([*prefix, sys.executable])}" for _ in specs]
    return True, how


def pytest_configure_node(node: WorkerController) -> None:
    node.workerinput[_RUN_DIR_KEY] = str(node.config.stash[_run_dir_key])
    node.workerinput[_OWN_NETWORK_KEY] = node.config.stash[_own_network_key][0]


class FileSeconds:
    """In the controller: each file's seconds in this run (setup, call and teardown of each of its tests, module
    fixtures included) and its tests, kept in pytest's cache at the end for the next run's order."""

    def __init__(self) -> None:
        self.timed: dict[str, list[float]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        timed = self.timed.setdefault(file_of(report.nodeid), [0.0, 0])
        timed[0] += report.duration
        timed[1] += report.when == "setup"

    def keep(self, config: pytest.Config) -> None:
        cache = getattr(config, "cache", None)
        if cache is None or not self.timed:
            return
        kept = cache.get(DURATIONS_CACHE_KEY, {})
        kept.update({path: [round(seconds, 1), tests] for path, (seconds, tests) in self.timed.items() if tests})
        cache.set(DURATIONS_CACHE_KEY, dict(sorted(kept.items())))


def record_to_json(record: rbac_plugin.AuditRecord) -> dict[str, Any]:
    return {"dds_used": [[grant.verb, grant.resource, grant.subresource, grant.api_group, test]
                         for grant, test in record.dds_used.items()],
            # per set of features DDS held: the per-fabric audit reads every worker's, not only its own worker's
            "dds_used_with": [[list(features), grant.verb, grant.resource, grant.subresource, grant.api_group, test]
                              for features, used in record.dds_used_with.items() for grant, test in used.items()],
            "collected_files": sorted(record.collected_files), "deselected": record.deselected,
            "failed": record.failed, "control_plane_ran": bool(audit.registered())}


def merge_part(record: rbac_plugin.AuditRecord, part: dict[str, Any]) -> None:
    """Add another worker's part to `record` (each part at most once counts: lists are kept without repeats)."""
    for verb, resource, subresource, api_group, test in part["dds_used"]:
        record.dds_used.setdefault(audit.Grant(verb, resource, subresource, api_group), test)
    for features, verb, resource, subresource, api_group, test in part["dds_used_with"]:
        record.dds_used_with.setdefault(tuple(features), {}).setdefault(
            audit.Grant(verb, resource, subresource, api_group), test)
    record.collected_files.update(part["collected_files"])
    record.deselected.extend(n for n in part["deselected"] if n not in record.deselected)
    record.failed.extend(n for n in part["failed"] if n not in record.failed)


def _merge_parts(config: pytest.Config, record: rbac_plugin.AuditRecord) -> bool:
    """Merge every part written so far into `record`; whether any of them saw a control plane run."""
    ran = False
    for path in sorted(config.stash[_run_dir_key].glob("rbac-*.json")):
        part = json.loads(path.read_text())
        merge_part(record, part)
        ran = ran or part["control_plane_ran"]
        if part["late"] and not _is_worker(config):
            config.stash[rbac_plugin._late_key] = "\n".join(filter(None, (config.stash.get(rbac_plugin._late_key, None),
                                                                           part["late"])))
    return ran


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first LAST_GROUP test of a worker: the other workers' parts into this worker's record (they have all
    ended: SuiteScheduling)."""
    config = item.config
    if item.get_closest_marker(rbac_plugin.MARKER) is None or _run_dir_key not in config.stash:
        return
    if not config.stash.get(_merged_key, False):
        config.stash[_merged_key] = True
        _merge_parts(config, rbac_plugin._record(config))


@pytest.hookimpl(trylast=True)  # after harness/rbac_plugin.py read the audit logs a last time
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _run_dir_key not in config.stash:
        return
    record = rbac_plugin._record(config)
    if _is_worker(config):
        name = config.workerinput["workerid"]  # type: ignore[attr-defined]
        part = record_to_json(record)
        # 403s read after the worker's last test: a worker's terminal summary is not shown, the controller's is
        part["late"] = config.stash.get(rbac_plugin._late_key, None)
        (config.stash[_run_dir_key] / f"rbac-{name}.json").write_text(json.dumps(part))
        return
    config.stash[_seconds_key].keep(config)
    if _merge_parts(config, record):
        rbac_plugin.write_report(session, record)
    if config.stash.get(rbac_plugin._late_key, None):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(config.stash[_run_dir_key], ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    if not _is_controller(config):
        return None
    own_network, how = config.stash[_own_network_key]
    network = (f"each in a network namespace of its own ({how})" if own_network else
               f"sharing the machine's network ({how}), so the CDI operator's modules run in one worker")
    return (f"dds: {config.option.numprocesses} workers, each given a test file (or an xdist group) at a time, the "
            f"longest expected first, {network} (harness/xdist_plugin.py)")
