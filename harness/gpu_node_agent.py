"""The node side of a GPU the fabric attached, for the test cluster's kwok nodes (a hardware stand-in, not in a wheel).

In a real cluster, once the fabric manager has attached a GPU to a server, the server's GPU driver sees it and the
NVIDIA GPU operator's DaemonSets (device plugin, or the vendor DRA driver's kubelet plugin) publish it; Metal3 ties the
Node to its server. Nothing of that runs here, so this agent plays it, driven by harness/fabric_manager.py:

- `add_node(name)` registers the node's machine in the emulator (its uuid is the node's providerID
  `fsas-cdi://<uuid>` when it has one) and creates the Metal3 chain the CDI operator follows when FTI_CDI_CLUSTER_ID is
  set: node annotation `machine.openshift.io/machine: <ns>/<name>` -> a Machine of that namespace and name (annotation
  `metal3.io/BareMetalHost: <ns>/<bmh>`) -> BareMetalHost (annotation `cluster-manager.cdi.io/machine: <uuid>`). The
  Machine is both kinds the operator's clients read: a Metal3Machine (the fabric-manager client) and an OpenShift
  Machine, machine.openshift.io/v1beta1 (the cluster-manager client). The CRDs are harness/crds (installed by
  harness/cdi_operator.py). The emulator is either API's (harness/fabric_manager.py or harness/cluster_manager.py,
  one hardware model).
- per node, an `nvidia-driver` pod (label `app.kubernetes.io/component=nvidia-driver`, owned by the DaemonSet
  `nvidia-driver-daemonset`; kwok makes it Running and Ready) and a kwok `Exec` for it: an exec into that pod, as the
  operator runs through the apiserver, runs harness/bin/nvidia-smi on this machine with the node's state file, which
  this agent writes (the GPUs attached to the node, and a process on each GPU a running pod uses).
- DEVICE_PLUGIN mode: the node's `nvidia.com/gpu` capacity and allocatable follow the devices attached to its machine;
  with `NodeTimings.plugin_restart_s` set, the GPU operator's device-plugin and DCGM DaemonSets run a pod per GPU node
  and the operator's restart of them (after each attach and detach) takes the node's allocatable down for that long.
- `NodeTimings` makes the node as slow as a real server (`REALISTIC_NODE`): the driver pod only some time after the
  node's first GPU (no GPU shows before), a slow or failing `nvidia-smi drain`; `freeze(node)` stops a node's driver
  noticing the fabric at all.
- DRA mode: one ResourceSlice per node in the NVIDIA DRA driver's shape (driver `gpu.nvidia.com`, pool = node name,
  devices `gpu-<minor>` with attributes `uuid` = the fabric's serial, `productName`, `type: gpu`, and capacity
  `memory`), and the driver's kubelet-plugin pod (name prefix `dra-driver-nvidia-gpu-kubelet-plugin`, label
  `app.kubernetes.io/name=dra-driver-nvidia-gpu`), which the operator deletes after each change
  (TerminateKubeletPluginPodOnNode): the agent re-creates it, as its DaemonSet would.
- a deleted node: nothing happens on the node side; the fabric keeps its devices attached (the real hazard). Its
  ResourceSlice (owned by the Node) is deleted, the garbage collector's part, which does not run here.

A background loop (`start()`) syncs every node when the fabric changes (listener) and every `resync_interval_s`
(pods using GPUs come and go; a deleted driver or plugin pod comes back). `sync(node)` does one node at once.

The exec path needs kwok to serve exec for these pods and to find harness/bin/nvidia-smi at /usr/bin/nvidia-smi, the
path the operator runs: harness/controlplane.py starts kwok with the Exec CRD enabled, in a private mount namespace
where harness/bin overlays /usr/bin.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.fabric_manager import Device, FabricManagerEmulator

log = logging.getLogger(__name__)

BIN_DIR = Path(__file__).with_name("bin")
NVIDIA_SMI = BIN_DIR / "nvidia-smi"
STATE_ENV = "DDS_GPU_NODE_STATE"  # read by harness/bin/nvidia-smi

GPU_RESOURCE = "nvidia.com/gpu"
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
DRIVER_DAEMONSET = "nvidia-driver-daemonset"
DRIVER_CONTAINER = "nvidia-driver-ctr"
DRIVER_POD_LABELS = {"app.kubernetes.io/component": "nvidia-driver", "app": DRIVER_DAEMONSET}
# internal/utils/gpus.go: nvidiaDRADriverName and the kubelet plugin's pod name prefix.
DRA_PLUGIN_DAEMONSET = "dra-driver-nvidia-gpu-kubelet-plugin"
DRA_PLUGIN_LABELS = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}
MACHINE_ANNOTATION = "machine.openshift.io/machine"
BMH_ANNOTATION = "metal3.io/BareMetalHost"
FM_MACHINE_ANNOTATION = "cluster-manager.cdi.io/machine"
PROVIDER_ID_PREFIX = "fsas-cdi://"
DRIVER_VERSION = "550.54.15"


@dataclass(frozen=True)
class GpuSpec:
    product_name: str  # what nvidia-smi's `name` and the DRA driver's `productName` say
    memory_mib: int
    architecture: str


# The fabric names a model ("A100"); the node's driver reports the product. Unknown models get a spec from their name.
GPU_SPECS: dict[str, GpuSpec] = {
    "A100": GpuSpec("NVIDIA A100-SXM4-80GB", 81920, "Ampere"),
    "A30": GpuSpec("NVIDIA A30", 24576, "Ampere"),
    "A40": GpuSpec("NVIDIA A40", 46068, "Ampere"),
    "H100": GpuSpec("NVIDIA H100 80GB HBM3", 81559, "Hopper"),
    "H200": GpuSpec("NVIDIA H200", 143771, "Hopper"),
    "L40S": GpuSpec("NVIDIA L40S", 46068, "Ada Lovelace"),
    "T4": GpuSpec("Tesla T4", 15360, "Turing"),
    "V100": GpuSpec("Tesla V100-SXM2-32GB", 32768, "Volta"),
    "B200": GpuSpec("NVIDIA B200", 183359, "Blackwell"),
}


def gpu_spec(model: str) -> GpuSpec:
    return GPU_SPECS.get(model) or GpuSpec(f"NVIDIA {model}", 16384, "unknown")


class DeviceMode(str, Enum):
    """How the node publishes its GPUs (the CDI operator's DEVICE_RESOURCE_TYPE)."""

    DEVICE_PLUGIN = "DEVICE_PLUGIN"
    DRA = "DRA"


@dataclass(frozen=True)
class NodeTimings:
    """How fast the node side answers. The defaults are the instant node side most tests want; `REALISTIC_NODE` has
    what a real GPU server does (tests that are about slowness use it, scaled to their bounds)."""

    # The GPU driver pod comes this long after the node first has a GPU (node feature discovery labels the node, the
    # GPU operator schedules and builds the driver); until then the node shows no GPU and nvidia-smi cannot run.
    driver_delay_s: float = 0.0
    # DEVICE_PLUGIN mode: the GPU operator's device-plugin and DCGM DaemonSets run a pod on every GPU node, so the CDI
    # operator's restart of them after each attach and detach really restarts them: the node's nvidia.com/gpu
    # allocatable drops to 0 for this long, then comes back. None: the DaemonSets have no pods (the operator skips
    # restarting them), as before.
    plugin_restart_s: Optional[float] = None
    drain_delay_s: float = 0.0  # `nvidia-smi drain` takes this long
    drain_failure: str = ""  # `nvidia-smi drain` fails with this message (exit 255), while set


# A real server: the driver minutes after the first GPU, a device-plugin restart of tens of seconds, a drain of seconds.
REALISTIC_NODE = NodeTimings(driver_delay_s=180.0, plugin_restart_s=20.0, drain_delay_s=5.0)
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # the operator's RestartDaemonset sets it (internal/utils/nodes.go)
DEVICE_PLUGIN_DAEMONSET = "nvidia-device-plugin-daemonset"
# The DaemonSets the operator restarts in DEVICE_PLUGIN mode, with their images (harness/cdi_operator.py creates them).
GPU_OPERATOR_DAEMONSETS = {DEVICE_PLUGIN_DAEMONSET: "nvcr.io/nvidia/k8s-device-plugin",
                           "nvidia-dcgm": "nvcr.io/nvidia/cloud-native/dcgm"}


@dataclass(frozen=True)
class AgentNamespaces:
    driver: str = "gpu-operator"  # the NVIDIA GPU operator's namespace (the CDI operator's default)
    dra_plugin: str = "nvidia-dra-driver-gpu"
    metal3: str = "openshift-machine-api"


@dataclass(frozen=True)
class NodeGpu:
    """A GPU as the node's driver sees it."""

    serial: str
    model: str
    minor: int

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.minor:02X}:00.0"

    def as_state(self) -> dict[str, Any]:
        spec = gpu_spec(self.model)
        return {"uuid": self.serial, "index": self.minor, "minor": self.minor, "model": self.model,
                "product_name": spec.product_name, "pci_bus_id": self.pci_bus_id, "memory_mib": spec.memory_mib}

    def as_slice_device(self) -> dict[str, Any]:
        spec = gpu_spec(self.model)
        return {"name": f"gpu-{self.minor}",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": self.serial},
                               "productName": {"string": spec.product_name}, "brand": {"string": "Nvidia"},
                               "architecture": {"string": spec.architecture}, "index": {"int": self.minor},
                               "minor": {"int": self.minor}, "pcieBusID": {"string": self.pci_bus_id.lower()},
                               "driverVersion": {"version": DRIVER_VERSION}},
                "capacity": {"memory": {"value": f"{spec.memory_mib}Mi"}}}


