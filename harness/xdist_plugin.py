"""pytest plugin: the suite in parallel workers (pytest-xdist; `make test`: `-n $DDS_TEST_WORKERS --dist loadgroup`,
6 workers by default).

Registered by tests/conftest.py only when pytest-xdist is installed; without `-n` it changes nothing.

What a worker may not share with another, and how each is kept apart:
- its tests' module- and session-scoped fixtures (a control plane, a whole stack): work goes to workers a test file at a
  time (`SuiteScheduling`), so a module's stack is started once, in one worker;
- loopback ports: harness/controlplane.py `free_ports` hands each worker its own block (`PYTEST_XDIST_WORKER`);
- work folders and pytest's tmp dirs: xdist gives each worker `<basetemp>/gw<N>`;
- the CDI operator's admission webhook, fixed by the operator at port 9443 on all interfaces (no flag moves it): every
  test module that uses harness/cdi_operator.py (directly or through harness/cdi_stack.py) is put in the xdist group
  OPERATOR_GROUP, so those modules run one after another in one worker;
- the whole-run RBAC record of harness/rbac_plugin.py: each worker writes its part at its end (`rbac-gw<N>.json` in
  the run's folder, a temporary folder the controller makes and removes),
  the tests marked `rbac_audit` are held back (group LAST_GROUP) until every other worker has finished and then read
  every part, and the controller merges the parts into the run's report.

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
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

from harness import audit, rbac_plugin

# Modules whose use means the CDI operator runs (its webhook port is one per machine).
OPERATOR_MODULES = frozenset({"harness.cdi_operator", "harness.cdi_stack", "harness.demo_cdi"})
OPERATOR_GROUP = "cdi-operator-webhook-port"
# The tests that read the whole run's RBAC record: run by one worker once all the others have finished.
LAST_GROUP = "after-every-other-test"
_RUN_DIR_KEY = "dds_xdist_run"
_run_dir_key = pytest.StashKey[Path]()
_merged_key = pytest.StashKey[bool]()


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


def group_of(item: pytest.Item) -> Optional[str]:
    """The group whose tests run in one worker one after another, if any (else the test goes with its file)."""
    if item.get_closest_marker(rbac_plugin.MARKER) is not None:
        return LAST_GROUP
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    return OPERATOR_GROUP if uses_operator(Path(str(item.path))) else None


@pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection is finished
def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not _is_worker(config) or _run_dir_key not in config.stash:
        return
    groups = {item.nodeid: group for item in session.items if (group := group_of(item)) is not None}
    name = config.workerinput["workerid"]  # type: ignore[attr-defined]
    scratch = config.stash[_run_dir_key] / f"groups-{name}.tmp"
    scratch.write_text(json.dumps(groups))
    scratch.rename(scratch.with_suffix(".json"))


def _groups(run_dir: Path) -> dict[str, str]:
    """The groups the workers found (each collects the whole run, so any worker's file will do)."""
    found = sorted(run_dir.glob("groups-*.json"))
    return json.loads(found[0].read_text()) if found else {}


# --- scheduling (in the controller) ---

class SuiteScheduling(LoadGroupScheduling):
    """`--dist loadgroup` with two changes: a test without an xdist group goes with its file (as `--dist loadfile`: a
    module's fixtures are built once), and the LAST_GROUP tests go to one worker after every other worker has run
    all its tests and ended (so every worker's part of the RBAC record is written)."""

    def __init__(self, config: pytest.Config, log: Optional[Producer] = None) -> None:
        super().__init__(config, log)
        self._final: Optional[WorkerController] = None
        self._run_dir = config.stash[_run_dir_key]
        self._group_of: Optional[dict[str, str]] = None

    def _split_scope(self, nodeid: str) -> str:
        if self._group_of is None:  # first called once every worker has sent its collection
            self._group_of = _groups(self._run_dir)
        return self._group_of.get(nodeid) or nodeid.split("::", 1)[0]

    def _assign_work_unit(self, node: WorkerController) -> None:
        ready = next((scope for scope in self.workqueue if scope != LAST_GROUP), None)
        if ready is not None:
            self.workqueue.move_to_end(ready, last=False)
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


# --- the RBAC record's parts ---

def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config):
        config.stash[_run_dir_key] = Path(tempfile.mkdtemp(prefix="dds-xdist-run-"))
    elif _is_worker(config) and _RUN_DIR_KEY in config.workerinput:  # type: ignore[attr-defined]
        config.stash[_run_dir_key] = Path(config.workerinput[_RUN_DIR_KEY])  # type: ignore[attr-defined]


def pytest_configure_node(node: WorkerController) -> None:
    node.workerinput[_RUN_DIR_KEY] = str(node.config.stash[_run_dir_key])


def record_to_json(record: rbac_plugin.AuditRecord) -> dict[str, Any]:
    return {"dds_used": [[grant.verb, grant.resource, grant.subresource, grant.api_group, test]
                         for grant, test in record.dds_used.items()],
            "collected_files": sorted(record.collected_files), "deselected": record.deselected,
            "failed": record.failed, "control_plane_ran": bool(audit.registered())}


def merge_part(record: rbac_plugin.AuditRecord, part: dict[str, Any]) -> None:
    """Add another worker's part to `record` (each part at most once counts: lists are kept without repeats)."""
    for verb, resource, subresource, api_group, test in part["dds_used"]:
        record.dds_used.setdefault(audit.Grant(verb, resource, subresource, api_group), test)
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
    if _merge_parts(config, record):
        rbac_plugin.write_report(session, record)
    if config.stash.get(rbac_plugin._late_key, None):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(config.stash[_run_dir_key], ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    if not _is_controller(config):
        return None
    return (f"dds: {config.option.numprocesses} workers, each given a test file (or an xdist group) at a time "
            f"(harness/xdist_plugin.py)")
