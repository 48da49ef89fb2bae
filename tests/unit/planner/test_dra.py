"""DRA in the planner: CEL selectors on the devices DDS publishes, claims lowered to GPU requests, then planned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.planner import plan_scale_down, plan_scale_up
from dds.model.dra_devices import DEVICE_CLASS, DRIVER, device_name, gpu_device
from dds.planner.dra import (CelBudget, CelBudgetSpent, CelLimits, claim_demand, evaluate, lower_claims, lower_pods,
                             request_mismatch)
from dds.model.dra_records import (ALL, AllocatedDeviceInfo, DeviceClassInfo, DeviceRequestInfo, DraState, PodClaimRef,
                                   ResourceClaimInfo, ResourceClaimTemplateInfo)
from dds.model.plan import PlannerConfig, Verdict
from dds.planner.refusals import NO_MATCHING_DEVICE, SELECTOR_BUDGET_SPENT
from dds.model.groups import DRA_GPU_RESOURCE, GpuApi, NodeGroupSpec
from dds.model.snapshot import NOT_READABLE
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

GREEDY = PlannerConfig(batch_solver="greedy")
CLASS = DeviceClassInfo(DEVICE_CLASS, (f'device.driver == "{DRIVER}"',))
A30 = gpu_device("A30", "pool-a/A30-000", "w1")
A100 = gpu_device("A100", "pool-a/A100-000", "w1")


def model_is(model: str) -> str:
    return f'device.attributes["{DRIVER}"].model == "{model}"'


def request(name: str = "gpu", *selectors: str, count: int = 1, mode: str = "ExactCount",
            device_class: str = DEVICE_CLASS) -> DeviceRequestInfo:
    return DeviceRequestInfo(name, device_class, tuple(selectors), mode, count)


def claim(name: str, *requests: DeviceRequestInfo, allocated=None, reserved=()) -> ResourceClaimInfo:
    return ResourceClaimInfo("default", name, tuple(requests) or (request(),), allocated, tuple(reserved))


def dra_pod(name: str, *claims: str, node=None, template: str = ""):
    refs = tuple(PodClaimRef(c, claim_name=c) for c in claims)
    if template:
        refs += (PodClaimRef("gpu", template_name=template),)
    return replace(make_pod(name, node=node), resource_claims=refs)


def held(claim_name: str, node: str, device: str, request_name: str = "gpu") -> ResourceClaimInfo:
    return claim(claim_name, allocated=(AllocatedDeviceInfo(request_name, DRIVER, node, device),))


# --- CEL on devices -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression, device, expected", [
    pytest.param(model_is("A30"), A30, (True, ""), id="model-matches"),
    pytest.param(model_is("A30"), A100, (False, ""), id="model-differs"),
    pytest.param(f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA")', A30, (True, ""), id="strings"),
    pytest.param(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0', A100, (True, ""),
                 id="quantity-at-least"),
    pytest.param(f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("40Gi"))', A30, (False, ""),
                 id="quantity-less"),
    pytest.param('device.attributes["other.example.com"].size() == 0', A30, (True, ""), id="unknown-domain-is-empty"),
    pytest.param(f'cel.bind(g, device.attributes["{DRIVER}"], g.model == "A30" && g.deviceID != "")', A30,
                 (True, ""), id="cel-bind"),
])
def test_selectors_evaluate_like_kube_scheduler(expression, device, expected) -> None:
    assert evaluate(expression, device) == expected


def test_a_missing_attribute_is_an_error_that_never_matches() -> None:
    ok, error = evaluate('device.attributes["other.example.com"].model == "A30"', A30)
    assert not ok and "model" in error


def test_a_selector_that_does_not_compile_is_reported() -> None:
    ok, error = evaluate("device.driver ==", A30)
    assert not ok and "does not compile" in error


def test_the_first_failing_selector_is_named_with_its_source() -> None:
    found = request_mismatch(request("gpu", model_is("H100")), {CLASS.name: CLASS}, A30)
    assert found is not None and found.source == "request" and found.selector == model_is("H100")
    assert found.text() == f"request selector `{model_is('H100')}` is false for device {A30.name}"
    wrong_class = DeviceClassInfo(DEVICE_CLASS, ('device.driver == "nic.example.com"',))
    assert request_mismatch(request(), {DEVICE_CLASS: wrong_class}, A30).source == f"DeviceClass {DEVICE_CLASS}"
    assert "does not exist" in request_mismatch(request(device_class="nope"), {}, A30).error


def test_device_names_are_dns_labels() -> None:
    assert device_name("pool-a/A30-003") == "pool-a-a30-003"
    assert A30.attributes[f"{DRIVER}/deviceID"] == "pool-a/A30-000"


# --- a claim's demand -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("requests, gpus, models", [
    pytest.param((request(count=2),), 2, {"A30", "A100"}, id="exact-count-any-model"),
    pytest.param((request("gpu", model_is("A100")),), 1, {"A100"}, id="model-selector"),
    pytest.param((request(mode=ALL),), 1, {"A30", "A100"}, id="all-needs-one"),
    pytest.param((request("a", model_is("A30")), request("b", count=2)), 3, {"A30"}, id="several-requests"),
])
def test_claim_demand(requests, gpus, models) -> None:
    demand = claim_demand(claim("c", *requests), {CLASS.name: CLASS}, (A30, A100))
    assert (demand.gpus, demand.models, demand.refusal) == (gpus, frozenset(models), None)


def test_a_claim_no_device_satisfies_is_refused_with_the_selector_and_device() -> None:
    demand = claim_demand(claim("c", request("gpu", model_is("H100"))), {CLASS.name: CLASS}, (A30,))
    assert demand.refusal == (f"ResourceClaim default/c request 'gpu': no GPU DDS can attach satisfies it (request "
                              f"selector `{model_is('H100')}` is false for an attachable A30)")


def test_requests_for_different_models_are_refused() -> None:
    demand = claim_demand(claim("c", request("a", model_is("A30")), request("b", model_is("A100"))),
                          {CLASS.name: CLASS}, (A30, A100))
    assert demand.refusal and "no common GPU model" in demand.refusal


# --- planned like extended-resource pods ----------------------------------------------------------------------------

def dra_group(id: str = "gpu", api: GpuApi = GpuApi.DRA_NODE_LOCAL, **kwargs) -> NodeGroupSpec:
    """make_group's group whose GPUs pods get through ResourceClaims (dds.cdi.dev/gpu-api)."""
    spec = make_group(id, **kwargs).model_dump(exclude={"gpu_resource"})
    return NodeGroupSpec.model_validate({**spec, "gpu_api": api})


