"""One GPU API per node group (`dds.cdi.dev/gpu-api`): parsed with clear errors, shown to CA and on kwok nodes through
that API only, and routing pods: extended-resource pods onto extended-resource groups, claims onto DRA groups, a pod
no group of its API serves refused with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.config import Settings
from dds.controller.dra_binding import pool_mode_groups
from dds.groups.schema import GroupInput, parse_group
from dds.model.groups import (ANN_GPU_API, ANN_GPU_RESOURCE, DRA_GPU_RESOURCE, LABEL_ATTACHED_GPU, GpuApi,
                              SourceRef)
from harness.kwok_provider import node_capacity
from dds.planner import plan_scale_up
from dds.planner.dra import lower_claims
from dds.model.plan import Verdict
from dds.planner.refusals import NO_GROUP_FOR_API
from dds.provider.template import build_template_node
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool
from tests.unit.planner.test_dra import (GREEDY, claim, decision, dra_group, dra_node, dra_pod, held, snapshot_with)

CAP = "capacity.cluster-autoscaler.kubernetes.io/"
BASE = {"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "4", CAP + "cpu": "16", CAP + "memory": "64Gi",
        CAP + "gpu-type": "nvidia.com/gpu", "dds.cdi.dev/max-gpus-per-node": "4", "dds.cdi.dev/gpu-models": "A30"}


def parse(**annotations: str):
    return parse_group(GroupInput(id="MachineSet/default/gpus", annotations={**BASE, **annotations},
                                  source=SourceRef(kind="MachineSet", name="gpus", namespace="default")))


# --- the annotation -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, api, resource", [
    pytest.param(None, GpuApi.EXTENDED_RESOURCE, "nvidia.com/gpu", id="default-extended-resource"),
    pytest.param("extended-resource", GpuApi.EXTENDED_RESOURCE, "nvidia.com/gpu", id="extended-resource"),
    pytest.param("dra-node-local", GpuApi.DRA_NODE_LOCAL, DRA_GPU_RESOURCE, id="dra-node-local-ignores-gpu-type"),
    pytest.param("dra-pool", GpuApi.DRA_POOL, DRA_GPU_RESOURCE, id="dra-pool"),
])
def test_the_gpu_api_annotation_is_parsed(value, api, resource) -> None:
    spec, errors = parse(**({ANN_GPU_API: value} if value else {}))
    assert errors == () and (spec.gpu_api, spec.gpu_resource) == (api, resource)


@pytest.mark.parametrize("annotations, key, fragment", [
    pytest.param({ANN_GPU_API: "dra"}, ANN_GPU_API,
                 "'dra' is not a GPU API (extended-resource, dra-node-local, dra-pool)", id="unknown-api"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_GPU_RESOURCE: "nvidia.com/gpu"}, ANN_GPU_RESOURCE,
                 "a dra-node-local group has no GPU resource", id="resource-on-a-dra-group"),
    pytest.param({ANN_GPU_API: "dra-pool", CAP + "gpu-count": "1"}, CAP + "gpu-count",
                 "a dra-pool group's nodes boot with no GPU", id="boot-gpus-in-pool-mode"),
])
def test_a_gpu_api_that_contradicts_the_group_is_an_error_naming_the_key(annotations, key, fragment) -> None:
    spec, errors = parse(**annotations)
    assert spec is None and [e.key for e in errors] == [key]
    assert fragment in errors[0].message, errors[0].message


def test_the_dra_resource_is_the_dra_groups_only() -> None:
    with pytest.raises(ValueError, match="does not go with GPU API extended-resource"):
        make_group().model_validate({**make_group().model_dump(), "gpu_resource": DRA_GPU_RESOURCE})


@pytest.mark.parametrize("key, api", [("dra_resource_slices", "dra-node-local"), ("dra_pool_slices", "dra-pool")])
def test_the_fabric_wide_switches_are_refused_naming_the_annotation(key, api) -> None:
    with pytest.raises(ValueError, match=f'{ANN_GPU_API}: "{api}"'):
        Settings(simulated_fabric={key: True})


# --- what CA and the nodes show -------------------------------------------------------------------------------------

def test_a_dra_groups_template_and_nodes_show_no_gpu_capacity() -> None:
    group, extended = dra_group(initial_gpus=1), make_group(initial_gpus=1)
    template = build_template_node(group, "nvidia.com/gpu.product")
    assert set(template.status.allocatable) == {"cpu", "memory", "ephemeral-storage", "pods"}
    assert LABEL_ATTACHED_GPU not in template.metadata.labels
    assert build_template_node(extended, "nvidia.com/gpu.product").status.allocatable["nvidia.com/gpu"].string == "4"
    assert set(node_capacity(group)) == {"cpu", "memory", "ephemeral-storage", "pods"}
    assert node_capacity(extended)["nvidia.com/gpu"] == "0"


def test_pool_slots_go_to_the_pool_mode_groups_of_the_pool_only() -> None:
    groups = [dra_group("MachineSet/default/slots", GpuApi.DRA_POOL, pool="default"),
              dra_group("MachineSet/default/local", pool="default"), make_group("MachineSet/default/ext", pool="default"),
              dra_group("MachineSet/default/elsewhere", GpuApi.DRA_POOL, pool="other")]
    assert pool_mode_groups(groups, "default") == ("MachineSet.default.slots",)
    assert pool_mode_groups(groups[1:3], "default") == ()


# --- routing --------------------------------------------------------------------------------------------------------

MIXED = [make_group("ext", models=()), dra_group("dra", models=())]


def test_new_nodes_come_from_the_group_of_the_pods_api() -> None:
    big = {"memory_gib": 20}
    dra_big = replace(dra_pod("dra-big", "c"), containers=make_pod("x", **big).containers)
    snapshot = snapshot_with([dra_big, make_pod("ext-big", gpus=1, **big)], [claim("c")], groups=MIXED,
                             nodes=[make_node("e1", gpus=0, group="ext", memory_gib=16),
                                    dra_node("d1", gpus=0, group="dra", memory_gib=16)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert {(d.pod, d.verdict, d.group) for d in plan.decisions} == {
        ("default/dra-big", Verdict.NEEDS_NODE, "dra"), ("default/ext-big", Verdict.NEEDS_NODE, "ext")}


@pytest.mark.parametrize("groups, nodes, pod, fragment", [
    pytest.param([make_group("ext", models=())], [make_node("e1", gpus=2, group="ext")], dra_pod("p", "c"),
                 "through ResourceClaims, but every DDS node group exposes its GPUs as an extended resource",
                 id="claims-without-dra-groups"),
    pytest.param([dra_group("dra", models=())], [dra_node("d1", gpus=2, group="dra")], make_pod("p", gpus=1),
                 "asks for nvidia.com/gpu, but no DDS node group exposes its GPUs as nvidia.com/gpu: dra take(s) them",
                 id="extended-resource-without-such-groups"),
    pytest.param(MIXED, [make_node("e1", gpus=2, group="ext"), dra_node("d1", gpus=2, group="dra")],
                 replace(dra_pod("p", "c"), containers=make_pod("x", gpus=1).containers),
                 "asks for GPUs both as nvidia.com/gpu and through ResourceClaims", id="both-apis"),
])
def test_a_pod_no_group_of_its_api_serves_is_refused_with_the_reason(groups, nodes, pod, fragment) -> None:
    snapshot = snapshot_with([pod], [claim("c")], groups=groups, nodes=nodes, pools=[make_pool(A30=4)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    verdict = decision(plan, "p")
    assert plan.attaches == () and plan.new_nodes == ()
    assert verdict.refusal == NO_GROUP_FOR_API and fragment in verdict.reason, verdict.reason


def test_a_running_claim_counts_on_its_dra_node_only() -> None:
    # The extended-resource node's idle GPU is not taken for the DRA pod's: the pending DRA pod needs an attach to d1.
    snapshot = snapshot_with([dra_pod("run", "held", node="d1"), dra_pod("new", "c")],
                             [held("held", "d1", "d1-gpu-0"), claim("c")], groups=MIXED,
                             nodes=[make_node("e1", gpus=1, group="ext"), dra_node("d1", gpus=1, group="dra")])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert decision(plan, "new").verdict == Verdict.FITS_AFTER_GPUS
    assert [(a.node, a.count) for a in plan.attaches] == [("d1", 1)]


def test_a_pool_mode_node_gets_its_gpu_through_the_slot_not_a_plans_attach() -> None:
    # kube-scheduler allocates a slot for the pod and DDS attaches then; an attach planned besides would take a second
    # GPU out of the pool (and a slot off the slice). An extended-resource pod's attach in the same plan stays.
    groups = [dra_group("pool", GpuApi.DRA_POOL, models=(), initial_gpus=0), make_group("ext", models=())]
    snapshot = snapshot_with([dra_pod("train", "c"), make_pod("ext-pod", gpus=1)], [claim("c")], groups=groups,
                             nodes=[dra_node("p1", gpus=0, group="pool"), make_node("e1", gpus=0, group="ext")])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    train = decision(plan, "train")
    assert (train.verdict, train.node, train.gpus_added) == (Verdict.FITS_AFTER_GPUS, "p1", 1)
    assert "kube-scheduler allocates it a pool slot" in train.reason, train.reason
    assert [(a.node, a.count, a.pods) for a in plan.attaches] == [("e1", 1, ("default/ext-pod",))]


def test_a_node_local_dra_node_still_gets_a_plans_attach() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c")], groups=[dra_group("local", models=())],
                             nodes=[dra_node("d1", gpus=0, group="local")])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [(a.node, a.count) for a in plan.attaches] == [("d1", 1)]
