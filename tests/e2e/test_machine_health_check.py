"""Cluster API's MachineHealthCheck over DDS's node group, with the real cluster-autoscaler and Cluster API v1.14's own
manager (its MachineHealthCheck controller runs in the core manager harness/capi.py starts; the hosts are the kwok
infrastructure provider's, harness/kwok_provider.py). One MachineHealthCheck over the gpu-workers MachineSet's
Machines, with the settings docs/lifecycles.md ("MachineHealthCheck") recommends, its timeouts scaled from minutes to
seconds. In file order:
1. GPUs attaching to a worker for a pending pod: no Machine is remediated (the health check reads Node and Machine
   conditions; an attach changes neither) and the check keeps counting the Machine healthy through the attach;
2. the worker's GPU driver restarting, as the node shows it in device-plugin mode (its nvidia.com/gpu capacity and
   allocatable drop to 0, then come back), while a pod that its idle GPUs will serve waits: no Machine remediated,
   and DDS attaches nothing for that pod (the fabric's devices on the node count as present while hidden); the pod
   then runs on the GPUs that came back;
3. the worker's host dies: after the Ready=Unknown timeout the health check marks the Machine unhealthy, the MachineSet
   controller deletes it, DDS's pre-terminate hook gets its GPUs back to the pool before the host goes (none stranded),
   and the Machine Cluster API makes in its place gets its boot GPU;
4. DRA mode, on a second group (dra-workers, dds.cdi.dev/gpu-api: dra-node-local) added to the same stack with a health
   check of its own: the worker's GPU driver restarting, as the node shows it in DRA mode (its ResourceSlice deleted,
   then published again: the kubelet deletes the slices of a driver gone longer than its 30 s wiping delay,
   pkg/kubelet/cm/dra/manager.go `defaultWipingDelay`, and the driver lists its devices again once back; a shorter
   restart leaves the slice as it was), while a pod whose claim its idle GPU will serve waits: no Machine remediated, DDS attaches nothing for that pod (the
   fabric's device on the node counts as present while the slice hides it); the pod then runs on the device that came
   back.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Callable, Mapping

import pytest
import yaml
from kubernetes import client

from dds.model.groups import ANN_CAPI_MIN, ANN_GPU_API, GpuApi
from harness.stack import (GPU, ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, machineset,
                           pod, start_stack)
from tests.e2e.cluster_facts import describe, fabric_facts, pods_running
from tests.e2e.test_cluster_api import (CAPI, MACHINESET, NAMESPACE, V1BETA2, machine_of_node, machines,
                                        machineset_machines, machineset_replicas, node_names, node_of_pod, pool_whole,
                                        wait_for_host_removed)

pytestmark = pytest.mark.e2e

POOL = 8
TIMEOUT = 180.0
ATTACH_LATENCY = (6.0, 8.0)  # long enough for the health check to look at the node while an attach runs
PROVISIONING_SECONDS = 5.0
HEALTH_CHECK = "gpu-workers"
# docs/lifecycles.md's settings, scaled: Ready Unknown or False for 5 minutes there, 15 s here; a node startup timeout
# longer than the node path (here the provider's 5 s; on composable hardware the tens of minutes a server boots).
READY_TIMEOUT_SECONDS = 15
NODE_STARTUP_TIMEOUT_SECONDS = 120
DRIVER_RESTART_SECONDS = 12.0  # under CA's 30 s wait before it scales up for a GPU pod (its GPU pod time buffer)
PRE_TERMINATE_BOUND_SECONDS = 60.0
DRA_MACHINESET = DRA_HEALTH_CHECK = "dra-workers"
DRA_DRIVER = "gpu.dds.cdi.dev"  # DDS's own: it lists the GPUs the simulated fabric attached in the node's slice
DEVICE_CLASS_FILE = ROOT / "manifests" / "dra" / "deviceclass.yaml"


def health_check(stack: Stack, machineset_name: str = MACHINESET, name: str = HEALTH_CHECK) -> dict[str, Any]:
    """The MachineHealthCheck `name` over a MachineSet's Machines (its selector's set-name label)."""
    target = client.CustomObjectsApi(stack.api).get_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE,
                                                                             "machinesets", machineset_name)
    set_name = "cluster.x-k8s.io/set-name"
    return {"apiVersion": f"{CAPI}/{V1BETA2}", "kind": "MachineHealthCheck",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"clusterName": target["spec"]["clusterName"],
                     "selector": {"matchLabels": {set_name: target["spec"]["selector"]["matchLabels"][set_name]}},
                     "checks": {"nodeStartupTimeoutSeconds": NODE_STARTUP_TIMEOUT_SECONDS,
                                "unhealthyNodeConditions": [
                                    {"type": "Ready", "status": status, "timeoutSeconds": READY_TIMEOUT_SECONDS}
                                    for status in ("Unknown", "False")]},
                     # A count, not a percentage: 40% of a group of 1 or 2 Machines rounds down to 0.
                     "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": 1}}}}


def health_status(stack: Stack, name: str = HEALTH_CHECK) -> Mapping[str, Any]:
    return client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
        CAPI, V1BETA2, NAMESPACE, "machinehealthchecks", name).get("status") or {}


def condition(machine: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in (machine.get("status") or {}).get("conditions") or () if c.get("type") == kind), {})


def remediated(stack: Stack) -> list[str]:
    """The Machines a health check found unhealthy or their MachineSet is remediating, with why."""
    out = []
    for machine in machines(stack):
        check, owner = condition(machine, "HealthCheckSucceeded"), condition(machine, "OwnerRemediated")
        if check.get("status") == "False" or owner or machine["metadata"].get("deletionTimestamp"):
            out.append(f"{machine['metadata']['name']}: {check.get('reason')} {check.get('message')}; "
                       f"owner {owner.get('reason')}; deleting {bool(machine['metadata'].get('deletionTimestamp'))}")
    return out


def marked_unhealthy_events(stack: Stack) -> list[str]:
    return [f"{e.involved_object.name}: {e.message}" for e in stack.core.list_namespaced_event(NAMESPACE).items
            if e.reason == "MachineMarkedUnhealthy"]


def healthy_throughout(stack: Stack, what: str, predicate: Callable[[], Any], timeout: float,
                       checks: tuple[str, ...] = (HEALTH_CHECK,)) -> Any:
    """Wait for `predicate` while checking, at every look, that no Machine is remediated and each health check of
    `checks` counts every Machine it checks healthy."""
    def look() -> Any:
        assert not remediated(stack), f"while waiting for {what}: {remediated(stack)}; {describe(stack)}"
        for check in checks:
            status = health_status(stack, check)
            assert status.get("currentHealthy") == status.get("expectedMachines"), \
                f"while waiting for {what}, health check {check} counts a Machine unhealthy: {status}"
        return predicate()

    return stack.wait_for(what, look, timeout, lambda: describe(stack), interval=0.5)


def gpus_attached_total(stack: Stack) -> float:
    assert stack.dds is not None
    return sum(v for k, v in stack.dds.metrics().items() if k.startswith("dds_gpus_attached_total"))


def set_node_gpus(stack: Stack, node: str, count: int) -> None:
    """The node's GPU resource as its kubelet publishes it (capacity and allocatable), e.g. 0 while the GPU operator
    restarts the device plugin."""
    stack.core.patch_node_status(node, {"status": {"capacity": {GPU: str(count)},
                                                   "allocatable": {GPU: str(count)}}})


def end_pod(stack: Stack, name: str) -> tuple[str, str, list[str]]:
    """Delete the pod `name`; its node, the node's Machine and the node's fabric devices: its 2 GPUs, idle now and
    kept (the GPU idle cooldown is 10 minutes)."""
    node = node_of_pod(stack, name)
    machine = machine_of_node(stack, node)["metadata"]["name"]
    stack.core.delete_namespaced_pod(name, "demo", grace_period_seconds=0)
    stack.wait_for(f"{name} gone", lambda: name not in {p.metadata.name for p in stack.pods()}, 60.0)
    held = sorted(fabric_facts(stack).attached()[node])
    assert len(held) == 2, held
    return node, machine, held


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    options = StackOptions(workers=1, pool_size=POOL, attach_latency=ATTACH_LATENCY,
                           detach_latency=(2.0, 3.0), node_provisioning_seconds=PROVISIONING_SECONDS,
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
                           dds_settings={"pre_terminate_detach_timeout_seconds": PRE_TERMINATE_BOUND_SECONDS})
    with start_stack(tmp_path_factory.mktemp("machine-health-check"), options) as started:
        started.wait_for("a Ready worker of a real Machine with its boot GPU",
                         lambda: [n for n in started.nodes() if is_ready(n) and gpus_allocatable(n) == 1]
                         and len([m for m in machines(started) if (m.get("status") or {}).get("nodeRef")]) == 1,
                         TIMEOUT, lambda: describe(started))
        client.CustomObjectsApi(started.api).create_namespaced_custom_object(
            CAPI, V1BETA2, NAMESPACE, "machinehealthchecks", health_check(started))
        started.wait_for("the health check counting the worker's Machine healthy", lambda: (
            health_status(started).get("expectedMachines") == 1 and health_status(started).get("currentHealthy") == 1),
            60.0, lambda: str(health_status(started)))
        yield started


def test_gpus_attaching_to_a_worker_do_not_get_its_machine_remediated(stack: Stack) -> None:
    (node,) = [n.metadata.name for n in stack.nodes() if is_ready(n)]
    machine = machine_of_node(stack, node)["metadata"]["name"]
    stack.core.create_namespaced_pod("demo", pod("gpu-0", memory_gib=8, gpus=2))  # 1 boot GPU: DDS attaches 1
    healthy_throughout(stack, f"an attach to {node} running", lambda: fabric_facts(stack).running("attach"), 60.0)
    healthy_throughout(stack, "gpu-0 Running", lambda: pods_running(stack, ["gpu-0"]), TIMEOUT)
    assert node_of_pod(stack, "gpu-0") == node and gpus_allocatable(stack.core.read_node(node)) == 2
    # The attach is over; give the health check a Ready timeout's worth of looks at the node as it is now.
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS + 5
    healthy_throughout(stack, "a Ready timeout after the attach", lambda: time.monotonic() > deadline,
                       READY_TIMEOUT_SECONDS + 30)
    assert [m["metadata"]["name"] for m in machineset_machines(stack)] == [machine]
    assert condition(machine_of_node(stack, node), "HealthCheckSucceeded").get("status") == "True"
    assert not marked_unhealthy_events(stack)


def test_a_gpu_driver_restart_neither_remediates_the_machine_nor_attaches_a_gpu(stack: Stack) -> None:
    node, machine, held = end_pod(stack, "gpu-0")
    attached_before = gpus_attached_total(stack)

    set_node_gpus(stack, node, 0)  # the device plugin is restarting: the node shows no GPU
    restarted = time.monotonic()
    stack.core.create_namespaced_pod("demo", pod("gpu-1", memory_gib=8, gpus=1))  # the node's idle GPUs will serve it
    healthy_throughout(stack, f"the driver restart on {node} lasting {DRIVER_RESTART_SECONDS:g}s",
                       lambda: time.monotonic() - restarted > DRIVER_RESTART_SECONDS, DRIVER_RESTART_SECONDS + 30)
    assert not pods_running(stack, ["gpu-1"])
    assert gpus_attached_total(stack) == attached_before, "DDS attached a GPU while the node's GPUs were hidden"
    assert sorted(fabric_facts(stack).attached().get(node, [])) == held and fabric_facts(stack).attached_count() == 2

    set_node_gpus(stack, node, len(held))  # the device plugin is back
    healthy_throughout(stack, "gpu-1 Running", lambda: pods_running(stack, ["gpu-1"]), 60.0)
    assert node_of_pod(stack, "gpu-1") == node
    assert gpus_attached_total(stack) == attached_before, "DDS attached a GPU for a pod the node's own GPUs serve"
    assert sorted(fabric_facts(stack).attached().get(node, [])) == held and fabric_facts(stack).attached_count() == 2
    assert [m["metadata"]["name"] for m in machineset_machines(stack)] == [machine] and node_names(stack) == {node}
    assert not marked_unhealthy_events(stack)


def test_a_host_that_dies_is_remediated_and_ddss_hook_gets_its_gpus_back_first(stack: Stack, capsys: Any) -> None:
    node, name, held = end_pod(stack, "gpu-1")
    stranded_before = stack.dds.metrics().get("dds_gpus_stranded_total", 0.0) if stack.dds else 0.0

    stack.provider.fail_host(name)
    died = time.monotonic()
    deleting = stack.wait_for(f"Machine {name} remediated (deleted by its MachineSet)", lambda: [
        m for m in machineset_machines(stack) if m["metadata"]["name"] == name and m["metadata"].get(
            "deletionTimestamp")], READY_TIMEOUT_SECONDS + 60.0, lambda: f"{describe(stack)}; {health_status(stack)}",
        interval=0.2)[0]
    remediated_s = time.monotonic() - died
    assert remediated_s >= READY_TIMEOUT_SECONDS - 1, "remediated before the Ready=Unknown timeout"
    check, owner = condition(deleting, "HealthCheckSucceeded"), condition(deleting, "OwnerRemediated")
    assert (check.get("status"), check.get("reason")) == ("False", "UnhealthyNode"), check
    assert (owner.get("status"), owner.get("reason")) == ("False", "MachineDeleting"), owner
    assert any(name in e for e in marked_unhealthy_events(stack)), marked_unhealthy_events(stack)

    # Remediation is a Machine deletion like any other: drained, then held by DDS's hook until the GPUs are back.
    assert wait_for_host_removed(stack, name, node, PRE_TERMINATE_BOUND_SECONDS + 60.0) == [], \
        "the host went with GPUs attached"
    host_s = time.monotonic() - died
    stack.wait_for(f"Machine {name} gone", lambda: name not in {m["metadata"]["name"] for m in machines(stack)},
                   PRE_TERMINATE_BOUND_SECONDS + 60.0, lambda: describe(stack))
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)
    assert stack.dds is not None and stack.dds.metrics().get("dds_gpus_stranded_total", 0.0) == stranded_before

    stack.wait_for("the replacement Machine's node Ready with its boot GPU", lambda: [
        n for n in stack.nodes() if n.metadata.name != node and is_ready(n) and gpus_allocatable(n) == 1], TIMEOUT,
        lambda: describe(stack))
    replaced_s = time.monotonic() - died
    with capsys.disabled():
        print(f"\nCluster API {stack.cluster_api.version}, health check (Ready Unknown {READY_TIMEOUT_SECONDS}s): "
              f"host died -> Machine remediated {remediated_s:.1f}s -> its 2 GPUs back, host gone {host_s:.1f}s -> "
              f"replacement Ready with its boot GPU {replaced_s:.1f}s (provisioning delay {PROVISIONING_SECONDS:g}s)",
              flush=True)
    assert machineset_replicas(stack) == 1 and len(machineset_machines(stack)) == 1
    stack.wait_for("the pool whole: one boot GPU attached", lambda: pool_whole(stack, 1), 30.0,
                   lambda: str(fabric_facts(stack).attached()))
    stack.wait_for("the health check counting the replacement healthy", lambda: (
        health_status(stack).get("expectedMachines") == 1 and health_status(stack).get("currentHealthy") == 1),
        60.0, lambda: str(health_status(stack)))


# --- DRA mode: the driver restart as a node's ResourceSlice shows it ---

def dra_machineset(stack: Stack) -> dict[str, Any]:
    """A second group beside gpu-workers, of one node whose GPUs are DRA devices (node-local mode)."""
    obj = copy.deepcopy(machineset(replace(stack.options, workers=1, machineset_annotations={})))
    obj["metadata"]["name"] = DRA_MACHINESET
    obj["metadata"]["annotations"].update({ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value, ANN_CAPI_MIN: "1"})
    obj["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/set-name"] = DRA_MACHINESET
    obj["spec"]["template"]["metadata"]["labels"]["cluster.x-k8s.io/set-name"] = DRA_MACHINESET
    return obj


def dra_machines(stack: Stack) -> list[dict[str, Any]]:
    return [m for m in machines(stack)
            if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/set-name") == DRA_MACHINESET]


def slice_name(node: str) -> str:
    return f"{node}.{DRA_DRIVER}"


def slice_devices(stack: Stack, node: str) -> list[str]:
    """The device names of the node's ResourceSlice under DDS's driver (none: no slice)."""
    return sorted(d.name for s in client.ResourceV1Api(stack.api).list_resource_slice().items
                  if s.spec.driver == DRA_DRIVER and s.spec.node_name == node for d in s.spec.devices or ())


def dra_worker(stack: Stack) -> str:
    """The dra-workers node, once Ready with its boot GPU in its slice ("" before)."""
    nodes = {((m.get("status") or {}).get("nodeRef") or {}).get("name") for m in dra_machines(stack)}
    return next((n.metadata.name for n in stack.nodes() if n.metadata.name in nodes and is_ready(n)
                 and len(slice_devices(stack, n.metadata.name)) == 1), "")


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER}}]}}}


def claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    body = pod(name, memory_gib=2)
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return body


def test_a_gpu_driver_restart_in_dra_mode_neither_remediates_the_machine_nor_attaches_a_gpu(stack: Stack) -> None:
    custom, resource = client.CustomObjectsApi(stack.api), client.ResourceV1Api(stack.api)
    resource.create_device_class(yaml.safe_load(DEVICE_CLASS_FILE.read_text()))
    stack.add_node_group(dra_machineset(stack))
    node = stack.wait_for("a Ready dra-workers node with its boot GPU in its ResourceSlice", lambda: dra_worker(stack),
                          TIMEOUT, lambda: describe(stack))
    (machine,) = [m["metadata"]["name"] for m in dra_machines(stack)]
    custom.create_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE, "machinehealthchecks",
                                           health_check(stack, DRA_MACHINESET, DRA_HEALTH_CHECK))
    stack.wait_for("the dra-workers health check counting its Machine healthy", lambda: (
        health_status(stack, DRA_HEALTH_CHECK).get("expectedMachines") == 1
        and health_status(stack, DRA_HEALTH_CHECK).get("currentHealthy") == 1),
        60.0, lambda: str(health_status(stack, DRA_HEALTH_CHECK)))
    both = (HEALTH_CHECK, DRA_HEALTH_CHECK)
    held = sorted(fabric_facts(stack).attached()[node])
    published = slice_devices(stack, node)
    nodes_before, attached_before = node_names(stack), gpus_attached_total(stack)

    # The driver restarts, gone past the kubelet's wiping delay (30 s there, 12 s of it here): its slice is deleted and
    # nothing lists the GPU meanwhile.
    before = custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", slice_name(node))
    resource.delete_resource_slice(slice_name(node))
    restarted = time.monotonic()
    resource.create_namespaced_resource_claim(WORKLOAD_NAMESPACE, claim("restart-gpu"))
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, claim_pod("dra-1", "restart-gpu"))  # the idle GPU's to serve
    healthy_throughout(stack, f"the driver restart on {node} lasting {DRIVER_RESTART_SECONDS:g}s",
                       lambda: time.monotonic() - restarted > DRIVER_RESTART_SECONDS, DRIVER_RESTART_SECONDS + 30,
                       checks=both)
    assert not pods_running(stack, ["dra-1"])
    assert gpus_attached_total(stack) == attached_before, "DDS attached a GPU while the node's slice hid its GPU"
    assert sorted(fabric_facts(stack).attached().get(node, [])) == held and node_names(stack) == nodes_before

    # The driver is back: it lists the node's GPU again, the pool's next generation.
    spec = before["spec"]
    spec["pool"]["generation"] = int(spec["pool"].get("generation") or 0) + 1
    resource.create_resource_slice({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                    "metadata": {"name": slice_name(node),
                                                 "labels": before["metadata"].get("labels") or {}},
                                    "spec": spec})
    healthy_throughout(stack, "dra-1 Running", lambda: pods_running(stack, ["dra-1"]), 60.0, checks=both)
    assert node_of_pod(stack, "dra-1") == node and slice_devices(stack, node) == published
    assert gpus_attached_total(stack) == attached_before, "DDS attached a GPU for a claim the node's own GPU serves"
    assert sorted(fabric_facts(stack).attached().get(node, [])) == held and node_names(stack) == nodes_before
    assert [m["metadata"]["name"] for m in dra_machines(stack)] == [machine]
    assert condition(machine_of_node(stack, node), "HealthCheckSucceeded").get("status") == "True"
    # The gpu-workers Machine whose host died in the case before was marked; no dra-workers Machine ever was.
    assert not [e for e in marked_unhealthy_events(stack) if e.startswith(f"{DRA_MACHINESET}-")]
