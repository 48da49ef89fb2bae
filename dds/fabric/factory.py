"""Build the fabric backend that settings.fabric names.

| settings.fabric          | backend                        | needs api_client | state                                         |
|--------------------------|--------------------------------|------------------|-----------------------------------------------|
| simulated (kwok only)    | SimulatedFabric                | no (optional)    | ConfigMap settings.simulated_fabric.state_configmap in settings.namespace with a client, else in memory |
| composability-request    | ComposabilityRequestFabric     | yes              | the ComposabilityRequests themselves          |
| redfish                  | RedfishFabric                  | no (optional)    | operation log in ConfigMap `<state_configmap>-redfish` with a client, else in memory |

Without an API client the in-memory state does not survive a restart: fine for `dds serve` on a YAML file and the trace
simulator, not for a cluster (the lead passes a client there).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from dds.config import FabricBackend, PoolSpec, Settings
from dds.fabric.base import Fabric
from dds.fabric.composability import ComposabilityRequestFabric
from dds.fabric.redfish import RedfishFabric
from dds.fabric.simulated import SimulatedFabric, VisibilityHook
from dds.fabric.state import FabricStateStore, InMemoryFabricStateStore
from dds.fabric.state_configmap import ConfigMapFabricStateStore
from dds.kube import ApiClient
from dds.kube.composability import ObjectCache
from dds.kube.configmap import REDFISH_LOG_SUFFIX
from dds.kube.nodes import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, non_kwok_nodes
from dds.model.events import EventRecorder
from dds.model.groups import LABEL_NODE_GROUP

log = logging.getLogger(__name__)



# The setting that lets the simulated fabric write GPUs into Nodes kwok does not manage; named in every refusal.
ALLOW_NON_KWOK_NODES = "simulated_fabric.allow_non_kwok_nodes"
ALLOW_NON_KWOK_NODES_ADVICE = (f"the simulated fabric fakes GPUs for kwok test clusters; choose a real fabric "
                               f"(composability-request or redfish), or set {ALLOW_NON_KWOK_NODES}: true if faking GPUs "
                               "on these nodes is really meant")


def require_fabric_choice(settings: Settings) -> FabricBackend:
    """The fabric the settings name; there is no default, so settings written for a real cluster never simulate GPUs
    by omission."""
    if settings.fabric is None:
        choices = ", ".join(b.value for b in FabricBackend)
        raise ValueError(f"fabric is not set: choose one of {choices} (simulated only for kwok test clusters)")
    return settings.fabric


def require_pools(settings: Settings) -> list[PoolSpec]:
    """A real fabric's pools, which must be declared: DDS attaches only what they say the fabric holds, and the
    simulated fabric's default (8 A30 in pool `default`) is no description of real hardware."""
    if not settings.pools_declared:
        raise ValueError(f"fabric {settings.fabric.value if settings.fabric else '?'}: declare the GPU pools the "
                         "fabric holds in the `pools` setting, e.g. pools: [{name: pool-a, devices: {A100: 16}}] "
                         "(docs/install.md \"Declare the pools\")")
    return settings.fabric_pools


def refuse_simulation_on_real_nodes(settings: Settings, api_client: ApiClient) -> None:
    """With the simulated fabric, refuse a cluster whose DDS-managed Nodes (the node-group label) are not all kwok
    nodes, unless `simulated_fabric.allow_non_kwok_nodes`. Nodes that join later are refused one by one by the capacity
    hook (`gpu_capacity_hook(kwok_only=...)`)."""
    if settings.fabric != FabricBackend.SIMULATED or settings.simulated_fabric.allow_non_kwok_nodes:
        return
    real = non_kwok_nodes(api_client, LABEL_NODE_GROUP)
    if real:
        shown = ", ".join(real[:5]) + (f" and {len(real) - 5} more" if len(real) > 5 else "")
        raise ValueError(f"fabric simulated: node(s) {shown} of DDS node groups are not kwok nodes (no annotation "
                         f"{KWOK_NODE_ANNOTATION}: {KWOK_NODE_VALUE}); {ALLOW_NON_KWOK_NODES_ADVICE}")


def build_fabric(settings: Settings, *, clock: Callable[[], float], api_client: Optional[ApiClient] = None,
                 on_node_devices_changed: Optional[VisibilityHook] = None,
                 cache: Optional[ObjectCache] = None, events: Optional[EventRecorder] = None) -> Fabric:
    """`cache`: the fabric's own custom objects as the watch cache holds them (composability-request only); `events`:
    where that backend reports what the operator does beside DDS's operations."""
    backend = require_fabric_choice(settings)
    if backend == FabricBackend.SIMULATED:
        store = _store(settings, api_client, settings.simulated_fabric.state_configmap)
        return SimulatedFabric(settings.simulated_fabric, clock=clock, store=store,
                               on_node_devices_changed=on_node_devices_changed)
    if backend == FabricBackend.COMPOSABILITY_REQUEST:
        if api_client is None:
            raise ValueError("fabric composability-request needs a cluster: pass --kubeconfig or --in-cluster")
        if on_node_devices_changed is not None:
            log.info("fabric composability-request: the CDI operator makes devices visible on nodes itself")
        return ComposabilityRequestFabric(api_client, settings.composability, require_pools(settings),
                                          clock=clock, cache=cache, events=events)
    if backend == FabricBackend.REDFISH:
        store = _store(settings, api_client, settings.simulated_fabric.state_configmap + REDFISH_LOG_SUFFIX)
        return RedfishFabric(settings.redfish, clock=clock, store=store, pools=require_pools(settings))
    raise ValueError(f"fabric: unknown backend {backend!r}")


def _store(settings: Settings, api_client: Optional[ApiClient], name: str) -> FabricStateStore:
    if api_client is None:
        log.warning("fabric %s: no cluster, so its state is kept in memory and lost on restart", settings.fabric.value)
        return InMemoryFabricStateStore()
    return ConfigMapFabricStateStore(api_client, settings.namespace, name)
