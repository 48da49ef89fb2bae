"""Scale-down as CA does it for nodes mapped to a group: unneeded long enough, group above min, pods movable."""

from __future__ import annotations

import grpc
import pytest

from .conftest import GPU_LABEL, make_node, make_pod, methods, template_proto

UNNEEDED = 600.0


@pytest.fixture
def cluster(harness):
    """An observed CPU group of two nodes: c1 nearly idle, c2 with room for c1's pod."""
    harness.fake.add_group("cpu", min_size=1, max_size=3, target=2)
    harness.fake.group_of_node.update({"c1": "cpu", "c2": "cpu"})
    harness.cluster.nodes = [make_node("c1"), make_node("c2")]
    harness.cluster.pods = [make_pod("light", cpu="500m", node="c1"), make_pod("half", cpu="2", node="c2")]
    return harness


def run_for(harness, standin, seconds, step=60.0):
    results = [standin.run_once()]
    for _ in range(int(seconds // step)):
        harness.clock.advance(step)
        results.append(standin.run_once())
    return results


def deleted(results):
    return [name for r in results for name in r.deleted_nodes]


def test_unneeded_node_is_tainted_drained_and_deleted_after_the_unneeded_time(cluster):
    standin = cluster.standin(scale_down_unneeded_time=UNNEEDED, scale_down_delay_after_add=0.0)
    results = run_for(cluster, standin, UNNEEDED - 60)
    assert deleted(results) == []
    results = run_for(cluster, standin, 60)
    assert deleted(results) == ["c1"]
    assert cluster.cluster.tainted == ["c1"] and cluster.cluster.evicted == ["default/light"]
    delete_calls = [c for r in results for c in r.calls if c.method == "NodeGroupDeleteNodes"]
    assert [c.request for c in delete_calls] == ["id=cpu nodes=c1"]


def test_group_at_min_keeps_its_nodes(cluster):
    cluster.fake.groups["cpu"] = (2, 3)
    standin = cluster.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=0.0)
    assert deleted(run_for(cluster, standin, 120)) == []


def test_nodes_of_no_group_are_never_touched(cluster):
    cluster.fake.group_of_node.clear()
    standin = cluster.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=0.0)
    assert deleted(run_for(cluster, standin, 120)) == []
    assert cluster.cluster.tainted == []


@pytest.mark.parametrize("blocker", [
    pytest.param(make_pod("bare", cpu="100m", node="c1", owner=""), id="pod-without-controller"),
    pytest.param(make_pod("pinned", cpu="100m", node="c1", annotations={
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}), id="safe-to-evict-false"),
    pytest.param(make_pod("huge", cpu="3", node="c1"), id="pods-fit-nowhere-else"),
])
def test_pods_that_cannot_move_block_scale_down(cluster, blocker):
    cluster.cluster.nodes = [make_node("c1", cpu="8"), make_node("c2")]
    cluster.cluster.pods.append(blocker)
    standin = cluster.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=0.0)
    assert deleted(run_for(cluster, standin, 120)) == []


@pytest.mark.parametrize("gpu_pod, removed", [
    pytest.param(make_pod("idle-gpu-busy-cpu", cpu="4", gpus=0, node="g1"), False, id="no-gpu-used-but-cpu-full"),
    pytest.param(make_pod("gpu-job", cpu="100m", gpus=1, node="g1"), False, id="gpu-in-use"),
    pytest.param(None, True, id="empty-gpu-node"),
])
def test_gpu_nodes_are_judged_by_gpu_utilization(harness, gpu_pod, removed):
    """A GPU node whose GPUs are idle is unneeded even with its CPUs full; its pods then must fit elsewhere."""
    harness.fake.add_group("gpu", min_size=0, max_size=3, target=1)
    harness.fake.group_of_node["g1"] = "gpu"
    harness.cluster.nodes = [make_node("g1", gpus=1, labels={GPU_LABEL: "A30"}), make_node("spare", cpu="2")]
    harness.cluster.pods = [gpu_pod] if gpu_pod else []
    standin = harness.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=0.0)
    # The busy-cpu pod is GPU-idle (unneeded) but fits nowhere else, so the node stays, as in CA.
    assert (deleted(run_for(harness, standin, 120)) == ["g1"]) is removed


def test_no_scale_down_right_after_a_scale_up(cluster):
    cluster.fake.add_group("big", max_size=3)
    cluster.fake.templates["big"] = template_proto(cpu="64", memory="256Gi")
    cluster.cluster.pods.append(make_pod("giant", cpu="32"))
    standin = cluster.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=300.0)
    results = run_for(cluster, standin, 240)
    assert results[0].scale_up == ("big", 1) and deleted(results) == []
    assert deleted(run_for(cluster, standin, 120)) == ["c1"]


def test_failed_delete_removes_the_taint(cluster):
    cluster.fake.fail["NodeGroupDeleteNodes"] = grpc.StatusCode.INTERNAL
    standin = cluster.standin(scale_down_unneeded_time=0.0, scale_down_delay_after_add=0.0)
    results = run_for(cluster, standin, 0)
    assert "NodeGroupDeleteNodes" in methods(results[0]) and deleted(results) == []
    assert not any(n.to_be_deleted for n in cluster.cluster.nodes)
