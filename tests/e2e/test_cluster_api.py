"""DDS with the real cluster-autoscaler and Cluster API's own manager (v1.14, as shipped, harness/capi.py): the
MachineSet's Machines are made by Cluster API's controllers and their hosts by the kwok infrastructure provider
(harness/kwok_provider.py, the hardware's stand-in). In file order:
1. a pod that needs GPUs gets them attached to the live node of a real Machine, no node added;
2. a pod that needs a node gets one: CA's IncreaseSize, DDS raises the MachineSet's replicas, Cluster API makes the
   Machine, the provider the host, Cluster API sets its nodeRef;
3. the empty node goes: DDS marks the Machine it chose and lowers replicas; Cluster API deletes that Machine, its host
   and its Node; the host held no GPU when it went, and the pool is whole;
4. a Machine deleted by someone else while its node holds GPUs: Cluster API drains it and waits on DDS's pre-terminate
   hook with the GPUs still attached and the host up; DDS detaches them; only then the host goes; the pool is whole,
   and Cluster API replaces the Machine;
5. a MachineDeployment node group scaled up and down by CA: DDS raises the MachineDeployment's replicas, Cluster API's
   MachineDeployment and MachineSet controllers make the Machine; the empty node goes by the Machine DDS chose;
6. a Machine held by DDS's hook (its boot GPU detaching) while two pods each need a whole node: its replacement serves
   one, CA's scale-up (asked while the Machine is held) the other; no Machine more, every device counted once;
7. DDS SIGKILLed between marking the Machine CA's scale-down chose and lowering replicas: the restarted DDS releases
   the mark, CA asks again, and Cluster API deletes exactly that Machine;
8. a host that dies with its boot GPU attached, its Machine then deleted, the fabric unable to detach: DDS's hook holds
   the Machine for its bound only, then an Event, the GPU counted stranded, and the Machine, host and Node go.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds import crashpoints
from dds.controller.observe import machine_refs
from dds.kube.capi import DDS_PRE_TERMINATE_HOOK
from dds.model.groups import ANN_CAPI_DELETE_MACHINE
from harness.kwok_provider import infrastructure_ref
from harness.stack import Stack, StackOptions, cluster_api_machineset, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.cluster_facts import describe, fabric_facts, pods_running

pytestmark = pytest.mark.e2e

CAPI, V1BETA2, NAMESPACE, MACHINESET = "cluster.x-k8s.io", "v1beta2", "default", "gpu-workers"
POOL = 8
TIMEOUT = 180.0
NODE_IDLE_COOLDOWN_SECONDS = 20.0
DETACH_LATENCY = (8.0, 10.0)  # long enough to see Cluster API waiting on DDS's hook while a detach runs
PROVISIONING_SECONDS = 5.0
MACHINEDEPLOYMENT, INSTANCE_TYPE, MD_INSTANCE_TYPE = "gpu-deployment", "node.kubernetes.io/instance-type", "cdi-md"
MACHINESET_INSTANCE_TYPE = "cdi-16c64g"  # the example MachineSet's (manifests/examples)


def machines(stack: Stack) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(stack.api).list_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE,
                                                                             "machines")["items"]


def machineset_replicas(stack: Stack) -> int:
    return client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
        CAPI, V1BETA2, NAMESPACE, "machinesets", MACHINESET)["spec"]["replicas"]


def machine_of_node(stack: Stack, node: str) -> dict[str, Any]:
    (machine,) = [m for m in machines(stack) if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == node]
    return machine


def node_of_pod(stack: Stack, name: str) -> str:
    return next(p.spec.node_name for p in stack.pods() if p.metadata.name == name)


def node_names(stack: Stack) -> set[str]:
    return {n.metadata.name for n in stack.nodes()}


def pool_whole(stack: Stack, expected_attached: int) -> bool:
    return fabric_facts(stack).attached_count() == expected_attached


def wait_for_host_removed(stack: Stack, host: str, node: str, timeout: float) -> list[str]:
    """Wait until the provider has removed `host`; return what the fabric had attached to `node` at the first look
    after (a host removed with devices attached leaves them attached to a node that is gone)."""
    seen: list[list[str]] = []

    def removed() -> bool:
        attached = fabric_facts(stack).attached().get(node, [])
        if host in stack.provider.removed_hosts:
            seen.append(attached)
            return True
        return False

    stack.wait_for(f"host {host} removed", removed, timeout, lambda: describe(stack), interval=0.2)
    return seen[0]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    options = StackOptions(workers=1, pool_size=POOL, attach_latency=(2.0, 3.0),
                           detach_latency=DETACH_LATENCY, node_provisioning_seconds=PROVISIONING_SECONDS,
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=NODE_IDLE_COOLDOWN_SECONDS)
    with start_stack(tmp_path_factory.mktemp("cluster-api"), options) as started:
        started.wait_for("a Ready worker of a real Machine with its boot GPU",
                         lambda: [n for n in started.nodes() if is_ready(n) and gpus_allocatable(n) == 1]
                         and len([m for m in machines(started) if (m.get("status") or {}).get("nodeRef")]) == 1,
                         TIMEOUT, lambda: describe(started))
        assert started.cluster_api.running()
        yield started


def test_a_gpu_pod_gets_gpus_attached_to_a_real_machines_node(stack: Stack) -> None:
    before = node_names(stack)
    stack.core.create_namespaced_pod("demo", pod("gpu-0", memory_gib=8, gpus=2))
    stack.wait_for("gpu-0 Running", lambda: pods_running(stack, ["gpu-0"]), TIMEOUT, lambda: describe(stack))
    node = node_of_pod(stack, "gpu-0")
    assert node in before and node_names(stack) == before, "a node was added for a pod one attach serves"
    assert gpus_allocatable(stack.core.read_node(node)) == 2
    assert machineset_replicas(stack) == 1
    # Its node holds fabric devices: DDS's pre-terminate hook is on its Machine.
    stack.wait_for(f"DDS's pre-terminate hook on {node}'s Machine", lambda: DDS_PRE_TERMINATE_HOOK in (
        machine_of_node(stack, node)["metadata"].get("annotations") or {}), 30.0)


def test_a_pod_that_needs_a_node_gets_one_through_a_real_machine(stack: Stack) -> None:
    before = node_names(stack)
    stack.core.create_namespaced_pod("demo", pod("mem-0", memory_gib=60))  # the worker has 56 GiB left
    stack.wait_for("mem-0 Running on a new node", lambda: pods_running(stack, ["mem-0"]), TIMEOUT,
                   lambda: f"{describe(stack)}; CA log {stack.autoscaler.log_path}")
    node = node_of_pod(stack, "mem-0")
    assert node not in before
    # The pod may land on the host before Cluster API has set its Machine's nodeRef (it polls the workload cluster).
    machine = stack.wait_for(f"a Machine's nodeRef naming {node}", lambda: [
        m for m in machines(stack) if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == node], 60.0)[0]
    assert machine["spec"]["providerID"] == stack.core.read_node(node).spec.provider_id
    assert [o["name"] for o in machine["metadata"]["ownerReferences"] if o["kind"] == "MachineSet"] == [MACHINESET]
    assert machineset_replicas(stack) == 2
    assert {m.group_id for m in machine_refs(machines(stack))} == {f"MachineSet/{NAMESPACE}/{MACHINESET}"}


def test_the_empty_node_goes_by_the_machine_dds_chose(stack: Stack) -> None:
    node = node_of_pod(stack, "mem-0")
    machine = machine_of_node(stack, node)["metadata"]["name"]
    kept = {m["metadata"]["name"] for m in machines(stack)} - {machine}
    attached_elsewhere = sum(gpus_allocatable(n) for n in stack.nodes() if n.metadata.name != node)
    stack.core.delete_namespaced_pod("mem-0", "demo", grace_period_seconds=0)

    assert wait_for_host_removed(stack, machine, node, NODE_IDLE_COOLDOWN_SECONDS + TIMEOUT) == [], \
        "the host went with GPUs attached"
    stack.wait_for(f"Machine {machine} gone", lambda: machine not in {m["metadata"]["name"] for m in machines(stack)},
                   TIMEOUT, lambda: describe(stack))
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)

    assert {m["metadata"]["name"] for m in machines(stack)} == kept, "Cluster API deleted another Machine"
    assert machineset_replicas(stack) == 1
    stack.wait_for("the pool whole", lambda: pool_whole(stack, attached_elsewhere), 30.0,
                   lambda: str(fabric_facts(stack).attached()))
    removing = [e for e in stack.core.list_namespaced_event(NAMESPACE).items
                if e.reason == "RemovingNode" and e.source and e.source.component == "dds"]
    assert any(node in (e.message or "") for e in removing), [e.message for e in removing]


def test_a_machine_deleted_by_someone_else_waits_on_ddss_hook_until_its_gpus_are_back(stack: Stack,
                                                                                      capsys: Any) -> None:
    node = node_of_pod(stack, "gpu-0")
    machine = machine_of_node(stack, node)["metadata"]["name"]
    held = gpus_allocatable(stack.core.read_node(node))
    assert held == 2
    custom = client.CustomObjectsApi(stack.api)
    # Its pod ends first, so Cluster API's drain is quick: its GPUs, idle now, stay attached (GPU idle cooldown 10 min)
    # until the Machine's deletion makes DDS release them, which then runs while Cluster API waits on the hook.
    stack.core.delete_namespaced_pod("gpu-0", "demo", grace_period_seconds=0)
    stack.wait_for("gpu-0 gone", lambda: "gpu-0" not in {p.metadata.name for p in stack.pods()}, 60.0)

    deleted = time.monotonic()
    custom.delete_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE, "machines", machine)  # a user, a health check

    def waiting_with_gpus() -> bool:
        # The fabric's record, not the Node's allocatable (DDS shows 0 there as soon as a detach starts).
        ref = next((r for r in machine_refs(machines(stack)) if r.name == machine), None)
        return bool(ref and ref.awaiting_pre_terminate and machine in stack.provider.hosts
                    and fabric_facts(stack).attached().get(node))

    stack.wait_for(f"Machine {machine} drained and held by DDS's hook with its GPUs attached and its host up",
                   waiting_with_gpus, 60.0, lambda: describe(stack), interval=0.2)
    held_s = time.monotonic() - deleted
    assert wait_for_host_removed(stack, machine, node, TIMEOUT) == [], "the host went with GPUs attached"
    host_s = time.monotonic() - deleted
    stack.wait_for(f"Machine {machine} gone", lambda: machine not in {m["metadata"]["name"] for m in machines(stack)},
                   TIMEOUT, lambda: describe(stack))
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)
    gone_s = time.monotonic() - deleted
    with capsys.disabled():
        print(f"\nCluster API {stack.cluster_api.version}, removal of a node holding {held} GPUs: Machine deleted -> "
              f"drained and held by DDS's hook {held_s:.1f}s -> GPUs detached, host gone {host_s:.1f}s -> Machine "
              f"and Node gone {gone_s:.1f}s (fabric detach {DETACH_LATENCY[0]:g}-{DETACH_LATENCY[1]:g}s)", flush=True)
    # The replacement Cluster API makes gets its boot GPU from the pool the detach refilled.
    started = time.monotonic()
    stack.wait_for("a replacement Machine's node Ready with its boot GPU", lambda: [
        n for n in stack.nodes() if n.metadata.name != node and is_ready(n) and gpus_allocatable(n) == 1], TIMEOUT,
        lambda: describe(stack))
    assert machineset_replicas(stack) == 1
    stack.wait_for("the pool whole", lambda: pool_whole(stack, 1), 30.0,
                   lambda: f"{fabric_facts(stack).attached()} after {time.monotonic() - started:.0f}s")


# --- a MachineDeployment node group, scaled by CA through DDS; Cluster API's MachineDeployment and MachineSet
# controllers make and delete its Machines ---

def machinedeployment(stack: Stack) -> dict[str, Any]:
    """The example group as a MachineDeployment of its own hosts (instance type MD_INSTANCE_TYPE), 0 to 2 nodes: a pod
    selecting that instance type fits only this group, so CA's choice among the groups is not left to its expander."""
    obj = cluster_api_machineset(stack.options)
    obj["kind"], obj["metadata"]["name"] = "MachineDeployment", MACHINEDEPLOYMENT
    obj["spec"]["replicas"] = 0
    labels = {"cluster.x-k8s.io/cluster-name": obj["spec"]["clusterName"],
              "cluster.x-k8s.io/deployment-name": MACHINEDEPLOYMENT}
    obj["spec"]["selector"] = {"matchLabels": labels}
    obj["spec"]["template"]["metadata"]["labels"] = labels
    obj["spec"]["template"]["spec"]["infrastructureRef"] = infrastructure_ref(MACHINEDEPLOYMENT)
    annotations = obj["metadata"]["annotations"]
    annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"] = "0"
    annotations["cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"] = "2"
    annotations["capacity.cluster-autoscaler.kubernetes.io/labels"] = f"{INSTANCE_TYPE}={MD_INSTANCE_TYPE}"
    return obj


