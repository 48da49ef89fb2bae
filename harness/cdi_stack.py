"""The stack (harness/stack.py) with the real CDI operator doing DDS's attaches: `cdi_options(StackOptions(...))`.

What it adds to the default stack, and why:

- the control plane with the DRA gates the operator needs (its detaches go through DeviceTaintRules, an alpha API:
  harness/cdi_operator.py DRA_FEATURE_GATES / DRA_RUNTIME_CONFIG) and kube-controller-manager (claims made from
  ResourceClaimTemplates, released when their pods end);
- the fabric's side, started before the MachineSet and DDS (`CdiFabricSide`): the fabric-manager emulator holding
  `pool_size` A30s with the stack's attach and detach latencies (harness/fabric_manager.py), the GPU node agent in DRA
  mode (harness/gpu_node_agent.py: each node's nvidia-driver pod, NVIDIA's DRA kubelet plugin and its
  `gpu.nvidia.com` ResourceSlice), NVIDIA's DeviceClass `gpu.nvidia.com` as its chart installs it, and CoHDI's
  composable-resource-operator itself in DRA mode, under its shipped RBAC with its webhook (harness/cdi_operator.py);
  every node the Cluster API part makes is registered with the agent (its machine in the emulator) as it appears;
- nodes named as the operator finds them in DRA mode: Machines and their Nodes get providerID `fsas-cdi://<uuid>`
  (a uuid derived from the machine's name), so CA's node -> group mapping (by providerID, through DDS) and the
  operator's node -> fabric machine mapping read the same id;
- DDS with `fabric: composability-request` (`simulated_fabric.pools` says what the fabric manager holds: the operator
  has no pool API) and the MachineSet annotated for the vendor's driver: dra-node-local, `gpu.nvidia.com`, whole GPUs
  `type=gpu`, the A30's shape (`NVIDIA A30`, 24Gi) for before any A30 is published (docs/dra.md).

`cdi_options(options, device_mode=DeviceMode.DEVICE_PLUGIN)`: the operator in DEVICE_PLUGIN mode instead, through the
cluster-manager emulator (harness/cluster_manager.py: the one FTI API that attaches in that mode at the pinned commit),
the node agent publishing each node's GPUs as `nvidia.com/gpu` capacity, the MachineSet an extended-resource group; no
DRA gates, DeviceClass or kube-controller-manager (CdiDevicePluginFabricSide). `node_timings=`: the node side as slow
as a real server (harness/gpu_node_agent.py NodeTimings: the driver pod late, device-plugin restarts that take the
nodes' allocatable down).

Only one operator runs on a machine at a time (its webhook port 9443 is fixed): a stack started while another runs
fails with the port's holder named (CdiOperatorError).
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from dds.model.groups import (ANN_DRA_DEVICE_ATTRIBUTES, ANN_DRA_DRIVER, ANN_DRA_MODELS, ANN_GPU_API, ANN_GPU_MODELS,
                              GpuApi)
from dds.kube.composability import NODE_FINALIZER
from harness.cdi_operator import (DRA_FEATURE_GATES, DRA_RUNTIME_CONFIG, CdiOperator, DeviceResourceType,
                                  FabricManagerAccess, OperatorRelease)
from harness.cluster_manager import ClusterManagerEmulator
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import (NVIDIA_DRA_DRIVER, PROVIDER_ID_PREFIX, DeviceMode, GpuNodeAgent, NodeTimings,
                                    gpu_spec)
from harness.kwok_provider import ProviderIds
from harness.stack import Stack, StackOptions, merge

log = logging.getLogger(__name__)

MODEL = "A30"  # the demo MachineSet's model (dds.cdi.dev/gpu-models)
PRODUCT_NAME = gpu_spec(MODEL).product_name  # what NVIDIA's driver publishes as the device's productName
# NVIDIA's DeviceClass as its chart installs it (k8s-dra-driver-gpu, templates/deviceclass-gpu.yaml; docs/dra.md).
NVIDIA_DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NVIDIA_DRA_DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}' && "
                                                  f"device.attributes['{NVIDIA_DRA_DRIVER}'].type == 'gpu'"}}]}}
_MACHINE_NAMESPACE = uuid.UUID("6f1c2a4e-9b8d-4e3f-a1c7-0d5e8b2f4a61")  # fixed: the same name gives the same uuid
_NODE_POLL_S = 0.5


def machine_uuid(machine_name: str) -> str:
    """The fabric machine id of a Machine: derived from its name, which the Cluster API part already makes
    deterministic, so a repeated pass after a crash gives the same providerID."""
    return str(uuid.uuid5(_MACHINE_NAMESPACE, machine_name))


FSAS_CDI_PROVIDER_IDS = ProviderIds(prefix=PROVIDER_ID_PREFIX, machine_id=machine_uuid)


def vendor_driver_annotations(memory: str = "24Gi") -> dict[str, str]:
    """The MachineSet's GPUs under NVIDIA's DRA driver (docs/dra.md, "The group's annotations")."""
    return {ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value, ANN_DRA_DRIVER: NVIDIA_DRA_DRIVER,
            ANN_DRA_DEVICE_ATTRIBUTES: "type=gpu", ANN_DRA_MODELS: f"{MODEL}={PRODUCT_NAME}:{memory}",
            ANN_GPU_MODELS: MODEL}


def cdi_options(options: StackOptions, device_mode: DeviceMode = DeviceMode.DRA,
                node_timings: NodeTimings = NodeTimings()) -> StackOptions:
    """`options` with the real CDI operator: what `options` sets itself wins over these defaults. `device_mode`
    DEVICE_PLUGIN: the operator in that mode through the cluster manager's API (CdiDevicePluginFabricSide), the
    MachineSet's GPUs the extended resource nvidia.com/gpu the node's device plugin publishes. `node_timings`: how
    slow the nodes' GPU side is (harness/gpu_node_agent.py; the default is instant)."""
    if DeviceMode(device_mode) is DeviceMode.DEVICE_PLUGIN:
        return replace(options, provider_ids=FSAS_CDI_PROVIDER_IDS,
                       fabric_side=functools.partial(CdiDevicePluginFabricSide, node_timings=node_timings),
                       machineset_annotations={ANN_GPU_MODELS: MODEL, **options.machineset_annotations},
                       dds_settings=merge({"fabric": "composability-request"}, options.dds_settings))
    runtime_config = tuple(dict.fromkeys((*DRA_RUNTIME_CONFIG, *options.runtime_config)))
    return replace(
        options, feature_gates={**DRA_FEATURE_GATES, **options.feature_gates}, runtime_config=runtime_config,
        controller_manager=True, provider_ids=FSAS_CDI_PROVIDER_IDS,
        fabric_side=functools.partial(CdiFabricSide, node_timings=node_timings),
        machineset_annotations={**vendor_driver_annotations(), **options.machineset_annotations},
        dds_settings=merge({"fabric": "composability-request"}, options.dds_settings))


