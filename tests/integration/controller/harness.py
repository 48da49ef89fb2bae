"""DDS's controller half in this process, built by `build_app` exactly as `dds serve` builds it, on the real apiserver.

- DDS: `build_app(settings)` in the test's namespace (its fabric state and instances ConfigMaps live there), the
  simulated fabric on a virtual clock, node backend `machineset`; nothing is started: tests drive
  `controller.run_once()` and the deciders (`scale_up.increase`, `scale_down.delete_nodes`) themselves, in place of the
  loop thread and cluster-autoscaler.
- Cluster API's part: its own manager and the harness's kwok infrastructure provider, running with the session's
  control plane (tests/integration/nodes/harness.py), turn the MachineSet's replicas into Machines and kwok Nodes, on
  wall time. A Machine that goes is drained by Cluster API and waits on DDS's pre-terminate hook while its node holds
  GPUs: a test that removes nodes drives DDS's passes until they are gone (`wait_nodes_gone`).
- The virtual clock is wall time plus an offset the test moves forward: the apiserver's timestamps (a pod's
  Unschedulable condition) stay comparable with DDS's "now", while fabric latencies, cooldowns and the pending debounce pass
  in an instant.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Optional

from kubernetes import client

from dds.app import App, build_app
from dds.config import FabricBackend, LatencySpec, NodeBackend, PoolSpec, Settings, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, FabricDevice, Operation
from dds.model.groups import (ANN_CAPI_MIN, ANN_FORCE_DETACH, ANN_GPU_IDLE_COOLDOWN, ANN_NODE_IDLE_COOLDOWN,
                              ANN_TEMPLATE_MODE, NodeGroupSpec)
from dds.scaling.requests import LiveNode
from harness.controlplane import ControlPlane
from tests.integration.nodes.harness import NodeGroupHarness, machineset_manifest, open_grant, wait_for

GPU = "nvidia.com/gpu"
TEST_LABEL = "dds.test/namespace"  # on the group's template and nodes; the tests' pods select it
CA_TAINT = "ToBeDeletedByClusterAutoscaler"
DEBOUNCE_SECONDS = 30.0  # the loop's pending_debounce_seconds, long here to watch both sides of it
ATTACH_SECONDS = 45.0  # longer than the debounce: a pod can outwait it while its GPU is on its way
DETACH_SECONDS = 10.0


class VirtualClock:
    """Wall time plus an offset that only moves forward."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


def settings_for(namespace: str, pool_size: int = 4) -> Settings:
    return Settings(
        listen="127.0.0.1:0", insecure=True, metrics_listen="127.0.0.1:0",
        namespace=namespace, machineset_namespaces=[namespace], node_group_namespaces=open_grant(namespace),
        node_backend=NodeBackend.MACHINESET,
        fabric=FabricBackend.SIMULATED,
        loop_interval_seconds=1.0, pending_debounce_seconds=DEBOUNCE_SECONDS,
        simulated_fabric=SimulatedFabricSettings(
            pools=[PoolSpec(name="default", devices={"A30": pool_size})],
            attach_latency=LatencySpec(min=ATTACH_SECONDS, max=ATTACH_SECONDS),
            detach_latency=LatencySpec(min=DETACH_SECONDS, max=DETACH_SECONDS)))