def deployment_replicas(stack: Stack) -> tuple[int, list[int]]:
    """The MachineDeployment's replicas and those of the MachineSets it owns."""
    custom = client.CustomObjectsApi(stack.api)
    deployment = custom.get_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE, "machinedeployments", MACHINEDEPLOYMENT)
    owned = [s["spec"]["replicas"] for s in custom.list_namespaced_custom_object(
        CAPI, V1BETA2, NAMESPACE, "machinesets")["items"]
        if any(o["kind"] == "MachineDeployment" for o in s["metadata"].get("ownerReferences") or ())]
    return deployment["spec"]["replicas"], owned


def test_a_machinedeployment_group_is_scaled_up_and_down_by_the_real_ca(stack: Stack, capsys: Any) -> None:
    stack.add_node_group(machinedeployment(stack), "machinedeployments")
    group = f"MachineDeployment/{NAMESPACE}/{MACHINEDEPLOYMENT}"
    manifest = pod("md-0", memory_gib=8)
    manifest["spec"]["nodeSelector"] = {INSTANCE_TYPE: MD_INSTANCE_TYPE}
    created = time.monotonic()
    stack.core.create_namespaced_pod("demo", manifest)

    stack.wait_for("md-0 Running on a node of the MachineDeployment", lambda: pods_running(stack, ["md-0"]), TIMEOUT,
                   lambda: f"{describe(stack)}; CA log {stack.autoscaler.log_path}")
    pending_to_running = time.monotonic() - created
    node = node_of_pod(stack, "md-0")
    machine = stack.wait_for(f"a Machine's nodeRef naming {node}", lambda: [
        m for m in machines(stack) if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == node], 60.0)[0]
    assert [r.group_id for r in machine_refs([machine])] == [group]
    assert deployment_replicas(stack) == (1, [1]), "DDS scales the MachineDeployment, its controller the MachineSet"
    name = machine["metadata"]["name"]
    others = {m["metadata"]["name"] for m in machines(stack)} - {name}

    stack.core.delete_namespaced_pod("md-0", "demo", grace_period_seconds=0)
    emptied = time.monotonic()
    assert wait_for_host_removed(stack, name, node, NODE_IDLE_COOLDOWN_SECONDS + TIMEOUT) == [], \
        "the host went with GPUs attached"
    stack.wait_for(f"Machine {name} gone", lambda: name not in {m["metadata"]["name"] for m in machines(stack)},
                   TIMEOUT, lambda: describe(stack))
    removed = time.monotonic() - emptied
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)
    assert {m["metadata"]["name"] for m in machines(stack)} == others, "Cluster API deleted another Machine"
    assert deployment_replicas(stack) == (0, [0])
    stack.wait_for("the pool whole", lambda: pool_whole(stack, 1), 30.0, lambda: str(fabric_facts(stack).attached()))
    with capsys.disabled():
        print(f"\nCluster API {stack.cluster_api.version}, MachineDeployment group: a pod needing a node Pending -> "
              f"Running in {pending_to_running:.1f}s (provisioning delay {PROVISIONING_SECONDS:g}s); its node emptied "
              f"-> Machine gone in {removed:.1f}s (node idle cooldown {NODE_IDLE_COOLDOWN_SECONDS:g}s)", flush=True)



