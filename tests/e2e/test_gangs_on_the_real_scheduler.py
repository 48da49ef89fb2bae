"""Gangs on the real kube-scheduler with the gang feature gates on (GenericWorkload, GangScheduling), DDS and the real
cluster-autoscaler, on the Workload API the control plane serves: on Kubernetes 1.35 scheduling.k8s.io/v1alpha1
(pods name a Workload's pod group in `spec.workloadRef`), on 1.36 scheduling.k8s.io/v1alpha2 (pods name a PodGroup
object in `spec.schedulingGroup`). The Kubernetes profile of the run (harness/versions.py, DDS_K8S_PROFILE) decides.

kube-scheduler's GangScheduling plugin holds a gang's pods at Permit until `minCount` of them have a node; DDS
must get the capacity for all of them, or none. Two workers (4 GPU slots each, one A30 at boot), a pool of 8 A30s:
8 GPUs in all. In file order:
1. a gang of 5 x 2 GPUs (10 > 8) gets no attach, and its pods are told why;
2. a coscheduling PodGroup's minMember is read from the cluster (its CRD is installed before DDS starts, so DDS
   watches it): 2 of its 3 members attach nothing;
3. a gang of 4 x 2 GPUs gets all 8 GPUs, and no pod runs before all 8 are there;
4. with 2 of the 8 GPUs busy, a gang of 2 x 4 GPUs (8: no more than the cluster has, more than the 6 free) needs two
   new nodes the pool can equip only one of: the real cluster-autoscaler asks for them, and DDS adds no node and
   attaches nothing (all or nothing after the cut to what the pool can equip), tells each member why, and refuses the
   scale-up so that CA backs the group off;
5. with one attach failing in the fabric, what was attached for the gang is detached (GangRolledBack), and the gang
   is then served whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dds.planner.gangs import GANG_INCOMPLETE, GANG_LARGER_THAN_CLUSTER
from dds.model.snapshot import POD_GROUP_LABEL
from harness import versions
from harness.stack import Stack, StackOptions, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.cluster_facts import GROUP, dds_events, describe, fabric_facts, log_lines, machineset_replicas, \
    pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 120.0
COOLDOWN = 15.0
NAMESPACE = "demo"
CRDS = Path(__file__).parent / "crds" / "coscheduling"
GANG_GATES = {"GenericWorkload": True, "GangScheduling": True}
# The Workload API version the run's control plane serves: 1.36 replaced v1alpha1 (spec.workloadRef) by v1alpha2
# (spec.schedulingGroup naming a PodGroup object) and serves v1alpha1 no more.
WORKLOAD_API = "v1alpha2" if versions.active_profile().at_least(1, 36) else "v1alpha1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=8, attach_latency=(3.0, 4.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=COOLDOWN,
                           node_idle_cooldown_seconds=600.0, feature_gates=GANG_GATES,
                           runtime_config=(f"scheduling.k8s.io/{WORKLOAD_API}=true",),
                           dds_settings={"gang_start_timeout_seconds": 60.0})
    with start_stack(tmp_path_factory.mktemp("gangs"), options) as stack:
        stack.control_plane.install_crds([CRDS])
        # DDS finds the gang kinds served when it starts and watches them: restarted, it watches the coscheduling
        # PodGroups too (a kind installed while it runs is listed per decision instead; tests/unit/kube).
        stack.restart_dds(kill=False)
        stack.wait_for("two Ready workers with their boot GPU", lambda: len(
            [n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) >= 1]) == 2, TIMEOUT,
            lambda: describe(stack))
        yield stack


def custom(stack: Stack) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(stack.api)


def create_workload(stack: Stack, name: str, min_count: int) -> None:
    """A Workload whose pod group "workers" has the gang policy; on v1alpha2 also the PodGroup its pods name (the
    Workload is then only the template: kube-scheduler, and DDS, read the PodGroup)."""
    gang = {"gang": {"minCount": min_count}}
    api = custom(stack)
    if WORKLOAD_API == "v1alpha1":
        body = {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload", "metadata": {"name": name},
                "spec": {"podGroups": [{"name": "workers", "policy": gang}]}}
        api.create_namespaced_custom_object("scheduling.k8s.io", "v1alpha1", NAMESPACE, "workloads", body)
        return
    workload = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload", "metadata": {"name": name},
                "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": gang}]}}
    api.create_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", NAMESPACE, "workloads", workload)
    group = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": {"name": f"{name}-workers"},
             "spec": {"podGroupTemplateRef": {"workload": {"workloadName": name, "podGroupTemplateName": "workers"}},
                      "schedulingPolicy": gang}}
    api.create_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", NAMESPACE, "podgroups", group)


def create_raw_pod(stack: Stack, body: dict[str, Any]) -> None:
    """POST the pod as JSON: this kubernetes client's models know no `spec.workloadRef` (1.35 only) and drop it."""
    method, url, headers, payload, _ = stack.api.param_serialize(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body, auth_settings=["BearerToken"],
        header_params={"Content-Type": "application/json", "Accept": "application/json"})
    response = stack.api.call_api(method, url, header_params=headers, body=payload).response
    assert response.status == 201, response.data.decode(errors="replace")[:500]