@dataclass
class _NodeRecord:
    name: str
    machine_uuid: str
    state_file: Path
    minors: dict[str, int] = field(default_factory=dict)  # serial -> minor, stable while attached
    pod_gpus: dict[str, list[str]] = field(default_factory=dict)  # device-plugin pod uid -> serials it was given
    slice_generation: int = 0
    first_gpu_at: Optional[float] = None  # monotonic: when the fabric first gave the node a GPU
    driver_ready: bool = False


class GpuNodeAgent:
    """Plays the node side for the nodes it is given. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, api_client: Any, fabric: FabricManagerEmulator, *, mode: DeviceMode,
                 state_dir: Optional[Path] = None, namespaces: AgentNamespaces = AgentNamespaces(),
                 resync_interval_s: float = 1.0, timings: NodeTimings = NodeTimings()) -> None:
        self.mode = DeviceMode(mode)
        self.timings = timings
        self.fabric = fabric
        self.namespaces = namespaces
        self.resync_interval_s = resync_interval_s
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._own_dir = None if state_dir else tempfile.TemporaryDirectory(prefix="dds-gpu-nodes-")
        self.state_dir = Path(state_dir or self._own_dir.name)  # type: ignore[union-attr]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._nodes: dict[str, _NodeRecord] = {}
        self._lock = threading.RLock()  # one sync at a time: the loop and a test's direct sync() share the records
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._daemonsets: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self._frozen: set[str] = set()  # nodes whose driver shows no change (freeze)
        self._restarts_seen: dict[str, str] = {}  # GPU operator DaemonSet -> the restartedAt last acted on
        self._restarting_until: dict[str, float] = {}  # GPU operator DaemonSet -> monotonic end of its restart
        self.plugin_restarts = 0  # device-plugin DaemonSet restarts played (each one a capacity drop)
        fabric.add_listener(self._on_fabric_change)

    # -- lifecycle --

    def start(self) -> "GpuNodeAgent":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpu-node-agent", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self.fabric.remove_listener(self._on_fabric_change)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def __enter__(self) -> "GpuNodeAgent":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- nodes --

    def add_node(self, node_name: str) -> str:
        """Register the node's machine in the fabric, create its Metal3 chain and driver pods; returns the machine
        uuid. Idempotent."""
        node = self._core.read_node(node_name)
        provider_id = node.spec.provider_id or ""
        wanted_uuid = provider_id[len(PROVIDER_ID_PREFIX):] if provider_id.startswith(PROVIDER_ID_PREFIX) else None
        machine_uuid = self.fabric.register_machine(node_name, wanted_uuid)
        with self._lock:
            if node_name not in self._nodes:
                self._nodes[node_name] = _NodeRecord(node_name, machine_uuid,
                                                     self.state_dir / f"{node_name}.json")
        self._create_metal3_chain(node_name, machine_uuid)
        self.sync(node_name)
        return machine_uuid

    def machine_uuid(self, node_name: str) -> str:
        with self._lock:
            return self._nodes[node_name].machine_uuid

    def node_state(self, node_name: str) -> dict[str, Any]:
        """What nvidia-smi on the node reads (the state file's content)."""
        with self._lock:
            path = self._nodes[node_name].state_file
        return dict(json.loads(path.read_text()))

    def driver_pod_name(self, node_name: str) -> str:
        return f"{DRIVER_DAEMONSET}-{_suffix(node_name)}"

    def dra_plugin_pod_name(self, node_name: str) -> str:
        return f"{DRA_PLUGIN_DAEMONSET}-{_suffix(node_name)}"

    @staticmethod
    def slice_name(node_name: str) -> str:
        return f"{node_name}-{NVIDIA_DRA_DRIVER}"

    def freeze(self, node_name: str, frozen: bool = True) -> None:
        """A node whose GPU driver stops noticing the fabric (a GPU whose PCIe link never trains, a hot-unplug the
        kernel misses): while frozen, the node keeps showing the GPUs it showed — a GPU attached since is not visible
        there, one detached since still is. Unfrozen, it catches up at its next sync."""
        with self._lock:
            if frozen:
                self._frozen.add(node_name)
            else:
                self._frozen.discard(node_name)
        self._wake.set()

    def sync(self, node_name: str) -> None:
        """Make the node show what the fabric has attached to its machine, now."""
        with self._lock:
            record = self._nodes.get(node_name)
            if record is None:
                raise KeyError(f"gpu node agent: node {node_name} was never added")
            if node_name in self._frozen:
                return
            try:
                node = self._core.read_node(node_name)
            except ApiException as exc:
                if exc.status == 404:  # deleted: the fabric keeps its devices, as a real fabric would
                    log.info("gpu node agent: node %s is gone; its devices stay attached in the fabric", node_name)
                    self._forget_slice(node_name)
                    return
                raise
            devices = self.fabric.devices_of(record.machine_uuid)
            if not self._driver_ready(record, devices):
                devices = []  # no driver: the node shows no GPU yet
            gpus = self._node_gpus(record, devices)
            processes = self._processes(record, gpus)
            _write_json(record.state_file, {"node": node_name, "gpus": [gpu.as_state() for gpu in gpus],
                                            "processes": processes,
                                            "drain_delay_s": self.timings.drain_delay_s,
                                            "drain_failure": self.timings.drain_failure})
            if not record.driver_ready:
                return
            self._ensure_driver_pod(node_name, record)
            if self.mode is DeviceMode.DEVICE_PLUGIN:
                self._play_gpu_operator_pods(node_name)
                plugin_down = self._restarting(DEVICE_PLUGIN_DAEMONSET)
                self._publish_capacity(node, len(gpus), 0 if plugin_down else len(gpus))
            else:
                self._ensure_dra_plugin_pod(node_name)
                self._publish_slice(record, node, gpus)

    def set_timings(self, timings: NodeTimings) -> None:
        """Change how the node side answers from now on (the next sync writes the drain settings)."""
        with self._lock:
            self.timings = timings
        self._wake.set()

    def driver_ready(self, node_name: str) -> bool:
        with self._lock:
            return self._nodes[node_name].driver_ready

    def _driver_ready(self, record: _NodeRecord, devices: list[Device]) -> bool:
        """Whether the node's GPU driver runs: at once without a delay, else `driver_delay_s` after the node first
        had a GPU (and from then on)."""
        if record.driver_ready or self.timings.driver_delay_s <= 0:
            record.driver_ready = True
            return True
        now = time.monotonic()
        if devices and record.first_gpu_at is None:
            record.first_gpu_at = now
            log.info("gpu node agent: node %s has its first GPU; its driver comes in %.0f s", record.name,
                     self.timings.driver_delay_s)
        if record.first_gpu_at is not None and now - record.first_gpu_at >= self.timings.driver_delay_s:
            record.driver_ready = True
            log.info("gpu node agent: node %s's GPU driver is up", record.name)
        return record.driver_ready

    # -- the loop --

    def _on_fabric_change(self, machine_uuid: str) -> None:
        self._wake.set()  # not the API calls themselves: the fabric's answer must not wait for the apiserver

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.resync_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                names = list(self._nodes)
            for name in names:
                try:
                    self.sync(name)
                except Exception:  # the next pass retries; a test sees the log line
                    log.exception("gpu node agent: syncing node %s failed", name)

    # -- GPUs and their users --

    @staticmethod
    def _node_gpus(record: _NodeRecord, devices: list[Device]) -> list[NodeGpu]:
        present = {device.serial: device for device in devices}
        for serial in [s for s in record.minors if s not in present]:
            del record.minors[serial]
        for device in devices:
            if device.serial not in record.minors:
                taken = set(record.minors.values())
                record.minors[device.serial] = next(i for i in range(len(taken) + 1) if i not in taken)
        return sorted((NodeGpu(serial, present[serial].model, minor) for serial, minor in record.minors.items()),
                      key=lambda gpu: gpu.minor)

    def _processes(self, record: _NodeRecord, gpus: list[NodeGpu]) -> list[dict[str, Any]]:
        pods = [pod for pod in self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={record.name}").items
            if pod.status is not None and pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None]
        users = (self._device_plugin_users(record, pods, gpus) if self.mode is DeviceMode.DEVICE_PLUGIN
                 else self._dra_users(record, pods, gpus))
        processes = []
        for pid, (pod, serial) in enumerate(users, start=4000):
            processes.append({"gpu_uuid": serial, "pid": pid, "used_memory_mib": 1024,
                              "process_name": f"{pod.metadata.namespace}/{pod.metadata.name}"})
        return processes

    @staticmethod
    def _device_plugin_users(record: _NodeRecord, pods: list[Any], gpus: list[NodeGpu]) -> list[tuple[Any, str]]:
        """The device plugin hands each pod asking for nvidia.com/gpu whole GPUs nobody else holds; kept per pod uid
        (the assignment lives in the kubelet, which the API does not show)."""
        attached = [gpu.serial for gpu in gpus]
        running = {pod.metadata.uid: pod for pod in pods if _gpu_request(pod) > 0}
        record.pod_gpus = {uid: [s for s in serials if s in attached]
                           for uid, serials in record.pod_gpus.items() if uid in running}
        users: list[tuple[Any, str]] = []
        for uid, pod in sorted(running.items(), key=lambda item: item[1].metadata.creation_timestamp or 0):
            if uid not in record.pod_gpus:  # allocated once, when the pod starts; a GPU that leaves is not replaced
                taken = {serial for serials in record.pod_gpus.values() for serial in serials}
                record.pod_gpus[uid] = [serial for serial in attached if serial not in taken][:_gpu_request(pod)]
            users += [(pod, serial) for serial in record.pod_gpus[uid]]
        return users

    def _dra_users(self, record: _NodeRecord, pods: list[Any], gpus: list[NodeGpu]) -> list[tuple[Any, str]]:
        """The pods whose allocated claims hold devices of this node's slice."""
        by_name = {f"gpu-{gpu.minor}": gpu.serial for gpu in gpus}
        users: list[tuple[Any, str]] = []
        for pod in pods:
            for claim_name in _claim_names(pod):
                try:
                    claim = self._custom.get_namespaced_custom_object(
                        "resource.k8s.io", "v1", pod.metadata.namespace, "resourceclaims", claim_name)
                except ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
                results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
                for result in results or []:
                    if result.get("driver") == NVIDIA_DRA_DRIVER and result.get("pool") == record.name \
                            and result.get("device") in by_name:
                        users.append((pod, by_name[result["device"]]))
        return users

    # -- what the node publishes --

    def _publish_capacity(self, node: Any, count: int, allocatable: int) -> None:
        """`allocatable` below `count` while the device plugin restarts: the kubelet has no plugin to allocate from."""
        quantity = str(count)
        status = node.status
        current = ((status.capacity or {}).get(GPU_RESOURCE), (status.allocatable or {}).get(GPU_RESOURCE))
        if current == (quantity, str(allocatable)):
            return
        self._core.patch_node_status(node.metadata.name, {"status": {"capacity": {GPU_RESOURCE: quantity},
                                                                     "allocatable": {GPU_RESOURCE: str(allocatable)}}})
        log.info("gpu node agent: node %s now has %s %s (%d allocatable)", node.metadata.name, quantity,
                 GPU_RESOURCE, allocatable)

    # -- the GPU operator's DaemonSets (DEVICE_PLUGIN mode, timings.plugin_restart_s set) --

    def _restarting(self, daemonset: str) -> bool:
        return time.monotonic() < self._restarting_until.get(daemonset, 0.0)

    def _play_gpu_operator_pods(self, node_name: str) -> None:
        """A pod of each GPU operator DaemonSet on this GPU node, and the DaemonSets' status as their controller would
        write it (the operator restarts only a DaemonSet whose pods are all ready). A new restartedAt on a template
        (the operator's restart) deletes their pods; they come back `plugin_restart_s` later."""
        if self.timings.plugin_restart_s is None:
            return
        namespace = self.namespaces.driver
        gpu_nodes = sum(1 for record in self._nodes.values() if record.driver_ready)
        for name, image in GPU_OPERATOR_DAEMONSETS.items():
            try:
                daemonset = self._apps.read_namespaced_daemon_set(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            restarted_at = ((daemonset.spec.template.metadata.annotations or {}) if daemonset.spec.template.metadata
                            else {}).get(RESTARTED_AT)
            if restarted_at and restarted_at != self._restarts_seen.get(name):
                self._restarts_seen[name] = restarted_at
                self._restarting_until[name] = time.monotonic() + self.timings.plugin_restart_s
                self.plugin_restarts += name == DEVICE_PLUGIN_DAEMONSET
                log.info("gpu node agent: DaemonSet %s/%s restarted (%s): its pods are down for %.0f s", namespace,
                         name, restarted_at, self.timings.plugin_restart_s)
                for pod in self._core.list_namespaced_pod(namespace, label_selector=f"app={name}").items:
                    with contextlib.suppress(ApiException):
                        self._core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
            restarting = self._restarting(name)
            owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": daemonset.metadata.uid,
                     "controller": True, "blockOwnerDeletion": True}
            if not restarting:
                self._ensure_pod(namespace, f"{name}-{_suffix(node_name)}", node_name, {"app": name}, name, image,
                                 owner)
            ready = 0 if restarting else gpu_nodes
            status = daemonset.status
            if status is not None and (status.desired_number_scheduled, status.number_ready,
                                       status.observed_generation) == (gpu_nodes, ready,
                                                                       daemonset.metadata.generation):
                continue
            self._apps.patch_namespaced_daemon_set_status(name, namespace, {"status": {
                "desiredNumberScheduled": gpu_nodes, "currentNumberScheduled": gpu_nodes, "numberReady": ready,
                "numberAvailable": ready, "numberUnavailable": gpu_nodes - ready, "updatedNumberScheduled": gpu_nodes,
                "numberMisscheduled": 0, "observedGeneration": daemonset.metadata.generation}})

    def _forget_slice(self, node_name: str) -> None:
        """The garbage collector's part (no kube-controller-manager runs here): a slice goes with its Node owner."""
        try:
            self._custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                      self.slice_name(node_name))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _publish_slice(self, record: _NodeRecord, node: Any, gpus: list[NodeGpu]) -> None:
        name = self.slice_name(record.name)
        devices = [gpu.as_slice_device() for gpu in gpus]
        try:
            existing = self._custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            existing = None
        if existing is not None and _slice_identity(existing["spec"].get("devices") or []) == _slice_identity(devices):
            return  # compared by name, uuid and product: the apiserver normalizes quantities and adds defaults
        if not devices:
            if existing is not None:
                self._custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
            return
        published = int(((existing or {}).get("spec") or {}).get("pool", {}).get("generation", 0))
        record.slice_generation = max(record.slice_generation, published) + 1
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                # Owned by the Node, as the driver's kubelet plugin publishes it: deleted with the Node.
                "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                                "name": record.name, "uid": node.metadata.uid}]},
                "spec": {"driver": NVIDIA_DRA_DRIVER, "nodeName": record.name,
                         "pool": {"name": record.name, "generation": record.slice_generation,
                                  "resourceSliceCount": 1},
                         "devices": devices}}
        if existing is None:
            self._custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            self._custom.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name, body)
        log.info("gpu node agent: slice %s now lists %s", name, [gpu.serial for gpu in gpus])

    # -- the objects a real cluster would have --

    def _create_metal3_chain(self, node_name: str, machine_uuid: str) -> None:
        namespace = self.namespaces.metal3
        self._ensure_namespace(namespace)
        bmh, metal3_machine = f"{node_name}-bmh", f"{node_name}-m3m"
        _create_or_keep(lambda: self._custom.create_namespaced_custom_object(
            "metal3.io", "v1alpha1", namespace, "baremetalhosts",
            {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
             "metadata": {"name": bmh, "namespace": namespace,
                          "annotations": {FM_MACHINE_ANNOTATION: machine_uuid}},
             "spec": {"online": True}}))
        _create_or_keep(lambda: self._custom.create_namespaced_custom_object(
            "infrastructure.cluster.x-k8s.io", "v1beta1", namespace, "metal3machines",
            {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
             "metadata": {"name": metal3_machine, "namespace": namespace,
                          "annotations": {BMH_ANNOTATION: f"{namespace}/{bmh}"}},
             "spec": {"providerID": f"metal3://{namespace}/{bmh}/{metal3_machine}"}}))
        # OpenShift's Machine of the same namespace and name, which the cluster-manager client (FTI_CDI_API_TYPE=CM)
        # reads instead of the Metal3Machine (cm/client.go getNodeMachineID): one node annotation serves both.
        _create_or_keep(lambda: self._custom.create_namespaced_custom_object(
            "machine.openshift.io", "v1beta1", namespace, "machines",
            {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
             "metadata": {"name": metal3_machine, "namespace": namespace,
                          "annotations": {BMH_ANNOTATION: f"{namespace}/{bmh}"}},
             "spec": {"providerID": f"metal3://{namespace}/{bmh}/{metal3_machine}"}}))
        self._core.patch_node(node_name, {"metadata": {"annotations": {
            MACHINE_ANNOTATION: f"{namespace}/{metal3_machine}"}}})

    def _ensure_driver_pod(self, node_name: str, record: _NodeRecord) -> None:
        namespace = self.namespaces.driver
        name = self.driver_pod_name(node_name)
        owner = self._ensure_daemonset(namespace, DRIVER_DAEMONSET, DRIVER_POD_LABELS, DRIVER_CONTAINER,
                                       f"nvcr.io/nvidia/driver:{DRIVER_VERSION}")
        # kwok runs an exec on this pod as a local command, with the node's state file in the environment.
        _create_or_keep(lambda: self._custom.create_namespaced_custom_object(
            "kwok.x-k8s.io", "v1alpha1", namespace, "execs",
            {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Exec", "metadata": {"name": name, "namespace": namespace},
             "spec": {"execs": [{"local": {"envs": [{"name": STATE_ENV, "value": str(record.state_file)},
                                                    {"name": "NODE_NAME", "value": node_name}]}}]}}))
        self._ensure_pod(namespace, name, node_name, DRIVER_POD_LABELS, DRIVER_CONTAINER,
                         f"nvcr.io/nvidia/driver:{DRIVER_VERSION}", owner)

    def _ensure_dra_plugin_pod(self, node_name: str) -> None:
        namespace = self.namespaces.dra_plugin
        image = "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.0"
        owner = self._ensure_daemonset(namespace, DRA_PLUGIN_DAEMONSET, DRA_PLUGIN_LABELS, "gpus", image)
        self._ensure_pod(namespace, self.dra_plugin_pod_name(node_name), node_name, DRA_PLUGIN_LABELS, "gpus",
                         image, owner)

    def _ensure_daemonset(self, namespace: str, name: str, labels: dict[str, str], container: str,
                          image: str) -> dict[str, Any]:
        """An inert DaemonSet (no controller runs here) that owns the per-node pods, so that cluster-autoscaler and
        drains treat them as DaemonSet pods, as they are in a real cluster."""
        key = (namespace, name)
        if key not in self._daemonsets:
            self._ensure_namespace(namespace)
            body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"selector": {"matchLabels": labels},
                             "template": {"metadata": {"labels": labels},
                                          "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                                                   "containers": [{"name": container, "image": image}]}}}}
            try:
                created = self._apps.create_namespaced_daemon_set(namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                created = self._apps.read_namespaced_daemon_set(name, namespace)
            self._daemonsets[key] = created.metadata.uid
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": self._daemonsets[key],
                "controller": True, "blockOwnerDeletion": True}

    def _ensure_pod(self, namespace: str, name: str, node_name: str, labels: dict[str, str], container: str,
                    image: str, owner: dict[str, Any]) -> None:
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
                "spec": {"nodeName": node_name, "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": container, "image": image}]}}
        try:
            existing = self._core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            existing = None
        if existing is not None and existing.metadata.deletion_timestamp is None:
            return
        if existing is not None:  # being deleted (the operator restarts the plugin): comes back once it is gone
            return
        _create_or_keep(lambda: self._core.create_namespaced_pod(namespace, body))

    def _ensure_namespace(self, namespace: str) -> None:
        _create_or_keep(lambda: self._core.create_namespace({"metadata": {"name": namespace}}))


def _gpu_request(pod: Any) -> int:
    total = 0
    for container in pod.spec.containers or []:
        resources = container.resources
        if resources is None:
            continue
        amount = (resources.limits or {}).get(GPU_RESOURCE) or (resources.requests or {}).get(GPU_RESOURCE)
        total += int(amount or 0)
    return total


def _claim_names(pod: Any) -> list[str]:
    names = [status.resource_claim_name for status in (pod.status.resource_claim_statuses or [])
             if status.resource_claim_name]
    names += [claim.resource_claim_name for claim in (pod.spec.resource_claims or []) if claim.resource_claim_name]
    return names


def _slice_identity(devices: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(device["name"], device["attributes"]["uuid"]["string"], device["attributes"]["productName"]["string"])
            for device in devices]


def _create_or_keep(create: Any) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def _suffix(node_name: str) -> str:
    """A short stable suffix, as a DaemonSet's pod names have, that keeps names within 63 characters."""
    return hashlib.sha256(node_name.encode()).hexdigest()[:5]


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Atomically: nvidia-smi may read the file at any moment."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)