# --- a Machine held by DDS's pre-terminate hook while CA asks for more nodes ---

def machineset_machines(stack: Stack) -> list[dict[str, Any]]:
    return [m for m in machines(stack) if any(o["kind"] == "MachineSet" and o["name"] == MACHINESET
                                              for o in m["metadata"].get("ownerReferences") or ())]


def test_a_machine_held_by_ddss_hook_while_ca_asks_for_more_nodes_is_not_counted_twice(stack: Stack) -> None:
    (machine,) = machineset_machines(stack)
    held, node = machine["metadata"]["name"], machine["status"]["nodeRef"]["name"]
    stack.wait_for(f"DDS's pre-terminate hook on {held} (its node holds its boot GPU)", lambda: DDS_PRE_TERMINATE_HOOK
                   in (machine_of_node(stack, node)["metadata"].get("annotations") or {}), 30.0)
    client.CustomObjectsApi(stack.api).delete_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE, "machines", held)
    stack.wait_for(f"Machine {held} held by DDS's hook", lambda: any(
        r.name == held and r.awaiting_pre_terminate for r in machine_refs(machines(stack))), 60.0, interval=0.2)
    # Two pods of a whole node each while the held Machine is still there: its replacement (replicas unchanged) serves
    # one, CA asks for one more node for the other.
    names = ["whole-0", "whole-1"]
    for name in names:
        manifest = pod(name, memory_gib=60)
        manifest["spec"]["nodeSelector"] = {INSTANCE_TYPE: MACHINESET_INSTANCE_TYPE}  # not the MachineDeployment's
        stack.core.create_namespaced_pod("demo", manifest)
    seen: set[str] = set()
    raised_while_held: list[bool] = []

    def served() -> bool:
        current = machineset_machines(stack)
        seen.update(m["metadata"]["name"] for m in current)
        if machineset_replicas(stack) == 2 and not raised_while_held:
            raised_while_held.append(held in {m["metadata"]["name"] for m in current})
        return pods_running(stack, names)

    stack.wait_for(f"{names} Running", served, TIMEOUT,
                   lambda: f"{describe(stack)}; CA log {stack.autoscaler.log_path}", interval=0.2)
    assert raised_while_held == [True], "CA's scale-up did not come while the Machine was held"
    stack.wait_for(f"Machine {held} gone", lambda: held not in {m["metadata"]["name"] for m in machines(stack)},
                   TIMEOUT, lambda: describe(stack))
    hosts = {node_of_pod(stack, name) for name in names}
    assert len(hosts) == 2 and node not in hosts
    live = {m["metadata"]["name"] for m in machineset_machines(stack)}
    assert machineset_replicas(stack) == len(live) == 2
    assert seen - {held} == live, f"a Machine made and deleted on the way: {sorted(seen - {held} - live)}"
    # The pool adds up: every device once, the held node's boot GPU back, one boot GPU per live node.
    assert len({d["id"] for d in fabric_facts(stack).devices}) == POOL
    stack.wait_for("a boot GPU on each live node and none elsewhere",
                   lambda: set(fabric_facts(stack).attached()) == hosts and fabric_facts(stack).attached_count() == 2,
                   60.0, lambda: str(fabric_facts(stack).attached()))