def dra_node(name: str, gpus: int = 0, **kwargs):
    """make_node's node of a DRA group: its GPUs are ResourceSlice devices, not node capacity."""
    node = make_node(name, gpus=gpus, **kwargs)
    return replace(node, allocatable=replace(node.allocatable, scalar={}), gpu_resource=DRA_GPU_RESOURCE)


def snapshot_with(pods, claims=(), templates=(), nodes=None, pools=None, groups=None):
    snapshot = make_snapshot(nodes if nodes is not None else [dra_node("w1", gpus=1), dra_node("w2", gpus=0)],
                             pods, groups=groups or [dra_group(models=())], pools=pools or [make_pool(A30=4, A100=2)])
    return replace(snapshot, dra=DraState(claims=tuple(claims), templates=tuple(templates), classes=(CLASS,)))


def decision(plan, pod: str):
    return next(d for d in plan.decisions if d.pod == f"default/{pod}")


def test_a_pending_claim_is_served_by_an_attach() -> None:
    snapshot = snapshot_with([dra_pod("busy", "b", node="w1"), dra_pod("train", "c")],
                             [held("b", "w1", device_name("w1-gpu-0")), claim("c", request("gpu", model_is("A30")))])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    train = decision(plan, "train")
    assert train.verdict == Verdict.FITS_AFTER_GPUS and train.gpus_added == 1
    assert [(a.model, a.count) for a in plan.attaches] == [("A30", 1)]


