"""CXL memory planned like GPUs: attached chunk by chunk to a live node instead of adding one, a node only when even
the maximum memory and GPUs do not fit, idle chunks detached after the cooldown, memory that requests need never
detached; a pod needing GPUs and memory gets both in one plan. Every decision says why (`dds plan` prints these)."""

from __future__ import annotations

from dataclasses import replace

from dds.model.plan import PlannerConfig, Verdict
from dds.model.snapshot import Device, PoolInfo, Snapshot
from dds.planner import plan_scale_down, plan_scale_up, render_scale_down, render_scale_up

from .builders import GiB, make_group, make_node, make_pod

CONFIG = PlannerConfig()


def memory_group(**kw):
    """The builders' group (8 cores, 32 GiB, up to 4 A30) taking up to 64 GiB of CXL memory in 16 GiB chunks."""
    return make_group(**kw).model_copy(update={"max_cxl_memory": 64 * GiB, "cxl_memory_chunk": 16 * GiB})


def pool(gpus=8, memory_gib=256):
    return PoolInfo("pool-a", free={"A30": gpus}, free_cxl_memory=memory_gib * GiB)


def chunks(node, count, since=0.0):
    """`node` with `count` 16 GiB chunks attached (ids <node>-mem-<i>, attached at t=i), its memory grown by them."""
    devices = tuple(Device(id=f"{node.name}-mem-{i}", model="cxl-memory", pool="pool-a", attached_at=float(i))
                    for i in range(count))
    grown = replace(node.allocatable, memory=node.allocatable.memory + count * 16 * GiB)
    return replace(node, cxl_chunks=devices, allocatable=grown, cxl_idle_since=since)


