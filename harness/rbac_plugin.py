"""pytest plugin: DDS and cluster-autoscaler run under the RBAC manifests/ ships, and the suite proves it is enough
and no more (registered in tests/conftest.py next to harness/pytest_plugin.py).

Fixtures:
- `dds_kubeconfig`, `autoscaler_kubeconfig` (session): kubeconfigs of the ServiceAccounts harness/rbac.py installs on
  the session's control plane. `dds_api` (function): an ApiClient on `dds_kubeconfig`, for DDS's parts built in the
  test process. The test's own setup and inspection keep the admin `control_plane.api_client()`.
- `rbac_audit` (session): what the audit logs showed so far (`AuditRecord`), for tests/integration/ops/
  test_rbac_audit.py.
- `expect_refusal` (function): `expect_refusal(resource, name)` declares that the test itself makes DDS's
  ServiceAccount send a request on that object which the apiserver must refuse (tests/integration/ops/
  test_admission_policies.py): that 403 is the test's assertion, not a missing grant. Names are unique per test
  object, so the declaration holds for the session (the audit line may be read after the test ends).

After each test's teardown (module- and session-scoped fixtures included, as pytest finalises them in the teardown of
the last test that uses them) every control plane's audit log is read from where the previous read stopped (harness/
audit.py): a 403 answered to DDS's or CA's ServiceAccount fails that test (an error in its teardown) naming each refused
request; what DDS's ServiceAccount was allowed to do is added to `AuditRecord.dds_used`. At the end of the session the
record is written to `<basetemp>/../dds-rbac-usage-<basetemp name>.json` (path shown in the terminal summary).

Tests marked `rbac_audit` run after every other test, so they see the whole run's record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from kubernetes import client

from harness import audit, rbac

MARKER = "rbac_audit"
# The suites whose runs can exercise DDS's grants; a run that did not collect each of their test files cannot say a
# grant is unused (tests/integration/ops/test_rbac_audit.py skips that half then).
AUDITED_SUITES = ("tests/integration", "tests/e2e")


@dataclass
class AuditRecord:
    cursor: audit.AuditCursor = field(default_factory=audit.AuditCursor)
    dds_used: dict[audit.Grant, str] = field(default_factory=dict)  # grant -> the first test that used it
    # The same per set of features DDS's ServiceAccount had on the plane that answered (harness/rbac.py dds_for: an
    # e2e stack of one fabric): what each fabric used, for tests/integration/ops/test_rbac_audit.py.
    dds_used_with: dict[tuple[str, ...], dict[audit.Grant, str]] = field(default_factory=dict)
    collected_files: set[str] = field(default_factory=set)  # "tests/e2e/test_demo.py", ...
    deselected: list[str] = field(default_factory=list)  # node ids deselected other than as `slow` (-k, -m ...)
    failed: list[str] = field(default_factory=list)  # node ids of tests that failed or errored
    expected_refusals: set[tuple[str, str]] = field(default_factory=set)  # (resource, name) a test refuses on purpose
    report_path: Optional[Path] = None

    def absorb(self, requests: list[audit.AuditedRequest], nodeid: str,
               features: Optional[tuple[str, ...]] = None) -> list[audit.AuditedRequest]:
        """Count DDS's allowed requests as used by `nodeid` (and by DDS with `features`, when the plane that answered
        them is known); return the 403s answered to DDS or CA."""
        for grant in sorted(audit.grants_used(requests, rbac.DDS.username), key=repr):
            self.dds_used.setdefault(grant, nodeid)
            if features is not None:
                self.dds_used_with.setdefault(features, {}).setdefault(grant, nodeid)
        refused = audit.forbidden(requests, (identity.username for identity in rbac.IDENTITIES), audit.restarts())
        return [r for r in refused if (r.resource, r.name) not in self.expected_refusals]


_record_key = pytest.StashKey[AuditRecord]()


def _record(config: pytest.Config) -> AuditRecord:
    if _record_key not in config.stash:
        config.stash[_record_key] = AuditRecord()
    return config.stash[_record_key]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: reads the whole run's audit record; runs after every other test")
    _record(config)


def pytest_itemcollected(item: pytest.Item) -> None:
    root, path = Path(str(item.config.rootpath)), Path(str(item.path))
    if path.is_relative_to(root):
        _record(item.config).collected_files.add(path.relative_to(root).as_posix())


def pytest_deselected(items: list[pytest.Item]) -> None:
    # `make test` leaves out the soak variants (-m "not slow") on every run: that is still the whole suite.
    for item in items:
        if item.get_closest_marker("slow") is None:
            _record(item.config).deselected.append(item.nodeid)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable: the audit tests keep their order among themselves, after everything else.
    items.sort(key=lambda item: item.get_closest_marker(MARKER) is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if report.failed:
        _record(item.config).failed.append(f"{report.nodeid} ({report.when})")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    result = yield  # the test's fixtures, and those of wider scope it was the last user of, are finalised now
    record = _record(item.config)
    refused = [request for log, requests in record.cursor.read_per_log()
               for request in record.absorb(requests, item.nodeid, rbac.dds_features_of(log))]
    if refused:
        pytest.fail(forbidden_message(refused), pytrace=False)
    return result


def forbidden_message(refused: list[audit.AuditedRequest]) -> str:
    lines = "\n".join(f"  {request.describe()}" for request in refused)
    return (f"the apiserver refused {len(refused)} request(s) of DDS's or cluster-autoscaler's ServiceAccount (403): "
            f"the RBAC in manifests/ does not grant what the code sent (since the previous test):\n{lines}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    record = _record(session.config)
    refused = [request for log, requests in record.cursor.read_per_log()
               for request in record.absorb(requests, "(session teardown)", rbac.dds_features_of(log))]
    if refused:
        session.config.stash[_late_key] = forbidden_message(refused)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not audit.registered():
        return  # no control plane ran: nothing to report
    write_report(session, record)


def write_report(session: pytest.Session, record: AuditRecord) -> None:
    """The record as JSON beside the session's tmp dir; its path is shown in the terminal summary. (Under pytest-xdist
    the controller writes it from the workers' parts: harness/xdist_plugin.py.)"""
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = Path(factory.getbasetemp()) if factory is not None else Path(str(session.config.rootpath))
    # Next to the session's tmp dir, not in it (a passed session's is removed at its end), named after it: other
    # runs may be going on at once.
    record.report_path = base.parent / f"dds-rbac-usage-{base.name}.json"
    record.report_path.write_text(json.dumps({
        "service_account": rbac.DDS.username,
        "used": [{"verb": g.verb, "apiGroup": g.api_group, "resource": g.resource, "subresource": g.subresource,
                  "first_test": test} for g, test in sorted(record.dds_used.items(), key=lambda kv: repr(kv[0]))],
        "used_with_features": {"+".join(features): sorted(g.describe() for g in used)
                               for features, used in sorted(record.dds_used_with.items())},
        "failed_tests": record.failed,
    }, indent=1))


_late_key = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    late = config.stash.get(_late_key, None)
    if late:
        terminalreporter.write_sep("!", "RBAC: refused after the last test")
        terminalreporter.write_line(late)
    record = config.stash.get(_record_key, None)
    if record is not None and record.report_path is not None:
        terminalreporter.write_line(f"dds: requests DDS's ServiceAccount made: {record.report_path}")


# --- fixtures ---

@pytest.fixture(scope="session")
def dds_kubeconfig(control_plane: Any) -> Path:
    return rbac.install(control_plane, rbac.DDS)


@pytest.fixture(scope="session")
def autoscaler_kubeconfig(control_plane: Any) -> Path:
    return rbac.install(control_plane, rbac.AUTOSCALER)


@pytest.fixture
def dds_api(dds_kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = rbac.api_client(dds_kubeconfig)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def expect_refusal(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    record = _record(request.config)
    return lambda resource, name: record.expected_refusals.add((resource, name))


@pytest.fixture(scope="session")
def rbac_audit(request: pytest.FixtureRequest) -> AuditRecord:
    return _record(request.config)
