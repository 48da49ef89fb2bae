"""Fixtures every test folder can use: `control_plane` and `namespace` (the real control plane, see
harness/pytest_plugin.py). Unit tests never request them, and then nothing is built or started.

Also the campaigns' figures at the end of the run (tests/unit/reliability/figures.py: the requests fuzzed, the SIGKILL
campaign, the outages, the fabric faults, two DDS replicas), printed here, in the one conftest every run loads: under
pytest-xdist (`make test`) the figures are counted in the workers and sent to the controller, which prints them."""

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

# The test process talks gRPC (to DDS) and forks processes (etcd, the apiserver, DDS, cluster-autoscaler). grpcio's fork
# handlers run in the child between fork and exec and can abort it ("epoll_wait error: Bad file descriptor", SIGABRT);
# the children exec at once and need none of them. Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests.unit.reliability import figures  # noqa: E402  (imports grpc: after the setting above)

# harness.rbac_plugin: DDS and cluster-autoscaler under the shipped RBAC; a 403 to either fails the test.
# harness.xdist_plugin: the suite in parallel workers (`make test`), when pytest-xdist is installed.
pytest_plugins = ["harness.pytest_plugin", "harness.rbac_plugin"] + (
    ["harness.xdist_plugin"] if importlib.util.find_spec("xdist") else [])


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set in a pytest-xdist worker only
    if output is not None:
        output["dds_figures"] = figures.export()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    figures.absorb(getattr(node, "workeroutput", {}).get("dds_figures"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = figures.summary_lines()
    if lines:
        terminalreporter.write_sep("-", "reliability: requests fuzzed")
        for line in lines:
            terminalreporter.write_line(line)
        # DDS_RELIABILITY_FIGURES: the JSON file the figures are merged into, when set.
        target = os.environ.get("DDS_RELIABILITY_FIGURES")
        if target:
            figures.write_figures(Path(target))
            terminalreporter.write_line(f"figures written to {target}")
    for name, summary in figures.SUMMARIES.items():
        terminalreporter.write_sep("-", f"reliability: {name}")
        for line in summary:
            terminalreporter.write_line(line)