def create_gang(stack: Stack, workload: str, members: int, gpus: int) -> list[str]:
    """A Workload with one gang pod group of `members`, and its pods (`gpus` GPUs each)."""
    create_workload(stack, workload, members)
    names = [f"{workload}-{i}" for i in range(members)]
    for name in names:
        body = pod(name, memory_gib=4, gpus=gpus)
        if WORKLOAD_API == "v1alpha1":
            body["spec"]["workloadRef"] = {"name": workload, "podGroup": "workers"}
        else:
            body["spec"]["schedulingGroup"] = {"podGroupName": f"{workload}-workers"}
        create_raw_pod(stack, body)
    return names


def delete_pods(stack: Stack, names: list[str]) -> None:
    for name in names:
        stack.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    stack.wait_for("the pods gone", lambda: not {p.metadata.name for p in stack.pods()} & set(names), TIMEOUT,
                   lambda: describe(stack))


def worker_gpus(stack: Stack) -> int:
    return sum(gpus_allocatable(n) for n in stack.nodes())


def attaches_for(stack: Stack, names: list[str]) -> list[Any]:
    involved = {f"pod/{n}" for n in names}
    return [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved in involved]


def events_for(stack: Stack, names: list[str], reason: str) -> set[str]:
    return {e.involved.split("/", 1)[1] for e in dds_events(stack) if e.reason == reason}.intersection(names)


def test_a_gang_larger_than_every_gpu_attaches_nothing_and_its_pods_are_told_why(stack: Stack):
    names = create_gang(stack, "too-big", members=5, gpus=2)
    stack.wait_for("every member told it is larger than the cluster's GPUs",
                   lambda: events_for(stack, names, GANG_LARGER_THAN_CLUSTER) == set(names), TIMEOUT,
                   lambda: describe(stack))
    message = next(e.message for e in dds_events(stack) if e.reason == GANG_LARGER_THAN_CLUSTER)
    assert "needs 10 GPU(s)" in message and "the 8 GPU(s) the cluster has in all" in message, message
    assert attaches_for(stack, names) == []
    assert fabric_facts(stack).running("attach") == []
    delete_pods(stack, names)


def test_a_coscheduling_podgroups_min_member_is_read_from_the_cluster(stack: Stack):
    custom(stack).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", NAMESPACE, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "ddp"},
         "spec": {"minMember": 3}})
    first = ["ddp-0", "ddp-1"]
    for name in first:
        body = pod(name, memory_gib=4, gpus=3)  # 3 GPUs: more than a worker's boot GPU, so each needs an attach
        body["metadata"]["labels"][POD_GROUP_LABEL] = "ddp"
        stack.core.create_namespaced_pod(NAMESPACE, body)
    # Unschedulable, past the fast path's debounce for several loop passes: with minMember unknown the two would be
    # the whole gang and get their GPUs; with minMember 3 read from the PodGroup they are a gang short of a member.
    stack.wait_for("both members unschedulable", lambda: all(
        any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or ())
        for p in stack.pods() if p.metadata.name in first), TIMEOUT, lambda: describe(stack))
    time.sleep(6.0)
    assert attaches_for(stack, first) == [], describe(stack)
    body = pod("ddp-2", memory_gib=4, gpus=1)
    body["metadata"]["labels"][POD_GROUP_LABEL] = "ddp"
    stack.core.create_namespaced_pod(NAMESPACE, body)
    stack.wait_for("the three members Running once the gang is whole",
                   lambda: pods_running(stack, first + ["ddp-2"]), TIMEOUT, lambda: describe(stack))
    delete_pods(stack, first + ["ddp-2"])


def running_members(stack: Stack, names: list[str]) -> int:
    return sum(1 for p in stack.pods() if p.metadata.name in names and p.status.phase == "Running")


def gpus_and_running(stack: Stack, names: list[str]) -> tuple[int, int]:
    """(GPUs on the workers, members running), read in the order that cannot see a violation that is not there: the
    members first, then the GPUs. GPUs only arrive while members wait at Permit and none go while members run, so GPUs
    read after the members are at least those the members had; read the other way round, GPUs arriving between the
    two reads (and the gang bound at once) would look like members running on part of them."""
    running = running_members(stack, names)
    return worker_gpus(stack), running


def test_a_gang_of_four_starts_only_when_all_eight_gpus_are_attached(stack: Stack):
    stack.wait_for("the idle GPUs back in the pool", lambda: worker_gpus(stack) == 0, TIMEOUT,
                   lambda: describe(stack))
    names = create_gang(stack, "ddp4", members=4, gpus=2)
    seen: list[tuple[int, int]] = []  # (GPUs on the workers, members running), at every look

    def all_running() -> bool:
        seen.append(gpus_and_running(stack, names))
        return seen[-1][1] == len(names)

    stack.wait_for("the gang Running", all_running, TIMEOUT, lambda: describe(stack), interval=0.2)
    early = [(gpus, running) for gpus, running in seen if running and gpus < 8]
    assert early == [], f"members ran before the 8 GPUs were attached: {early}"
    assert any(gpus < 8 for gpus, _ in seen), "the GPUs were watched arriving"
    assert len(attaches_for(stack, names)) >= 2  # both workers got GPUs for the gang
    delete_pods(stack, names)