def operator_version(bin_dir: Optional[Path] = None) -> str:
    """`composable-resource-operator <commit>` of the binary the stack runs (the build folder is named by the
    commit, hack/build-binaries.sh), and where it is."""
    from harness.controlplane import ensure_binaries

    release = OperatorRelease.locate(bin_dir or ensure_binaries())
    commit = release.binary.parent.name.rpartition("-")[2]
    return f"CoHDI composable-resource-operator {commit} ({release.binary})"


class CdiFabricSide:
    """The emulator, the node agent, NVIDIA's DeviceClass and the operator for one stack; a context manager (the
    stack enters it once its control plane runs, before the MachineSet and DDS). DRA mode through the fabric
    manager's API; CdiDevicePluginFabricSide is the DEVICE_PLUGIN mode."""

    device_mode = DeviceMode.DRA

    def __init__(self, stack: Stack, node_timings: NodeTimings = NodeTimings()) -> None:
        self.stack = stack
        self.node_timings = node_timings
        options = stack.options
        # DRA: the fabric manager's API. DEVICE_PLUGIN: the cluster manager's, the one the operator attaches through
        # in that mode at its pinned commit (docs/composability.md, "Device modes"); the same hardware model.
        emulator_class = ClusterManagerEmulator if self.device_mode is DeviceMode.DEVICE_PLUGIN \
            else FabricManagerEmulator
        self.emulator = emulator_class({MODEL: options.pool_size}, attach_latency_s=options.attach_latency,
                                       detach_latency_s=options.detach_latency,
                                       state_dir=stack.workdir / "fabric-manager")
        self.agent: Optional[GpuNodeAgent] = None
        self.operator: Optional[CdiOperator] = None
        self._api = stack.control_plane.api_client()
        self._registered: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._register_nodes, name="cdi-node-registrar", daemon=True)

    def __enter__(self) -> "CdiFabricSide":
        try:
            self.emulator.start()
            if self.device_mode is DeviceMode.DRA:
                client.ResourceV1Api(self._api).create_device_class(NVIDIA_DEVICE_CLASS)
            self.agent = GpuNodeAgent(self._api, self.emulator, mode=self.device_mode,
                                      state_dir=self.stack.workdir / "gpu-nodes", timings=self.node_timings).start()
            self._thread.start()
            self.operator = CdiOperator(self.stack.control_plane, FabricManagerAccess.of(self.emulator),
                                        device_resource_type=DeviceResourceType(self.device_mode.value)).start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The operator first (it must not call a fabric that is gone), then the agent and the emulator."""
        if self.operator is not None:
            self.operator.stop()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.agent is not None:
            self.agent.stop()
        self.emulator.stop()

    def machine_of(self, node_name: str) -> str:
        """The fabric machine uuid of a node the agent plays."""
        assert self.agent is not None
        return self.agent.machine_uuid(node_name)

    def devices_on(self, node_name: str) -> list[str]:
        """Serials of the devices the fabric has attached to a node's machine."""
        return self.emulator.attachments().get(machine_uuid(node_name), [])

    def operator_log(self) -> str:
        return self.operator.log_tail() if self.operator is not None else "(no operator)"

    def _register_nodes(self) -> None:
        """Each node whose providerID names a fabric machine gets its node side, as it registers (a real server's
        GPU operator DaemonSets start on it)."""
        core = client.CoreV1Api(self._api)
        while not self._stop.wait(_NODE_POLL_S):
            try:
                nodes = core.list_node().items
            except Exception as exc:  # the apiserver may be going away while the stack closes
                log.debug("cdi node registrar: cannot list nodes: %s", exc)
                continue
            for node in nodes:
                name = node.metadata.name
                if name in self._registered or not (node.spec.provider_id or "").startswith(PROVIDER_ID_PREFIX):
                    continue
                try:
                    assert self.agent is not None
                    self.agent.add_node(name)
                except ApiException as exc:
                    log.warning("cdi node registrar: node %s not registered yet (%s %s); retrying", name,
                                exc.status, exc.reason)
                    continue
                self._registered.add(name)
                log.info("cdi node registrar: node %s is fabric machine %s", name, self.agent.machine_uuid(name))