def test_a_memory_bound_pod_gets_chunks_on_a_live_node_instead_of_a_new_node():
    worker = make_node("w1")
    busy = make_pod("busy", memory_gib=20, node="w1")
    pod = make_pod("mem", memory_gib=40)  # 12 GiB free on w1: 28 GiB short -> 2 chunks of 16 GiB
    snap = Snapshot(now=100, nodes=(worker,), pods=(busy, pod), groups=(memory_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    decision = plan.decisions[0]
    assert (decision.verdict, decision.node, decision.memory_added) == (Verdict.FITS_AFTER_MEMORY, "w1", 32 * GiB)
    assert plan.new_nodes == () and plan.attaches == ()
    [attach] = plan.memory_attaches
    assert (attach.node, attach.pool, attach.chunks, attach.chunk_bytes, attach.pods) == (
        "w1", "pool-a", 2, 16 * GiB, ("default/mem",))
    text = render_scale_up(plan)
    assert "fits-after-memory: fits on w1 after 2 CXL memory chunks of 16 GiB (32 GiB)" in text
    assert "attach 2 CXL memory chunks (32 GiB) from pool pool-a to w1" in text


def test_the_node_needing_the_fewest_chunks_is_chosen_and_the_others_are_explained():
    roomy, tight = make_node("roomy"), make_node("tight")
    pods = (make_pod("a", memory_gib=4, node="roomy"), make_pod("b", memory_gib=20, node="tight"),
            make_pod("mem", memory_gib=40))
    snap = Snapshot(now=0, nodes=(roomy, tight), pods=pods, groups=(memory_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    assert [(m.node, m.chunks) for m in plan.memory_attaches] == [("roomy", 1)]


def test_a_node_only_when_even_the_maximum_memory_does_not_fit_a_live_node():
    worker = make_node("w1")
    pods = (make_pod("busy", memory_gib=20, node="w1"), make_pod("huge", memory_gib=80))  # 12 + 64 < 80
    snap = Snapshot(now=0, nodes=(worker,), pods=pods, groups=(memory_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    decision = plan.decisions[0]
    assert decision.verdict is Verdict.NEEDS_NODE and plan.memory_attaches == ()
    assert [n.count for n in plan.new_nodes] == [1]  # a new node's template holds 32 + 64 GiB
    assert "no live node fits it even with the CXL memory it can still attach" in decision.reason
    assert any(r.target == "w1" and r.reason == "cxl-memory-full" for r in decision.rejected)


def test_a_pool_without_free_memory_falls_back_to_a_node():
    worker = make_node("w1")
    pods = (make_pod("mem", memory_gib=40),)
    snap = Snapshot(now=0, nodes=(worker,), pods=pods, groups=(memory_group(),), pools=(pool(memory_gib=0),))
    plan = plan_scale_up(snap, CONFIG)
    assert plan.decisions[0].verdict is Verdict.NEEDS_NODE and plan.memory_attaches == ()
    assert [r.reason for r in plan.decisions[0].rejected][:1] == ["cxl-pool-exhausted"]


def test_a_pod_needing_gpus_and_memory_gets_both_on_one_node_in_one_plan():
    worker = make_node("w1", gpus=1)
    pods = (make_pod("busy", gpus=1, memory_gib=8, node="w1"), make_pod("both", gpus=2, memory_gib=40))
    snap = Snapshot(now=0, nodes=(worker,), pods=pods, groups=(memory_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    decision = plan.decisions[0]
    assert (decision.verdict, decision.node, decision.gpus_added, decision.memory_added) == (
        Verdict.FITS_AFTER_MEMORY, "w1", 2, 16 * GiB)
    assert [(a.node, a.count) for a in plan.attaches] == [("w1", 2)]
    assert [(m.node, m.chunks) for m in plan.memory_attaches] == [("w1", 1)]
    assert plan.new_nodes == ()
    assert "after 1 CXL memory chunk of 16 GiB (16 GiB) and 2 GPU(s)" in decision.reason


def test_chunks_on_their_way_count_and_are_not_ordered_twice():
    worker = replace(make_node("w1"), cxl_attaching=2)
    pods = (make_pod("busy", memory_gib=20, node="w1"), make_pod("mem", memory_gib=40))
    snap = Snapshot(now=0, nodes=(worker,), pods=pods, groups=(memory_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    assert plan.decisions[0].verdict is Verdict.FITS_NOW and plan.memory_attaches == ()


def test_groups_without_cxl_memory_plan_as_before():
    worker = make_node("w1")
    pods = (make_pod("mem", memory_gib=40),)
    snap = Snapshot(now=0, nodes=(worker,), pods=pods, groups=(make_group(),), pools=(pool(),))
    plan = plan_scale_up(snap, CONFIG)
    assert plan.decisions[0].verdict is Verdict.UNSCHEDULABLE and plan.memory_attaches == ()


def test_idle_chunks_are_detached_after_the_cooldown_newest_first():
    worker = chunks(make_node("w1"), 3, since=0.0)  # 32 + 48 GiB
    pods = (make_pod("p", memory_gib=40, node="w1"),)  # 40 GiB requested: 40 GiB spare = 2 chunks
    group = memory_group(gpu_cooldown=600)
    early = plan_scale_down(Snapshot(now=300, nodes=(worker,), pods=pods, groups=(group,), pools=(pool(),)), CONFIG)
    assert early.detaches == ()
    assert "CXL memory on w1: 2 chunk(s) idle for 300s, detached after the cooldown (600s)" in early.notes
    late = plan_scale_down(Snapshot(now=700, nodes=(worker,), pods=pods, groups=(group,), pools=(pool(),)), CONFIG)
    [detach] = late.detaches
    assert (detach.node, detach.device_ids) == ("w1", ("w1-mem-2", "w1-mem-1"))
    assert "not needed (its pods request 40 GiB of its 80 GiB; 1 chunk(s) stay)" in detach.reason
    assert "detach w1-mem-2, w1-mem-1 from w1" in render_scale_down(late)


def test_memory_the_pods_requests_need_is_never_detached_whatever_their_usage():
    worker = chunks(make_node("w1"), 2, since=0.0)  # 64 GiB, all requested
    pods = (make_pod("a", memory_gib=40, node="w1"), make_pod("b", memory_gib=24, node="w1"))
    snap = Snapshot(now=10_000, nodes=(worker,), pods=pods, groups=(memory_group(gpu_cooldown=60),), pools=(pool(),))
    plan = plan_scale_down(snap, CONFIG)
    assert plan.detaches == ()
    assert "CXL memory on w1 stays: its pods request 64 GiB of its 64 GiB, so none of its 2 chunk(s) is free" in (
        plan.notes)


def test_dds_plan_reads_cxl_memory_from_a_snapshot_file_and_explains_it(tmp_path, capsys):
    from dds.cli import main

    snapshot = tmp_path / "snap.json"
    snapshot.write_text("""{"now": 100,
     "groups": [{"id": "gpu-workers", "minSize": 1, "maxSize": 3, "cpu": "16", "memory": "64Gi", "maxGpusPerNode": 4,
                 "gpuModels": ["A30"], "fabricPool": "default", "maxCxlMemory": "128Gi", "cxlMemoryChunk": "16Gi"}],
     "pools": [{"name": "default", "free": {"A30": 4}, "freeCxlMemory": "256Gi"}],
     "nodes": [{"name": "w1", "group": "gpu-workers", "allocatable": {"cpu": "16", "memory": "64Gi", "pods": 110}}],
     "pods": [{"namespace": "demo", "name": "mem-0", "containers": [{"requests": {"memory": "24Gi"}}]},
              {"namespace": "demo", "name": "big", "node": "w1", "containers": [{"requests": {"memory": "48Gi"}}]}]}""")
    assert main(["plan", "--snapshot", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "pod demo/mem-0: fits-after-memory: fits on w1 after 1 CXL memory chunk of 16 GiB" in out
    assert "attach 1 CXL memory chunk (16 GiB) from pool default to w1" in out


def test_a_snapshot_with_cxl_memory_reads_back_equal():
    from dds.commands.snapshot_file import dump_snapshot, load_snapshot

    worker = replace(chunks(make_node("w1"), 2, since=5.0), cxl_attaching=1)
    snap = Snapshot(now=7, nodes=(worker,), pods=(make_pod("p", node="w1"),), groups=(memory_group(),),
                    pools=(pool(),))
    again = load_snapshot(dump_snapshot(snap))
    assert again.nodes == snap.nodes and again.pools == snap.pools
    assert (again.groups[0].max_cxl_memory, again.groups[0].cxl_memory_chunk) == (64 * GiB, 16 * GiB)
