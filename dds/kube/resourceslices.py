"""DRA publishing. Node-local mode (hot-plug): one ResourceSlice per node lists the GPUs attached to it, as a DRA driver
with hot-plug does; DDS plays that driver for the simulated fabric (tests, the demo), for the nodes of groups annotated
dds.cdi.dev/gpu-api: dra-node-local, while with a real fabric the vendor's DRA driver on the node publishes the slice
(docs/dra.md). Pool mode: one slice per fabric pool lists its slots on the nodes of its dra-pool groups
(`publish_pool_slots`, driven by dds/controller/dra_binding.py).

    slice  <node>.gpu.dds.cdi.dev   spec.driver = gpu.dds.cdi.dev, spec.nodeName = <node>,
                                    spec.pool = {name: <node>, generation: +1 per change, resourceSliceCount: 1}
                                    spec.devices = one per ONLINE GPU (dds/model/dra_devices.py `gpu_device`: model,
                                    productName, deviceID attributes; memory capacity)

A node with no GPU left has no slice. Writes carry the slice's resourceVersion, so a concurrent change fails and the
fabric's next tick publishes again (errors propagate to it, as the GPU capacity publisher's do).

A GPU about to be detached is tainted first (`taint_for_detach`, called before the detach reaches the fabric): its
device gets the taint dds.cdi.dev/detaching, effect NoSchedule (KEP-5055, beta and on in Kubernetes 1.36), so
kube-scheduler allocates it to no new claim in the moment between DDS's decision and the fabric taking the device off
the node's online GPUs, after which it leaves the slice. Kubernetes 1.35 (DRADeviceTaints alpha, off) drops the field.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Collection, Iterable, Mapping, Optional, Sequence

from kubernetes import client

from dds.model.cxl import is_cxl_model
from dds.model.groups import LABEL_NODE_GROUP
from dds.model.dra_devices import DRIVER, dra_pool_name, gpu_device
from dds.model.dra_records import DeviceTaintInfo, DraDevice

log = logging.getLogger(__name__)

OnlineDevices = Callable[[str], Iterable[tuple[str, str]]]  # node -> (fabric device id, model) of its online GPUs
# On a device DDS is about to detach: kube-scheduler allocates a tainted device only to a request tolerating the taint.
DETACHING_TAINT = DeviceTaintInfo(key="dds.cdi.dev/detaching", effect="NoSchedule")


def slice_name(node: str, driver: str = DRIVER) -> str:
    return f"{node}.{driver}"


def device_object(device: DraDevice) -> dict[str, Any]:
    """A device as resource.k8s.io/v1 spells it; names are qualified by the driver's domain, which the API omits."""
    prefix = f"{device.driver}/"

    def short(name: str) -> str:
        return name[len(prefix):] if name.startswith(prefix) else name

    attributes = {short(k): {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "string": v}
                  for k, v in sorted(device.attributes.items())}
    out: dict[str, Any] = {"name": device.name, "attributes": attributes}
    if device.capacity:
        out["capacity"] = {short(k): {"value": _quantity(v)} for k, v in sorted(device.capacity.items())}
    if device.taints:
        out["taints"] = [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
                         for t in device.taints]
    if device.binds_to_node:
        out["bindsToNode"] = True
        out["bindingConditions"] = list(device.binding_conditions)
        out["bindingFailureConditions"] = list(device.binding_failure_conditions)
    return out


def _quantity(value: int) -> str:
    # The apiserver keeps a quantity as written: "24Gi", not 25769803776, so a re-read compares equal.
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def slice_devices(node: str, online: Iterable[tuple[str, str]], driver: str = DRIVER,
                  leaving: Collection[str] = ()) -> list[dict[str, Any]]:
    """The node's online GPUs as devices; those in `leaving` (fabric ids about to be detached) tainted."""
    devices = [gpu_device(model, fabric_id, node, driver) for fabric_id, model in sorted(online)]
    return [device_object(replace(d, taints=(DETACHING_TAINT,)) if d.attributes.get(f"{driver}/deviceID") in leaving
                          else d) for d in devices]