# --- DDS SIGKILLed between the mark and the replica write (crashpoint nodes.remove.marked, dds/crashpoints.py) ---

def marked(stack: Stack) -> set[str]:
    return {m["metadata"]["name"] for m in machineset_machines(stack)
            if ANN_CAPI_DELETE_MACHINE in (m["metadata"].get("annotations") or {})}


def test_dds_killed_between_the_mark_and_the_replica_write_leaves_one_machine_deleted_the_one_it_chose(
        stack: Stack) -> None:
    stack.restart_dds(env={crashpoints.ENV: "nodes.remove.marked"})
    node = node_of_pod(stack, "whole-1")
    chosen = machine_of_node(stack, node)["metadata"]["name"]
    kept = {m["metadata"]["name"] for m in machineset_machines(stack)} - {chosen}
    removed_before = len(stack.provider.removed_hosts)
    stack.core.delete_namespaced_pod("whole-1", "demo", grace_period_seconds=0)  # CA's scale-down takes the empty node

    deadline = time.monotonic() + NODE_IDLE_COOLDOWN_SECONDS + TIMEOUT
    while stack.dds.running and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stack.dds.running, f"DDS did not reach nodes.remove.marked; {describe(stack)}"
    assert f"{crashpoints.LOG_MARKER} nodes.remove.marked" in stack.dds.log_path.read_text(errors="replace")
    assert marked(stack) == {chosen} and machineset_replicas(stack) == 2, "the crash left no mark, or lowered replicas"

    stack.dds = stack.start_dds()  # released at start (no removal recorded for it); CA asks again
    stack.wait_for(f"Machine {chosen} gone", lambda: chosen not in {m["metadata"]["name"] for m in machines(stack)},
                   NODE_IDLE_COOLDOWN_SECONDS + TIMEOUT, lambda: f"{describe(stack)}; marked {marked(stack)}")
    assert {m["metadata"]["name"] for m in machineset_machines(stack)} == kept, "Cluster API deleted another Machine"
    assert stack.provider.removed_hosts[removed_before:] == [chosen]
    assert machineset_replicas(stack) == 1 and not marked(stack)
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)
    stack.wait_for("the pool whole", lambda: pool_whole(stack, 1), 30.0, lambda: str(fabric_facts(stack).attached()))


