"""`FabricStateStore` on a ConfigMap (dds/kube/configmap.py): the simulated CDI manager keeps its devices and
operations there (settings.simulated_fabric.state_configmap in settings.namespace), the Redfish client its operation
log, so their state survives a DDS kill -9 the way a real external manager's would. A corrupt document is an error
here (never silently reset: that would forget attached devices)."""

from __future__ import annotations

from dds.kube import ApiClient
from dds.kube.configmap import ConfigMapDocument


class ConfigMapFabricStateStore(ConfigMapDocument):
    def __init__(self, api: ApiClient, namespace: str, name: str, component: str = "dds-fabric") -> None:
        super().__init__(api, namespace, name, component)