def test_the_model_a_selector_asks_for_is_the_one_attached() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", request("gpu", model_is("A100"), count=2))],
                             nodes=[dra_node("w1", gpus=0)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w1", "A100", 2)]


def test_a_free_gpu_on_the_node_serves_the_claim_without_an_attach() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c")])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert decision(plan, "train").verdict == Verdict.FITS_NOW and plan.attaches == ()


def test_a_template_is_planned_before_its_claim_exists() -> None:
    template = ResourceClaimTemplateInfo("default", "one-a100", (request("gpu", model_is("A100")),))
    snapshot = snapshot_with([dra_pod("train", template="one-a100")], templates=[template],
                             nodes=[dra_node("w1", gpus=0)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [(a.model, a.count) for a in plan.attaches] == [("A100", 1)]


def test_a_shared_claim_is_asked_for_once() -> None:
    snapshot = snapshot_with([dra_pod("a", "shared"), dra_pod("b", "shared")], [claim("shared", request(count=2))],
                             nodes=[dra_node("w1", gpus=0)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert sum(a.count for a in plan.attaches) == 2


def test_an_unsatisfiable_claim_attaches_nothing_and_says_why() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", request("gpu", model_is("H100")))])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    train = decision(plan, "train")
    assert plan.attaches == () and plan.new_nodes == ()
    assert train.refusal == NO_MATCHING_DEVICE
    assert "H100" in train.reason and "is false for an attachable A30" in train.reason


def test_a_missing_claim_is_waited_for() -> None:
    plan = plan_scale_up(lower_claims(snapshot_with([dra_pod("train", "nope")])), GREEDY)
    assert plan.attaches == () and "does not exist" in decision(plan, "train").reason


def test_allocated_devices_are_used_and_never_detached() -> None:
    node = dra_node("w1", gpus=2)  # devices w1-gpu-0 (older) and w1-gpu-1 (newest: an idle detach's first pick)
    snapshot = snapshot_with([dra_pod("train", "c", node="w1")], [held("c", "w1", device_name("w1-gpu-1"))],
                             nodes=[replace(node, gpus_idle_since=0.0)])
    lowered = lower_claims(snapshot)
    assert [d.in_claim for d in lowered.nodes[0].devices] == [False, True]
    plan = plan_scale_down(lowered, GREEDY)
    assert [d.device_ids for d in plan.detaches] == [("w1-gpu-0",)]


def test_a_running_claim_holds_its_gpu_against_pending_pods() -> None:
    snapshot = snapshot_with([dra_pod("running", "c", node="w1"), dra_pod("p", "d")],
                             [held("c", "w1", device_name("w1-gpu-0")), claim("d")], nodes=[dra_node("w1", gpus=1)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert decision(plan, "p").verdict == Verdict.FITS_AFTER_GPUS


def test_extended_resource_pods_are_left_as_they_are() -> None:
    snapshot = snapshot_with([make_pod("p", gpus=1)])
    assert lower_claims(snapshot) is snapshot


def test_dds_plan_prints_the_dra_verdict() -> None:
    from dds.planner import render_scale_up

    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", request("gpu", model_is("H100")))])
    text = render_scale_up(plan_scale_up(lower_claims(snapshot), GREEDY))
    assert (f"pod default/train: unsupported: ResourceClaim default/c request 'gpu': no GPU DDS can attach satisfies "
            f"it (request selector `{model_is('H100')}` is false for an attachable A100; request selector "
            f"`{model_is('H100')}` is false for an attachable A30)") in text


def test_a_dra_pod_no_live_node_holds_is_the_loops_to_add_a_node_for() -> None:
    from dds.planner.dra import pods_needing_nodes

    big = replace(dra_pod("big", "c"), containers=make_pod("x", memory_gib=20).containers)
    snapshot = lower_claims(snapshot_with([big], [claim("c")], nodes=[dra_node("w1", gpus=1, memory_gib=16)]))
    fast_path = plan_scale_up(snapshot, replace(GREEDY, allow_new_nodes=False))
    needing = pods_needing_nodes(fast_path, snapshot.pending_pods())
    assert [p.name for p in needing] == ["big"]
    plan = plan_scale_up(snapshot, GREEDY, needing)
    assert [(n.group, n.count, n.pods) for n in plan.new_nodes] == [("gpu", 1, ("default/big",))]


# --- pool mode ------------------------------------------------------------------------------------------------------

def slot_claim(name: str, device: str, node: str = "w1", attached: bool = False) -> ResourceClaimInfo:
    from dds.planner.dra import ATTACHED
    from dds.model.dra_devices import dra_pool_name

    return replace(claim(name, allocated=(AllocatedDeviceInfo("gpu", DRIVER, dra_pool_name("default"), device),)),
                   uid=f"uid-{name}", allocated_node=node, allocated_at="t1",
                   true_conditions={device: (ATTACHED,)} if attached else {})


def test_a_pool_lists_one_slot_per_free_gpu_and_keeps_allocated_ones() -> None:
    from dds.planner.dra import ATTACH_FAILED, ATTACHED, pool_slots

    free = {"A30": 2}
    assert [d.name for d in pool_slots("default", free, DraState())] == ["default-a30-slot-000", "default-a30-slot-001"]
    first = pool_slots("default", free, DraState())[0]
    assert first.binds_to_node and first.binding_conditions == (ATTACHED,)
    assert first.binding_failure_conditions == (ATTACH_FAILED,)
    # Slot 000 allocated, its GPU not attached yet: still free in the fabric, but promised.
    waiting = DraState(claims=(slot_claim("c", "default-a30-slot-000"),))
    assert [d.name for d in pool_slots("default", free, waiting)] == ["default-a30-slot-000", "default-a30-slot-001"]
    # Attached: the fabric has one free GPU left, listed beside the allocated slot.
    bound = DraState(claims=(slot_claim("c", "default-a30-slot-000", attached=True),))
    assert [d.name for d in pool_slots("default", {"A30": 1}, bound)] == ["default-a30-slot-000",
                                                                           "default-a30-slot-001"]
    # Its attach failed (the promised GPU was taken meanwhile): neither it nor a free slot is listed any more.
    failed = DraState(claims=(replace(slot_claim("c", "default-a30-slot-000"),
                                      true_conditions={"default-a30-slot-000": (ATTACH_FAILED,)}),))
    assert pool_slots("default", {"A30": 0}, failed) == ()


def test_allocated_slots_not_yet_bound_are_the_attaches_to_make() -> None:
    from dds.planner.dra import pool_bindings

    state = DraState(claims=(slot_claim("a", "default-a30-slot-000", node="w2"),
                             slot_claim("b", "default-a30-slot-001", attached=True)))
    (binding,) = pool_bindings(state, {"default": ("A30",)})
    assert (binding.claim.name, binding.model, binding.node, binding.fabric_pool) == ("a", "A30", "w2", "default")
    assert binding.key == "dra-bind/uid-a/t1/default-a30-slot-000"


def test_a_pool_mode_pod_is_pinned_to_its_node_and_its_gpu_kept() -> None:
    node = replace(dra_node("w1", gpus=2), gpus_idle_since=0.0)
    bound = replace(slot_claim("c", "default-a30-slot-000", attached=True), fabric_devices=("w1-gpu-1",))
    snapshot = snapshot_with([dra_pod("train", "c", node="w1")], [bound], nodes=[node])
    lowered = lower_claims(snapshot)
    assert [d.in_claim for d in lowered.nodes[0].devices] == [False, True]
    assert [d.device_ids for d in plan_scale_down(lowered, GREEDY).detaches] == [("w1-gpu-0",)]


def test_each_api_is_served_by_its_own_groups_nodes() -> None:
    # d1 (DRA) has a free device and e1 (extended resource) a free GPU, each of the wrong kind for the pod that wants
    # it: each pod is planned onto its own group's node, the extended-resource one with an attach.
    groups = [make_group("ext", models=()), dra_group("dra", models=())]
    nodes = [make_node("e1", gpus=1, group="ext"), dra_node("d1", gpus=2, group="dra")]
    snapshot = snapshot_with([make_pod("ext-run", gpus=1, node="e1"), dra_pod("dra-run", "held", node="d1"),
                              dra_pod("dra-new", "c"), make_pod("ext-new", gpus=1, created=1.0)],
                             [held("held", "d1", device_name("d1-gpu-0")), claim("c")], nodes=nodes, groups=groups)
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert decision(plan, "dra-new").verdict == Verdict.FITS_NOW and decision(plan, "dra-new").node == "d1"
    assert decision(plan, "ext-new").verdict == Verdict.FITS_AFTER_GPUS
    assert [(a.node, a.count) for a in plan.attaches] == [("e1", 1)]


# --- a tenant's selector cannot stop the planner ---------------------------------------------------------------------

HUNDRED = "[" + ",".join(str(i) for i in range(100)) + "]"
# Valid, far under the apiserver's cost limit, and over the evaluator's iteration budget (issue 37's outage).
EXPENSIVE = f"{HUNDRED}.all(x, {HUNDRED}.all(y, x + y >= 0))"


def test_a_selector_over_the_evaluators_budget_is_an_error_that_never_matches() -> None:
    ok, error = evaluate(EXPENSIVE, A30)
    assert not ok and "Iteration budget exceeded" in error


def test_an_expensive_selector_refuses_its_claim_and_the_other_pods_are_planned() -> None:
    snapshot = snapshot_with([dra_pod("hostile", "bad"), dra_pod("train", "c")],
                             [claim("bad", request("gpu", EXPENSIVE)), claim("c", request("gpu", model_is("A100")))],
                             nodes=[dra_node("w1", gpus=0)])
    lowered = lower_claims(snapshot)
    hostile = next(p for p in lowered.pods if p.name == "hostile")
    assert hostile.dra_refusal is not None and "Iteration budget exceeded" in hostile.dra_refusal
    plan = plan_scale_up(lowered, GREEDY)
    assert decision(plan, "hostile").verdict == Verdict.UNSUPPORTED
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w1", "A100", 1)]


def test_a_selector_longer_than_the_limit_is_refused_unevaluated() -> None:
    long_selector = model_is("A100") + " && true" * 40
    snapshot = snapshot_with([dra_pod("hostile", "bad"), dra_pod("train", "c")],
                             [claim("bad", request("gpu", long_selector)), claim("c", request("gpu", model_is("A100")))],
                             nodes=[dra_node("w1", gpus=0)])
    pods = {p.name: p for p in lower_pods(snapshot.pods, snapshot.dra, {"A30", "A100"}, snapshot.gpu_model_label,
                                          limits=CelLimits(max_expression_length=100))}
    assert f"a selector of {len(long_selector)} characters, over the 100 DDS evaluates" in pods["hostile"].dra_refusal
    assert len(pods["hostile"].dra_refusal) < 1000  # the refusal quotes the selector's start only
    assert pods["train"].dra_refusal is None


def test_past_the_pass_budget_the_remaining_claims_are_refused_and_the_same_selector_is_evaluated_once() -> None:
    pods = [dra_pod(f"p{i}", f"c{i}") for i in range(4)]
    claims = [claim("c0", request("gpu", model_is("A100"))), claim("c1", request("gpu", model_is("A100"))),
              claim("c2", request("gpu", model_is("A30"))), claim("c3", request("gpu", model_is("A30")))]
    snapshot = snapshot_with(pods, claims)
    # Two offers (A30, A100), one class selector and one request selector: c0 costs 4 evaluations, c1 none (the same
    # selectors on the same offers), c2 two more, and c3 none; a budget of 5 refuses c2 (and c3, judged after it).
    lowered = {p.name: p for p in lower_pods(snapshot.pods, snapshot.dra, {"A30", "A100"}, snapshot.gpu_model_label,
                                             limits=CelLimits(evaluations_per_pass=5))}
    assert lowered["p0"].dra_refusal is None and lowered["p1"].dra_refusal is None
    assert lowered["p2"].dra_refusal_reason == SELECTOR_BUDGET_SPENT
    assert "cel_evaluations_per_pass" in lowered["p2"].dra_refusal
    budget = CelBudget(CelLimits(evaluations_per_pass=1))
    assert budget.evaluate(model_is("A30"), A30) == budget.evaluate(model_is("A30"), A30) == (True, "")
    with pytest.raises(CelBudgetSpent):
        budget.evaluate(model_is("A30"), A100)


def test_an_error_judging_one_pods_claims_refuses_that_pod_only() -> None:
    # A claim whose request count is not a number (no decoder should let it through; the planner holds regardless).
    broken = claim("bad", replace(request("gpu"), count="lots"))
    snapshot = snapshot_with([dra_pod("hostile", "bad"), dra_pod("train", "c")],
                             [broken, claim("c", request("gpu", model_is("A100")))], nodes=[dra_node("w1", gpus=0)])
    lowered = lower_claims(snapshot)
    hostile = next(p for p in lowered.pods if p.name == "hostile")
    assert hostile.dra_refusal_reason == NOT_READABLE and "TypeError" in hostile.dra_refusal
    plan = plan_scale_up(lowered, GREEDY)
    assert decision(plan, "hostile").verdict == Verdict.UNSUPPORTED
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w1", "A100", 1)]


def test_past_the_pass_seconds_the_remaining_claims_are_refused() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.4  # each reading: 0.4 s more spent
        return now[0]

    snapshot = snapshot_with([dra_pod("p0", "c0"), dra_pod("p1", "c1")],
                             [claim("c0", request("gpu", model_is("A100"))), claim("c1", request("gpu", model_is("A30")))])
    lowered = {p.name: p for p in lower_pods(snapshot.pods, snapshot.dra, {"A30", "A100"}, snapshot.gpu_model_label,
                                             limits=CelLimits(seconds_per_pass=1.0), clock=clock)}
    # Two evaluations fit in the second (0.4 s and 0.8 s after the start); the third of p0's claim does not.
    assert [lowered[p].dra_refusal_reason for p in ("p0", "p1")] == [SELECTOR_BUDGET_SPENT] * 2
    assert "spent its 1s on CEL selectors (cel_seconds_per_pass) in 2 evaluations" in lowered["p0"].dra_refusal


def test_a_claims_fabric_devices_annotation_keeps_no_gpu_of_another_node() -> None:
    # The annotation is the claim's metadata: a tenant who may update the claim could name any GPU in it.
    w1, w2 = (replace(dra_node(name, gpus=1), gpus_idle_since=0.0) for name in ("w1", "w2"))
    bound = replace(slot_claim("c", "default-a30-slot-000", attached=True), fabric_devices=("w1-gpu-0", "w2-gpu-0"))
    lowered = lower_claims(snapshot_with([dra_pod("train", "c", node="w1")], [bound], nodes=[w1, w2]))
    assert {n.name: [d.in_claim for d in n.devices] for n in lowered.nodes} == {"w1": [True], "w2": [False]}