class CdiDevicePluginFabricSide(CdiFabricSide):
    """The operator in DEVICE_PLUGIN mode through the cluster-manager emulator; each node's GPUs are its
    `nvidia.com/gpu` capacity (the device plugin's part, played by the node agent)."""

    device_mode = DeviceMode.DEVICE_PLUGIN


def fabric_side(stack: Stack) -> CdiFabricSide:
    """The stack's CdiFabricSide (a stack started with `cdi_options`)."""
    side: Any = getattr(stack, "fabric_side", None)
    if not isinstance(side, CdiFabricSide):
        raise TypeError("this stack runs no CDI operator: start it with harness.cdi_stack.cdi_options(...)")
    return side


class ReclaimWatch(Protocol):
    """What `delete_node_holding_devices` needs of an e2e run: its CoreV1Api, the Events it sees, and its wait."""

    core: client.CoreV1Api

    def events(self, reason: str, involved: str = "") -> list[Any]: ...

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float) -> Any: ...


def delete_node_holding_devices(run: ReclaimWatch, node: str, *, event_timeout: float, gone_timeout: float) -> None:
    """Delete `node`, which holds devices DDS attached, and wait for what a user sees: DDS's DetachingGPU Event saying
    it returns them to the pool before the node goes (its finalizer keeps the Node meanwhile), then the Node gone.
    What happened in the fabric is the caller's to check: each emulator counts its own calls."""
    assert NODE_FINALIZER in (run.core.read_node(node).metadata.finalizers or []), f"{node} carries no DDS finalizer"
    uid = run.core.read_node(node).metadata.uid
    run.core.delete_node(node)
    said = run.wait_for(f"DDS's DetachingGPU Event for the deleted {node}",
                        lambda: [e for e in run.events("DetachingGPU", node) if "being deleted" in e.message],
                        event_timeout)
    assert "returning them to the pool before it goes" in said[0].message, said[0].message

    def gone() -> bool:
        try:
            return run.core.read_node(node).metadata.uid != uid
        except ApiException as exc:
            return exc.status == 404

    run.wait_for(f"{node} deleted once its devices are detached", gone, gone_timeout)