class ControllerHarness:
    """One DDS (`self.app`) and one node group per test; see the module docstring."""

    def __init__(self, plane: ControlPlane, namespace: str, pool_size: int = 4, *,
                 dds_api: client.ApiClient) -> None:
        """`api` is the test's own (admin) client for setup and inspection; DDS gets `dds_api`, its ServiceAccount's
        (harness/rbac.py), so a request the shipped RBAC does not grant fails the test."""
        self.clock = VirtualClock()
        self.nodes = NodeGroupHarness(plane, namespace, clock=self.clock, dds_api=dds_api)
        self.api = self.nodes.api
        self.dds_api = dds_api
        self.namespace = namespace
        self.core = client.CoreV1Api(self.api)
        self.settings = settings_for(namespace, pool_size)
        self.app: App = build_app(self.settings, dds_api, clock=self.clock)
        self._apps = [self.app]

    # --- DDS ---
    @property
    def controller(self):
        return self.app.controller

    def run_once(self) -> None:
        self.app.controller.run_once()

    def restart_dds(self) -> App:
        """A new DDS on the same cluster and stored state, as after a crash: the old one is dropped without a word
        (nothing of its memory carries over)."""
        self.app = build_app(self.settings, self.dds_api, clock=self.clock)
        self._apps.append(self.app)
        return self.app

    def group(self, name: str) -> NodeGroupSpec:
        self.app.catalog.refresh()
        assert self.app.catalog.last_error is None, self.app.catalog.last_error
        return next(g for g in self.app.catalog.groups() if g.source.name == name)

    # --- the node group ---
    def create_group(self, name: str, *, replicas: int, min_size: int = 0, max_size: int = 4,
                     mode: str = "spec-fixed", gpu_cooldown: str = "60s", node_cooldown: str = "60s",
                     force_detach: bool = False) -> NodeGroupSpec:
        manifest = machineset_manifest(name, replicas=replicas, max_size=max_size)
        annotations = manifest["metadata"]["annotations"]
        annotations.update({
            ANN_CAPI_MIN: str(min_size), ANN_TEMPLATE_MODE: mode,
            ANN_GPU_IDLE_COOLDOWN: gpu_cooldown, ANN_NODE_IDLE_COOLDOWN: node_cooldown,
            "capacity.cluster-autoscaler.kubernetes.io/labels":
                f"node.kubernetes.io/instance-type=cdi-16c64g,{TEST_LABEL}={self.namespace}"})
        if force_detach:
            annotations[ANN_FORCE_DETACH] = "true"
        self.nodes.create(manifest)
        if replicas:
            self.nodes.wait_ready_nodes(replicas)
        return self.group(name)

    def wait_nodes_gone(self, *nodes: str) -> None:
        """Drive DDS's passes until Cluster API has deleted `nodes`: a Machine whose node held GPUs carries DDS's
        pre-terminate hook, which only a pass releases once Cluster API has drained the node and waits on it."""
        def gone() -> bool:
            self.run_once()
            return not set(nodes) & set(self.nodes.nodes())
        wait_for(f"Cluster API to delete {', '.join(nodes)}", gone)

    def node_names(self) -> list[str]:
        return sorted(self.nodes.nodes())

    def replicas(self, name: str) -> int:
        return self.nodes.replicas(name)

    def machine_removed(self, node: str) -> bool:
        """The Machine of `node` is marked for deletion, being deleted, or already gone (Cluster API's part works in
        the background: a marked Machine may be gone by the time a test looks)."""
        machine = next((m for m in self.nodes.machines()
                        if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == node), None)
        if machine is None:
            return True
        meta = machine["metadata"]
        return bool(meta.get("deletionTimestamp")) or "cluster.x-k8s.io/delete-machine" in (meta.get("annotations")
                                                                                            or {})

    def live_node(self, name: str, group: NodeGroupSpec) -> LiveNode:
        node = self.core.read_node(name)
        return LiveNode(name=name, provider_id=node.spec.provider_id or "", group_id=group.id, ready=True,
                        labels=dict(node.metadata.labels or {}))

    # --- GPUs ---
    def attach_gpus(self, node: str, count: int) -> None:
        """Give `node` GPUs before the scenario starts (as an operator or an earlier scale-up would have)."""
        fabric = self.app.fabric
        key = f"setup/{node}/{len(fabric.devices(node))}"
        fabric.attach(AttachRequest(key=key, node=node, pool="default", model="A30", count=count, reason="setup"))
        self.clock.advance(ATTACH_SECONDS + 1)
        fabric.tick()
        wait_for(f"{node} to show {count} GPU(s)", lambda: self.gpus_allocatable(node) == count)

    def devices(self, node: str) -> tuple[FabricDevice, ...]:
        return self.app.fabric.devices(node)

    def operations(self, *, started_by: str = "") -> list[Operation]:
        """Fabric operations, except the test's own setup attaches."""
        return [op for op in self.app.fabric.operations()
                if not op.key.startswith("setup/") and op.key.startswith(started_by)]

    def gpus_allocatable(self, node: str) -> int:
        return int((self.core.read_node(node).status.allocatable or {}).get(GPU, "0"))

    def pass_attach_latency(self) -> None:
        self.clock.advance(ATTACH_SECONDS + 1)
        self.run_once()

    def pass_detach_latency(self) -> None:
        self.clock.advance(DETACH_SECONDS + 1)
        self.run_once()

    # --- pods ---
    def create_pod(self, name: str, *, gpus: int = 0, memory: str = "1Gi", node: Optional[str] = None,
                   owner: Optional[Mapping[str, Any]] = None, bind_to: Optional[str] = None) -> None:
        """A pod for this test's nodes only. `node` pins it with a nodeSelector (the scheduler binds it); `bind_to`
        sets spec.nodeName (no scheduler: as a pod the scheduler had already placed arrives)."""
        requests = {"cpu": "100m", "memory": memory}
        limits = {GPU: str(gpus)} if gpus else {}
        selector = {TEST_LABEL: self.namespace}
        if node is not None:
            selector["kubernetes.io/hostname"] = node
        metadata: dict[str, Any] = {"name": name}
        if owner is not None:
            metadata["ownerReferences"] = [dict(owner)]
        spec: dict[str, Any] = {"nodeSelector": selector,
                                "containers": [{"name": "main", "image": "example.com/work:1",
                                                "resources": {"requests": {**requests, **limits}, "limits": limits}}]}
        if bind_to is not None:
            spec["nodeName"] = bind_to
        self.core.create_namespaced_pod(self.namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                                                         "spec": spec})

    def daemonset_owner(self, name: str) -> dict[str, Any]:
        """A DaemonSet to own a pod (no controller runs here: the DaemonSet makes no pods of its own)."""
        apps = client.AppsV1Api(self.api)
        labels = {"app": name}
        body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
                "spec": {"selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"nodeSelector": {TEST_LABEL: "none"},
                                               "containers": [{"name": "main", "image": "example.com/agent:1"}]}}}}
        created = apps.create_namespaced_daemon_set(self.namespace, body)
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": created.metadata.uid,
                "controller": True}

    def wait_unschedulable(self, name: str) -> None:
        def unschedulable() -> bool:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                       for c in pod.status.conditions or ())
        wait_for(f"the scheduler to find {name} unschedulable", unschedulable)

    def wait_running(self, name: str, node: Optional[str] = None) -> str:
        def running() -> Optional[str]:
            pod = self.core.read_namespaced_pod(name, self.namespace)
            if pod.status.phase == "Running" and (node is None or pod.spec.node_name == node):
                return pod.spec.node_name
            return None
        return wait_for(f"{name} Running" + (f" on {node}" if node else ""), running)

    def pod_node(self, name: str) -> Optional[str]:
        return self.core.read_namespaced_pod(name, self.namespace).spec.node_name

    # --- nodes ---
    def taint_keys(self, node: str) -> list[str]:
        return [t.key for t in self.core.read_node(node).spec.taints or ()]

    def add_taint(self, node: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        taints = [t.to_dict() for t in self.core.read_node(node).spec.taints or ()]
        taints.append({"key": key, "value": value, "effect": effect})
        self.core.patch_node(node, {"spec": {"taints": taints}})

    # --- Events, as `kubectl describe` shows them ---
    def events(self, kind: str, name: str, reason: Optional[str] = None) -> list[client.CoreV1Event]:
        for app in self._apps:
            app.events.flush()
        namespace = "default" if kind == "Node" else self.namespace
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        items = self.core.list_namespaced_event(namespace, field_selector=selector).items
        return [e for e in items if reason is None or e.reason == reason]

    def close(self) -> None:
        for app in self._apps:
            app.stop()
        self.nodes.close()


def one_gpu_idle_beside_a_busy_one(dds: ControllerHarness) -> tuple[str, str]:
    """Two nodes; the first holds the whole 2-GPU pool, one GPU used by a running pod and one idle (its 600 s
    cooldown started by a pass); the second holds none. Returns (first, second)."""
    dds.create_group("workers", replicas=2, gpu_cooldown="600s")
    first, second = dds.node_names()
    dds.attach_gpus(first, 2)
    dds.create_pod("busy", gpus=1, node=first)
    dds.wait_running("busy", first)
    dds.run_once()
    return first, second


def two_nodes_with_busy_gpus(dds: ControllerHarness, gpu_cooldown: str = "1h") -> tuple[str, str]:
    """Two 4-slot nodes (a group at its max size), each holding 2 GPUs, both in use by two running 1-GPU pods: a-0
    and a-1 on the first, b-0 and b-1 on the second. Returns (first, second)."""
    dds.create_group("workers", replicas=2, max_size=2, gpu_cooldown=gpu_cooldown)
    first, second = dds.node_names()
    for node in (first, second):
        dds.attach_gpus(node, 2)
    for name, node in (("a-0", first), ("a-1", first), ("b-0", second), ("b-1", second)):
        dds.create_pod(name, gpus=1, node=node)
        dds.wait_running(name, node)
    return first, second
