"""DRA pool mode (device binding conditions) on the real kube-scheduler with the real autoscaler present.

DDS publishes the pool's free GPUs as slots that bind to a node (`bindsToNode`, binding condition
dds.cdi.dev/attached); kube-scheduler allocates one to a pod's claim, picks the node and waits in PreBind; DDS attaches
a GPU of the slot's model to that node and sets the condition; the pod is bound and runs. On Kubernetes 1.35 binding
conditions are alpha: the control plane enables `DRADeviceBindingConditions` on kube-apiserver, kube-scheduler and
kube-controller-manager. From 1.36 they are beta and on by default: no feature gate at all (`pool_mode_gates`), and
the binding condition is written under DDS's shipped RBAC, which 1.36 checks per driver (resourceclaims/driver). Pool
mode is the choice of the group gpu-workers (dds.cdi.dev/gpu-api: dra-pool, nodes booting with no GPU); a second group
drawing from the same pool, ext-workers (extended-resource), gets no slot: the slice's node selector names gpu-workers
only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.groups.labels import node_group_label_value
from dds.model.groups import ANN_GPU_API, LABEL_NODE_GROUP, GpuApi
from harness.stack import ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, is_ready, start_stack
from harness.versions import KubernetesProfile, active_profile
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts, pods_running
from tests.e2e.test_dra_node_local import DRIVER, claim_template, dra_pod, extended_machineset

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
POOL = "fabric-default"
# train-0, train-1 and big-0's slot, and one to spare: a dra-pool group's nodes boot with no GPU, so every GPU of the
# pool is a slot.
POOL_SIZE = 4
POOL_GROUP = "MachineSet/default/gpu-workers"


def pool_mode_gates(profile: KubernetesProfile) -> dict[str, bool]:
    """The feature gates pool mode needs: DRADeviceBindingConditions before 1.36 (alpha; DRAResourceClaimDeviceStatus,
    which it depends on, is beta and on since 1.33); none from 1.36, where it is beta and on by default."""
    return {} if profile.at_least(1, 36) else {"DRADeviceBindingConditions": True}


def pool_slices(stack: Stack) -> list[Any]:
    return [s for s in client.ResourceV1Api(stack.api).list_resource_slice().items
            if s.spec.driver == DRIVER and s.spec.pool.name == POOL]


def pool_slots(stack: Stack) -> list[Any]:
    return [d for s in pool_slices(stack) for d in s.spec.devices or ()]


def claim_of(stack: Stack, pod_name: str) -> Any:
    pod = stack.core.read_namespaced_pod(pod_name, WORKLOAD_NAMESPACE)
    (status,) = pod.status.resource_claim_statuses
    return client.ResourceV1Api(stack.api).read_namespaced_resource_claim(status.resource_claim_name,
                                                                         WORKLOAD_NAMESPACE)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=POOL_SIZE, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0),
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
                           controller_manager=True, feature_gates=pool_mode_gates(active_profile()),
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_POOL.value,
                                                   "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "0"})
    with start_stack(tmp_path_factory.mktemp("dra-pool-mode"), options) as stack:
        # No node: what matters is that the pool's slice is not placed on it (the group is served all the same).
        stack.add_node_group(extended_machineset(options, workers=0))
        resource = client.ResourceV1Api(stack.api)
        resource.create_device_class(yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
        resource.create_namespaced_resource_claim_template(WORKLOAD_NAMESPACE, claim_template("one-gpu"))
        # The workers boot with no GPU: every GPU of the pool is a free slot.
        stack.wait_for("two Ready workers and the pool's free slots",
                       lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2
                       and len(pool_slots(stack)) == POOL_SIZE,
                       TIMEOUT, lambda: f"{describe(stack)} | slots: {[d.name for d in pool_slots(stack)]}")
        yield stack


def test_the_pool_slots_go_to_the_pool_mode_group_only(stack: Stack) -> None:
    (pool_slice,) = pool_slices(stack)
    (term,) = pool_slice.spec.node_selector.node_selector_terms
    (requirement,) = term.match_expressions
    assert (requirement.key, requirement.operator) == (LABEL_NODE_GROUP, "In")
    assert requirement.values == [node_group_label_value(POOL_GROUP)]  # not ext-workers, which draws from it too


def test_the_scheduler_allocates_a_pool_slot_and_dds_attaches_it_before_binding(stack: Stack) -> None:
    before = fabric_facts(stack).attached()
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("train-0", "one-gpu"))
    stack.wait_for("train-0 Running", lambda: pods_running(stack, ["train-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slots: {[d.name for d in pool_slots(stack)]}")
    node = stack.core.read_namespaced_pod("train-0", WORKLOAD_NAMESPACE).spec.node_name
    claim = claim_of(stack, "train-0")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == POOL and result.binding_conditions == ["dds.cdi.dev/attached"]
    (device_status,) = claim.status.devices
    assert [(c.type, c.status) for c in device_status.conditions] == [("dds.cdi.dev/attached", "True")]
    attached = set(claim.metadata.annotations["dds.cdi.dev/fabric-devices"].split(","))
    after = fabric_facts(stack).attached()
    assert attached == set(after[node]) - set(before.get(node, [])) and len(attached) == 1
    assert [e for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/train-0"]
    # The attached GPU is no longer free: one slot fewer unallocated, the allocated one still listed. The slice is
    # rewritten after the claim's binding condition, which the pod's start need not wait for: between the attach and
    # that rewrite the slot is both promised and gone from the pool, so one slot fewer shows for a moment.
    stack.wait_for("the slice listing the allocated slot and the pool's free ones",
                   lambda: result.device in {d.name for d in pool_slots(stack)}
                   and len(pool_slots(stack)) == POOL_SIZE, TIMEOUT,
                   lambda: f"slots: {sorted(d.name for d in pool_slots(stack))}")


def test_a_failed_attach_sets_the_failure_condition_and_the_scheduler_allocates_again(stack: Stack) -> None:
    # The fabric fails the next attach, once; DDS restarts on that setting (the fabric's state survives it).
    stack.config_path = stack.write_dds_config(
        "dds-faulty.yaml", stack.grpc_port, simulated_fabric={"faults": {"attach_error": 1.0, "max_faults": 1}})
    stack.restart_dds(kill=False)
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("train-1", "one-gpu"))
    stack.wait_for("train-1 Running", lambda: pods_running(stack, ["train-1"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slots: {[d.name for d in pool_slots(stack)]}")
    log = stack.dds.log_path.read_text()
    assert "pool mode: attaching" in log and "failed" in log  # the failure condition was set, then a new allocation
    (device_status,) = claim_of(stack, "train-1").status.devices
    assert [(c.type, c.status) for c in device_status.conditions] == [("dds.cdi.dev/attached", "True")]


def test_a_pod_no_live_node_holds_gets_a_node_then_a_slot_bound_to_it(stack: Stack) -> None:
    workers = {n.metadata.name for n in stack.nodes()}
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("big-0", "one-gpu", memory="63Gi"))
    stack.wait_for("big-0 Running", lambda: pods_running(stack, ["big-0"]), TIMEOUT,
                   lambda: f"{describe(stack)} | slots: {[d.name for d in pool_slots(stack)]}")
    node = stack.core.read_namespaced_pod("big-0", WORKLOAD_NAMESPACE).spec.node_name
    assert node not in workers
    assert [e for e in dds_events(stack) if e.reason == "AddingNode" and e.involved == "pod/big-0"]
    (result,) = claim_of(stack, "big-0").status.allocation.devices.results
    assert result.pool == POOL