# --- a host that dies with GPUs attached: the fabric cannot detach from it within DDS's bound ---

PRE_TERMINATE_BOUND_SECONDS = 12.0


def test_a_host_that_dies_with_gpus_attached_holds_its_machine_only_for_ddss_bound(stack: Stack) -> None:
    # The fabric refuses every detach from now on (a dead host's GPU cannot be drained), DDS's bound short.
    config = stack.write_dds_config("dds-dead-host.yaml", stack.grpc_port,
                                    pre_terminate_detach_timeout_seconds=PRE_TERMINATE_BOUND_SECONDS,
                                    simulated_fabric={"faults": {"detach_error": 1.0}})
    stack.dds.stop()
    stack.dds = stack.start_dds(config_path=config)
    stack.core.delete_namespaced_pod("whole-0", "demo", grace_period_seconds=0)
    (machine,) = machineset_machines(stack)
    name, node = machine["metadata"]["name"], machine["status"]["nodeRef"]["name"]
    devices = sorted(fabric_facts(stack).attached()[node])
    stranded_before = stack.dds.metrics().get("dds_gpus_stranded_total", 0.0)

    stack.provider.fail_host(name)
    deleted = time.monotonic()
    client.CustomObjectsApi(stack.api).delete_namespaced_custom_object(CAPI, V1BETA2, NAMESPACE, "machines", name)

    stack.wait_for(f"Machine {name} gone", lambda: name not in {m["metadata"]["name"] for m in machines(stack)},
                   PRE_TERMINATE_BOUND_SECONDS + 60.0, lambda: describe(stack))
    assert time.monotonic() - deleted >= PRE_TERMINATE_BOUND_SECONDS, "the hook went before DDS's bound"
    assert name in stack.provider.removed_hosts
    events = [e for e in stack.core.list_event_for_all_namespaces().items if e.reason == "PreTerminateDetachTimedOut"]
    assert any(name in (e.message or "") and e.involved_object.name == node for e in events), \
        [(e.involved_object.name, e.message) for e in events]
    # Stranded, as DDS counts them: still the fabric's record for the node that is gone, and in the metric.
    facts = fabric_facts(stack)
    assert sorted(facts.attached().get(node, [])) == devices and len({d["id"] for d in facts.devices}) == POOL
    assert stack.dds.metrics()["dds_gpus_stranded_total"] - stranded_before == len(devices)
    stack.wait_for(f"Node {node} deleted by Cluster API", lambda: node not in node_names(stack), 60.0)
