"""Extended resources served by DRA (KEP-5004, beta and on in Kubernetes 1.36): a DeviceClass with
`extendedResourceName: nvidia.com/gpu` makes pods asking for nvidia.com/gpu plannable on a DRA group's nodes, which
show no nvidia.com/gpu capacity (kube-scheduler then allocates the class's devices and makes a claim for the pod)."""

from __future__ import annotations

from dataclasses import replace

from dds.kube.decode import device_class, pod_claims
from dds.planner import plan_scale_down, plan_scale_up
from dds.model.dra_devices import DRIVER, device_name
from dds.planner.dra import IMPLICIT_CLASS_PREFIX, extended_resource_classes, lower_claims
from dds.model.dra_records import AllocatedDeviceInfo, DeviceClassInfo, PodClaimRef
from dds.model.plan import Verdict
from dds.planner.refusals import NO_GROUP_FOR_API
from dds.model.groups import DEFAULT_GPU_RESOURCE, DRA_GPU_RESOURCE
from tests.unit.planner.builders import make_group, make_node, make_pod
from tests.unit.planner.test_dra import CLASS, GREEDY, claim, decision, dra_group, dra_node, snapshot_with

GPU = DEFAULT_GPU_RESOURCE  # nvidia.com/gpu
GPU_CLASS = replace(CLASS, extended_resource_name=GPU)


def with_classes(snapshot, *classes: DeviceClassInfo):
    return replace(snapshot, dra=replace(snapshot.dra, classes=tuple(classes)))


def test_the_class_and_the_scheduler_made_claim_are_decoded() -> None:
    cls = device_class({"metadata": {"name": DRIVER, "creationTimestamp": "2026-11-26T10:00:00Z"},
                        "spec": {"extendedResourceName": GPU}})
    assert cls.extended_resource_name == GPU and cls.created_at > 0
    (ref,) = pod_claims({"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": "train-extended-resources-x7k2p",
        "requestMappings": [{"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}]}}})
    assert ref == PodClaimRef("", generated_name="train-extended-resources-x7k2p", extended_resources=(GPU,))


def test_a_pod_asking_nvidia_gpu_is_planned_onto_a_dra_group_through_the_class() -> None:
    snapshot = with_classes(snapshot_with([make_pod("train", gpus=2)], nodes=[dra_node("w1", gpus=0)]), GPU_CLASS)
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    train = decision(plan, "train")
    assert train.verdict == Verdict.FITS_AFTER_GPUS and train.refusal is None
    assert [(a.node, a.count) for a in plan.attaches] == [("w1", 2)]
    lowered = next(p for p in lower_claims(snapshot).pods if p.name == "train")
    assert lowered.resource_claims == (PodClaimRef("extended-resources", "train-extended-resources"),)
    assert sum(c.requests.get(GPU) for c in lowered.containers) == 0  # no nvidia.com/gpu left to fit


def test_without_the_class_the_same_pod_has_no_group() -> None:
    snapshot = snapshot_with([make_pod("train", gpus=1)], nodes=[dra_node("w1", gpus=0)])  # CLASS maps nothing
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert plan.attaches == () and decision(plan, "train").refusal == NO_GROUP_FOR_API


def test_the_implicit_class_resource_name_is_served_too() -> None:
    pod = make_pod("train", extra={IMPLICIT_CLASS_PREFIX + CLASS.name: 1})
    plan = plan_scale_up(lower_claims(snapshot_with([pod], nodes=[dra_node("w1", gpus=0)])), GREEDY)
    assert [(a.node, a.count) for a in plan.attaches] == [("w1", 1)]


def test_an_extended_resource_group_showing_the_resource_keeps_its_pods() -> None:
    """Where a node has nvidia.com/gpu capacity, kube-scheduler uses it, not DRA: such pods stay extended-resource
    pods, planned onto the group that shows the resource."""
    groups = [make_group("ext", models=()), dra_group("gpu", models=())]
    assert extended_resource_classes([GPU_CLASS], {GPU}) == {IMPLICIT_CLASS_PREFIX + CLASS.name: CLASS.name}
    snapshot = with_classes(snapshot_with([make_pod("train", gpus=1)], groups=groups,
                                          nodes=[make_node("e1", gpus=0, group="ext"), dra_node("w1", gpus=0)]),
                            GPU_CLASS)
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [a.node for a in plan.attaches] == ["e1"]


def test_of_two_classes_naming_the_resource_the_later_one_serves() -> None:
    older = replace(GPU_CLASS, name="a-older", created_at=1.0)
    newer = replace(GPU_CLASS, name="b-newer", created_at=2.0)
    assert extended_resource_classes([newer, older])[GPU] == "b-newer"


def test_a_running_pods_scheduler_made_claim_holds_its_gpu() -> None:
    """On a DRA node a running nvidia.com/gpu pod's GPU is the device of the claim kube-scheduler made: in use, never
    detached as idle, and its nvidia.com/gpu request is not counted against the node (which shows none)."""
    node = replace(dra_node("w1", gpus=2), gpus_idle_since=0.0)
    running = replace(make_pod("train", gpus=1, node="w1"), resource_claims=(
        PodClaimRef("", generated_name="train-extended-resources-x7k2p", extended_resources=(GPU,)),))
    made = claim("train-extended-resources-x7k2p",
                 allocated=(AllocatedDeviceInfo("container-0-request-0", DRIVER, "w1", device_name("w1-gpu-1")),))
    snapshot = with_classes(snapshot_with([running], [made], nodes=[node]), GPU_CLASS)
    lowered = lower_claims(snapshot)
    pod = next(p for p in lowered.pods if p.name == "train")
    assert sum(c.requests.get(GPU) for c in pod.containers) == 0
    assert sum(c.requests.get(DRA_GPU_RESOURCE) for c in pod.containers) == 1
    assert [d.device_ids for d in plan_scale_down(lowered, GREEDY).detaches] == [("w1-gpu-0",)]
