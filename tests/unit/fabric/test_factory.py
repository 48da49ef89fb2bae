"""build_fabric picks the backend settings.fabric names."""

from __future__ import annotations

import pytest

from dds.config import FabricBackend, PoolSpec, RedfishSettings, Settings
from dds.fabric.factory import build_fabric
from dds.fabric.redfish import RedfishFabric
from dds.fabric.simulated import SimulatedFabric


@pytest.mark.parametrize("backend,kind", [
    pytest.param(FabricBackend.SIMULATED, SimulatedFabric, id="simulated"),
    pytest.param(FabricBackend.REDFISH, RedfishFabric, id="redfish"),
])
def test_the_configured_backend_is_built(backend: FabricBackend, kind: type) -> None:
    # No username: the Redfish backend talks to the service only when first used.
    pools = {} if backend == FabricBackend.SIMULATED else {"pools": [PoolSpec(name="rack-1", devices={"A30": 4})]}
    settings = Settings(fabric=backend, redfish=RedfishSettings(endpoint="http://127.0.0.1:9"), **pools)
    fabric = build_fabric(settings, clock=lambda: 0.0)
    assert isinstance(fabric, kind)
    fabric.close()


def test_the_composability_request_backend_needs_a_cluster() -> None:
    with pytest.raises(ValueError, match="composability-request needs a cluster"):
        build_fabric(Settings(fabric=FabricBackend.COMPOSABILITY_REQUEST), clock=lambda: 0.0)


@pytest.mark.parametrize("backend", [FabricBackend.REDFISH, FabricBackend.COMPOSABILITY_REQUEST])
def test_a_real_fabric_without_declared_pools_is_refused_not_given_the_simulations(backend: FabricBackend) -> None:
    from dds.fabric.factory import require_pools

    with pytest.raises(ValueError, match=f"fabric {backend.value}: declare the GPU pools the fabric holds in the "
                                         "`pools` setting"):
        require_pools(Settings(fabric=backend))
    declared = [PoolSpec(name="rack-1", devices={"A100": 16})]
    assert require_pools(Settings(fabric=backend, pools=declared)) == declared
    # Earlier releases' place for them still counts when given explicitly.
    legacy = Settings.model_validate({"fabric": backend.value,
                                      "simulated_fabric": {"pools": [{"name": "old", "devices": {"A30": 2}}]}})
    assert [p.name for p in require_pools(legacy)] == ["old"]


def test_pools_are_refused_for_the_simulated_fabric() -> None:
    with pytest.raises(ValueError, match="the simulated fabric's pools are simulated_fabric.pools"):
        Settings(fabric=FabricBackend.SIMULATED, pools=[PoolSpec(name="p", devices={"A30": 1})])