def ca_backoffs(stack: Stack) -> list[str]:
    """cluster-autoscaler's log lines saying it backs the group off after a failed scale-up."""
    return [line for line in log_lines(stack.autoscaler.log_path, "Disabling scale-up for node group") if GROUP in line]


def test_a_gang_the_free_pool_cannot_equip_gets_no_node_and_no_gpu_and_ca_backs_off(stack: Stack):
    stack.wait_for("the idle GPUs back in the pool", lambda: worker_gpus(stack) == 0, TIMEOUT,
                   lambda: describe(stack))
    busy = ["busy-0", "busy-1"]
    for name in busy:  # 40 of a worker's 64 GiB: one on each worker
        stack.core.create_namespaced_pod(NAMESPACE, pod(name, memory_gib=40, gpus=1))
    stack.wait_for("a busy GPU on each worker", lambda: pods_running(stack, busy), TIMEOUT, lambda: describe(stack))
    nodes_before, gpus_before = len(stack.nodes()), worker_gpus(stack)
    backoffs_before = len(ca_backoffs(stack))
    # 2 x 4 GPUs: no worker has 4 free slots (1 busy of 4), so each member needs a new node of 1 boot + 3 attached
    # GPUs from the pool; its 6 free A30s equip one. Before the all-or-nothing check after that cut, DDS added the one
    # node for half of the gang, and CA's other unit failed OutOfResources.
    names = create_gang(stack, "halfpool", members=2, gpus=4)
    stack.wait_for("every member told its gang cannot be served whole",
                   lambda: events_for(stack, names, GANG_INCOMPLETE) == set(names), TIMEOUT, lambda: describe(stack))
    told = next(e.message for e in dds_events(stack) if e.reason == GANG_INCOMPLETE and e.involved == f"pod/{names[0]}")
    assert "the new nodes it needs cannot be equipped" in told and "pool default has" in told, told
    stack.wait_for("cluster-autoscaler backing the group off", lambda: len(ca_backoffs(stack)) > backoffs_before,
                   TIMEOUT, lambda: describe(stack))
    deadline = time.monotonic() + 10.0  # a few loop passes and CA scan intervals more: still nothing
    while time.monotonic() < deadline:
        assert (len(stack.nodes()), machineset_replicas(stack)) == (nodes_before, nodes_before), describe(stack)
        assert worker_gpus(stack) == gpus_before, describe(stack)
        time.sleep(1.0)
    assert attaches_for(stack, names) == []
    members = {f"pod/{n}" for n in names}
    assert [e for e in dds_events(stack) if e.reason == "AddingNode" and e.involved in members] == []
    delete_pods(stack, names + busy)


def test_a_gang_whose_attach_fails_is_rolled_back_then_served_whole(stack: Stack):
    stack.wait_for("the idle GPUs back in the pool", lambda: worker_gpus(stack) == 0, TIMEOUT,
                   lambda: describe(stack))
    stack.config_path = stack.write_dds_config(
        "dds-faulty.yaml", stack.grpc_port,
        simulated_fabric={"faults": {"attach_error": 1.0, "max_faults": 1, "seed": 7}})
    stack.restart_dds(kill=False)
    names = create_gang(stack, "ddp-fault", members=4, gpus=2)
    # The retry after the rollback can serve the gang before a look sees the rollback's Events, so what is asserted
    # is what every look saw: no member ever ran while the gang's GPUs were partly there.
    seen: list[tuple[int, int]] = []  # (GPUs on the workers, members running)

    def look(done: Callable[[], bool]) -> Callable[[], bool]:
        def step() -> bool:
            seen.append(gpus_and_running(stack, names))
            return done()
        return step

    stack.wait_for("GangRolledBack told to every member",
                   look(lambda: events_for(stack, names, "GangRolledBack") == set(names)), TIMEOUT,
                   lambda: describe(stack), interval=0.2)
    rolled = next(e.message for e in dds_events(stack) if e.reason == "GangRolledBack")
    assert "the attach of 1 of its GPU set(s) failed" in rolled, rolled
    released = [e for e in dds_events(stack) if e.reason == "DetachingGPU" and "cannot start" in e.message]
    assert released, "the GPUs attached for the gang were detached"
    stack.wait_for("the gang Running after it was planned whole again", look(lambda: pods_running(stack, names)),
                   TIMEOUT, lambda: describe(stack), interval=0.2)
    early = [(gpus, running) for gpus, running in seen if running and gpus < 8]
    assert early == [], f"members ran while the gang's GPUs were partly attached: {early}"
    delete_pods(stack, names)
