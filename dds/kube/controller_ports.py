"""The apiserver side of the controller's narrow ports, so the raw ApiClient stays in dds.kube (dds/app.py builds these
and hands them in):

| port (where it is declared)                              | implementation here     | what it does on the apiserver      |
|----------------------------------------------------------|-------------------------|------------------------------------|
| `ClusterReader` (dds/controller/observe.py)              | `KubeClusterReader`     | LISTs of Nodes, Pods, Machines and MachineSets; the DRA objects (the watch cache's when synced) |
| `PoolBindingWriter` (dds/controller/dra_binding.py)      | `KubePoolBindingWriter` | pool-mode ResourceSlices; ResourceClaim annotations and binding conditions |

The GPU label keeper's `NodeLabelSetter` is dds.kube.nodes.KubeNodeWriter, which the applier's `NodeWriter` is too.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from kubernetes import client

from dds.kube import capi
from dds.kube.cache import ClusterCache
from dds.kube.decode import NodeRecord, PodRecord
from dds.kube.dra import ClaimBindingWriter, DraReader
from dds.kube.errors import ApiError
from dds.kube.listing import list_node_records, list_pod_records
from dds.kube.resourceslices import publish_pool_slots
from dds.model.dra_records import DraDevice, DraState


class KubeClusterReader:
    """What the observer reads from the apiserver itself: a LIST of each kind, decoded per call. Machines and
    MachineSets are those of `machineset_namespaces` (empty: every namespace); without Cluster API there are none.
    The DRA objects come from `cache` while its DRA stores are synced (dds.kube.dra.DraReader), else from LISTs."""

    def __init__(self, api: client.ApiClient, machineset_namespaces: Sequence[str] = (),
                 cache: Optional[ClusterCache] = None) -> None:
        self._api = api
        self._namespaces = tuple(machineset_namespaces)
        self._capi = capi.CapiObjects(api)
        self._dra = DraReader(api, cache)

    def machines(self) -> Sequence[Mapping[str, Any]]:
        try:
            return self._capi.list(capi.MACHINES, self._namespaces)
        except capi.CapiNotInstalled:
            return ()  # no Cluster API: no node belongs to a MachineSet group
        except ApiError as exc:
            if exc.not_found:  # the version in use stopped being served (Cluster API upgraded)
                self._capi.forget_version()
            raise

    def machinesets(self) -> Sequence[Mapping[str, Any]]:
        """MachineSets, then MachineDeployments (where served), each with its kind."""
        try:
            sets = self._capi.list(capi.MACHINESETS, self._namespaces)
        except capi.CapiNotInstalled:
            return ()
        try:
            deployments = self._capi.list(capi.MACHINEDEPLOYMENTS, self._namespaces)
        except ApiError as exc:
            if exc.status != 404:
                raise
            deployments = []  # only MachineSets are served here
        return [*sets, *(dict(d, kind="MachineDeployment") for d in deployments)]

    def pod_records(self) -> Sequence[PodRecord]:
        return list_pod_records(self._api)

    def node_records(self) -> Sequence[NodeRecord]:
        return list_node_records(self._api)

    def dra(self) -> DraState:
        return self._dra.read()


class KubePoolBindingWriter(ClaimBindingWriter):
    """Pool mode's writes: each fabric pool's ResourceSlice, and on each ResourceClaim the fabric devices attached for
    it and the binding condition kube-scheduler waits for (dds.kube.dra.ClaimBindingWriter)."""

    def publish_pool_slots(self, fabric_pool: str, slots: Sequence[DraDevice], group_labels: Sequence[str]) -> None:
        publish_pool_slots(self._client, fabric_pool, slots, group_labels)
