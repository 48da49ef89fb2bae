"""build_fabric picks the backend settings.fabric names."""

from __future__ import annotations

import pytest

from dds.config import FabricBackend, RedfishSettings, Settings
from dds.fabric.factory import build_fabric
from dds.fabric.redfish import RedfishFabric
from dds.fabric.simulated import SimulatedFabric


@pytest.mark.parametrize("backend,kind", [
    pytest.param(FabricBackend.SIMULATED, SimulatedFabric, id="simulated"),
    pytest.param(FabricBackend.REDFISH, RedfishFabric, id="redfish"),
])
def test_the_configured_backend_is_built(backend: FabricBackend, kind: type) -> None:
    # No username: the Redfish backend talks to the service only when first used.
    settings = Settings(fabric=backend, redfish=RedfishSettings(endpoint="http://127.0.0.1:9"))
    fabric = build_fabric(settings, clock=lambda: 0.0)
    assert isinstance(fabric, kind)
    fabric.close()


def test_the_composability_request_backend_needs_a_cluster() -> None:
    with pytest.raises(ValueError, match="composability-request needs a cluster"):
        build_fabric(Settings(fabric=FabricBackend.COMPOSABILITY_REQUEST), clock=lambda: 0.0)
