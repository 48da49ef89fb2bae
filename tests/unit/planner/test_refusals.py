"""When DDS cannot help a pending pod, the plan says why in a user's words: the GPU model no pool holds, more GPUs
than a node takes, an empty pool. `dds plan`, the logs and the pod's Event all print this reason."""

from __future__ import annotations

from dds.planner import plan_scale_up
from dds.model.plan import PlannerConfig, Verdict
from dds.planner.refusals import (FITS_NOWHERE, NO_SUCH_MODEL, POOL_EMPTY, TOO_MANY_GPUS, UNSUPPORTED, cannot_serve,
                                  selected_models)
from tests.unit.planner.builders import PRODUCT, make_group, make_node, make_pod, make_pool, make_snapshot, term


def decision(snapshot, pod_name):
    plan = plan_scale_up(snapshot, PlannerConfig())
    return next(d for d in plan.decisions if d.pod.endswith("/" + pod_name))


def test_a_model_no_pool_holds_is_named():
    snapshot = make_snapshot([make_node("w1", gpus=1)], [make_pod("a100", gpus=1, model="A100")],
                             pools=[make_pool(A30=3)])
    d = decision(snapshot, "a100")
    assert d.verdict == Verdict.UNSCHEDULABLE and d.refusal == NO_SUCH_MODEL
    assert d.reason.startswith("asks for A100 GPUs, but no pool holds A100 (pool pool-a holds A30)")


def test_a_model_a_pool_holds_but_no_group_takes_is_named_so():
    snapshot = make_snapshot([], [make_pod("h100", gpus=1, model="H100")], pools=[make_pool(A30=3, H100=2)])
    found = cannot_serve(snapshot.pods[0], snapshot)
    assert found is not None and found.reason == NO_SUCH_MODEL
    assert "no DDS node group takes H100" in found.message


def test_more_gpus_than_a_node_holds():
    snapshot = make_snapshot([make_node("w1", gpus=1)], [make_pod("big", gpus=6)])
    d = decision(snapshot, "big")
    assert d.refusal == TOO_MANY_GPUS
    assert d.reason.startswith("needs 6 GPUs on one node, but a node holds at most 4 (gpu: max-gpus-per-node 4)")


def test_the_pool_limit_per_node_counts_too():
    snapshot = make_snapshot([], [make_pod("three", gpus=3)], pools=[make_pool(max_slots=2, A30=5)])
    found = cannot_serve(snapshot.pods[0], snapshot)
    assert found is not None and found.reason == TOO_MANY_GPUS and "at most 2" in found.message


def test_an_empty_pool_is_named_only_when_the_pod_gets_no_gpu():
    pod = make_pod("train", gpus=1)
    empty = make_snapshot([make_node("w1", gpus=1)], [make_pod("busy", gpus=1, node="w1"), pod],
                          groups=[make_group(max_size=1, replicas=1)], pools=[make_pool(A30=0)])
    found = cannot_serve(pod, empty)
    assert found is not None and found.reason == POOL_EMPTY
    assert found.message == "pool pool-a has no free A30: the pod waits until one is released"
    assert cannot_serve(pod, empty, pool_checked=False) is None


def test_a_pod_the_plan_serves_has_no_refusal():
    snapshot = make_snapshot([make_node("w1", gpus=1)], [make_pod("busy", gpus=1, node="w1"), make_pod("train", gpus=1)])
    d = decision(snapshot, "train")
    assert d.verdict == Verdict.FITS_AFTER_GPUS and d.refusal is None


def test_without_a_gpu_reason_the_simulation_speaks():
    snapshot = make_snapshot([make_node("w1")], [make_pod("huge", memory_gib=500)])
    d = decision(snapshot, "huge")
    assert d.verdict == Verdict.UNSCHEDULABLE and d.refusal == FITS_NOWHERE


def test_an_unsupported_constraint_is_a_refusal_of_its_own():
    snapshot = make_snapshot([make_node("w1", gpus=1)],
                             [make_pod("spread", gpus=1, unsupported=("topologySpreadConstraints",))])
    assert decision(snapshot, "spread").refusal == UNSUPPORTED


def test_models_selected_through_required_node_affinity():
    pod = make_pod("p", gpus=1, affinity=[term(PRODUCT, "In", "A100", "H100")])
    assert selected_models(pod, PRODUCT) == {"A100", "H100"}
    assert selected_models(make_pod("q", gpus=1), PRODUCT) == frozenset()