class ResourceSlicePublisher:
    """Keeps `<node>.<driver>` listing the node's online GPUs; `publish(node)` after every change of them.

    `lists(node)` says whether DDS lists the node's GPUs as DRA devices (its group's `publishes_own_slices`:
    dra-node-local under DDS's own driver; a vendor's driver publishes its nodes' slices itself); any other node
    has no slice, so a GPU is never offered both as a device and as the node's extended resource. Other nodes cost no
    request, unless this process listed their devices before (their group changed API: the slice goes)."""

    def __init__(self, api: client.ApiClient, online: OnlineDevices, driver: str = DRIVER,
                 request_timeout_seconds: float = 10.0, lists: Callable[[str], bool] = lambda node: True) -> None:
        self._client = api
        self._online = online
        self._driver = driver
        self._timeout = request_timeout_seconds
        self._lists = lists
        self._listed: set[str] = set()  # nodes this process wrote a slice for
        self._leaving: dict[str, set[str]] = {}  # node -> fabric ids tainted before their detach, while still online

    def taint_for_detach(self, node: str, device_ids: Iterable[str]) -> None:
        """Taint the devices of GPUs about to be detached (before the detach reaches the fabric). A failed write is
        logged, not raised: the detach goes on, and the device leaves the slice once the fabric takes it."""
        if node not in self._listed:
            return  # DDS lists no device of the node: nothing the scheduler could allocate through DDS's slice
        self._leaving.setdefault(node, set()).update(device_ids)
        try:
            self.publish(node)
            log.info("ResourceSlice %s: %s tainted %s before the detach", slice_name(node, self._driver),
                     ", ".join(device_ids), DETACHING_TAINT.key)
        except client.ApiException as exc:
            log.warning("could not taint %s on ResourceSlice %s before their detach: %s", ", ".join(device_ids),
                        slice_name(node, self._driver), exc.reason)

    def publish(self, node: str) -> None:
        listed = self._lists(node)
        if not listed and node not in self._listed:
            return
        online = list(self._online(node)) if listed else []
        # A device stays tainted while it is still online; once the fabric took it, it is off the slice anyway.
        leaving = self._leaving.get(node, set()) & {fabric_id for fabric_id, _ in online}
        if leaving:
            self._leaving[node] = leaving
        else:
            self._leaving.pop(node, None)
        devices = slice_devices(node, online, self._driver, leaving) if listed else []
        write_slice(self._client, slice_name(node, self._driver), self._driver, node, {"nodeName": node}, devices,
                    self._timeout)
        if listed:
            self._listed.add(node)
        else:
            self._listed.discard(node)


def write_slice(api: client.ApiClient, name: str, driver: str, pool: str, placement: Mapping[str, Any],
                devices: Sequence[Mapping[str, Any]], timeout: float = 10.0) -> None:
    """Make the one-slice pool `pool` list `devices` (none: no slice), placed by `placement` (nodeName, nodeSelector
    or allNodes). A change bumps the pool's generation; an unchanged slice is not written."""
    resource = client.ResourceV1Api(api)
    current = _read(resource, name, timeout)
    if not devices:
        if current is not None:
            resource.delete_resource_slice(name, _request_timeout=timeout)
            log.info("ResourceSlice %s deleted: no device to list", name)
        return
    spec = {"driver": driver, **placement, "devices": list(devices)}
    if current is None:
        resource.create_resource_slice(_body(name, spec, pool, generation=1), _request_timeout=timeout)
        log.info("ResourceSlice %s created with %d device(s)", name, len(devices))
        return
    listed = api.sanitize_for_serialization(current.spec)
    if all(listed.get(k) == v for k, v in spec.items()):
        return
    body = _body(name, spec, pool, generation=int(current.spec.pool.generation or 0) + 1)
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    resource.replace_resource_slice(name, body, _request_timeout=timeout)
    log.info("ResourceSlice %s now lists %d device(s)", name, len(devices))


def _read(resource: client.ResourceV1Api, name: str, timeout: float) -> Optional[Any]:
    try:
        return resource.read_resource_slice(name, _request_timeout=timeout)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _body(name: str, spec: Mapping[str, Any], pool: str, generation: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "dds"}},
            "spec": {**spec, "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}}}


def pool_slice_name(fabric_pool: str, driver: str = DRIVER) -> str:
    return f"pool-{fabric_pool}.{driver}"


def publish_pool_slots(api: client.ApiClient, fabric_pool: str, slots: Sequence[DraDevice],
                       group_labels: Sequence[str], driver: str = DRIVER) -> None:
    """Pool mode: the pool's slots, on the nodes of the pool-mode groups drawing from it (their node-group label
    values, `group_labels`), bound to one on allocation. No slot, or no such group: no slice."""
    placement = {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": LABEL_NODE_GROUP, "operator": "In", "values": sorted(group_labels)}]}]}}
    if not group_labels:
        slots = ()  # a node selector must select something: with no pool-mode group the pool offers no slot
    write_slice(api, pool_slice_name(fabric_pool, driver), driver, dra_pool_name(fabric_pool), placement,
                [device_object(d) for d in slots])


def with_resource_slices(hook: Callable[[str, Mapping[str, int]], None], publisher: ResourceSlicePublisher
                         ) -> Callable[[str, Mapping[str, int]], None]:
    """An `on_node_devices_changed` hook that also publishes the node's ResourceSlice (after the GPU capacity, so a
    failure of either is retried by the fabric's next tick)."""

    def publish(node: str, online: Mapping[str, int]) -> None:
        hook(node, online)
        publisher.publish(node)

    return publish


def online_gpus(fabric: Any, node: str) -> list[tuple[str, str]]:
    """(id, model) of the ONLINE GPUs a fabric shows on `node` (any backend: `devices(node)` of dds/fabric/base.py);
    CXL memory chunks are memory, never GPU devices."""
    return [(d.id, d.model) for d in fabric.devices(node)
            if str(getattr(d.state, "value", d.state)) == "online" and not is_cxl_model(d.model)]
