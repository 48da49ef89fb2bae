"""Integration tests run against the real control plane: the session-scoped `control_plane` fixture (etcd,
kube-apiserver, kube-scheduler and kwok as local processes, with the Cluster API and ComposabilityRequest CRDs) and the
per-test `namespace` come from harness/pytest_plugin.py, registered in tests/conftest.py so tests/e2e shares them."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.controller.harness import ControllerHarness


@pytest.fixture
def dds(control_plane: Any, namespace: str, request: pytest.FixtureRequest, dds_api: Any
        ) -> Iterator[ControllerHarness]:
    """DDS's controller, planner-backed deciders and simulated fabric in this process, on the test's namespace, with a
    clock the test advances (tests/integration/controller/harness.py). DDS runs as its ServiceAccount (`dds_api`). `@pytest.mark.pool_size(N)` on a test or
    module sizes the fabric's pool (default 4)."""
    marker = request.node.get_closest_marker("pool_size")
    harness = ControllerHarness(control_plane, namespace, *(marker.args if marker else ()),
                                dds_api=dds_api)
    try:
        yield harness
    finally:
        harness.close()
