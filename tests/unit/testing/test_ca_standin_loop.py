"""The RPCs the stand-in makes per loop, in order, against a fake provider: Refresh first, errors abort, caches."""

from __future__ import annotations

import grpc
import pytest

from .conftest import make_node, make_pod, methods, template_proto

FIRST_SCALE_UP_LOOP = [
    ("GPULabel", ""), ("Refresh", ""), ("NodeGroups", ""),
    ("NodeGroupForNode", "node=n1"),  # template pass: n1 is a good node, but of no group
    ("NodeGroupTemplateNodeInfo", "id=gpu"),
    ("NodeGroupTargetSize", "id=gpu"), ("NodeGroupNodes", "id=gpu"),
    ("NodeGroupForNode", "node=n1"),  # readiness pass: an id "" answer is not cached
    ("GetAvailableGPUTypes", ""),
    ("NodeGroupIncreaseSize", "id=gpu delta=1"),
    ("NodeGroupGetOptions", "id=gpu"),  # max-node-provision-time of the new scale-up request
    ("NodeGroupTargetSize", "id=gpu"),  # Recalculate after the scale-up
]


@pytest.fixture
def gpu_scenario(harness):
    """One CPU node outside any group, a GPU group served by a template, one pending 2-GPU pod."""
    harness.fake.add_group("gpu", max_size=3)
    harness.fake.templates["gpu"] = template_proto()
    harness.cluster.nodes = [make_node("n1")]
    harness.cluster.pods = [make_pod("trainer", gpus=2)]
    return harness


def test_first_loop_makes_ca_calls_in_ca_order(gpu_scenario):
    result = gpu_scenario.standin().run_once()
    assert [(c.method, c.request) for c in result.calls] == FIRST_SCALE_UP_LOOP
    assert result.scale_up == ("gpu", 1)
    assert all(c.status == "OK" for c in result.calls if c.method != "NodeGroupGetOptions")


def test_next_loop_refetches_instances_of_the_group_scaling_up_and_waits_for_it(gpu_scenario):
    standin = gpu_scenario.standin()
    standin.run_once()
    gpu_scenario.clock.advance(10)
    result = standin.run_once()
    assert methods(result) == ["Refresh", "NodeGroups", "NodeGroupForNode", "NodeGroupTemplateNodeInfo",
                               "NodeGroupTargetSize", "NodeGroupNodes", "NodeGroupForNode",
                               "NodeGroupForNode", "NodeGroupGetOptions"]  # the instance's placeholder is mapped
    assert result.scale_up is None and result.pods_to_help == []  # the upcoming node covers the pod


def test_every_call_carries_the_grpc_timeout_as_deadline(gpu_scenario):
    gpu_scenario.standin(grpc_timeout=42.0).run_once()
    # The server sees the deadline the client set, give or take clock rounding: 42 s, not grpc's "no deadline".
    assert gpu_scenario.fake.deadlines and all(d is not None and 40 < d < 43 for d in gpu_scenario.fake.deadlines)


def test_refresh_error_aborts_the_loop(gpu_scenario):
    gpu_scenario.fake.fail["Refresh"] = grpc.StatusCode.UNAVAILABLE
    result = gpu_scenario.standin().run_once()
    assert methods(result) == ["GPULabel", "Refresh"]
    assert result.outcome.startswith("aborted: Refresh failed")
    assert "UNAVAILABLE" in result.calls[-1].status


def test_target_size_error_aborts_before_any_scaling(gpu_scenario):
    gpu_scenario.fake.fail["NodeGroupTargetSize"] = grpc.StatusCode.INTERNAL
    result = gpu_scenario.standin().run_once()
    assert methods(result)[-1] == "NodeGroupTargetSize"
    assert result.outcome.startswith("aborted: NodeGroupTargetSize failed for gpu")


def test_instances_error_is_retried_once_then_aborts(gpu_scenario):
    gpu_scenario.fake.fail["NodeGroupNodes"] = grpc.StatusCode.INTERNAL
    standin = gpu_scenario.standin()
    standin.run_once()  # the periodic refresh swallows the error (an empty list), as CA's background refresh does
    gpu_scenario.fake.fail["NodeGroupTemplateNodeInfo"] = grpc.StatusCode.INTERNAL
    gpu_scenario.clock.advance(10)
    result = standin.run_once()  # scaling up: the entry is dropped and must be fetched now
    assert methods(result).count("NodeGroupNodes") == 2
    assert result.outcome.startswith("aborted: NodeGroupNodes failed for gpu")


def test_node_groups_error_gives_no_groups_and_is_retried_next_loop(gpu_scenario):
    gpu_scenario.fake.fail["NodeGroups"] = grpc.StatusCode.UNAVAILABLE
    standin = gpu_scenario.standin()
    result = standin.run_once()
    assert result.outcome == "ok" and result.scale_up is None
    assert not any(m.startswith("NodeGroupTargetSize") for m in methods(result))
    del gpu_scenario.fake.fail["NodeGroups"]
    assert standin.run_once().scale_up == ("gpu", 1)


def test_node_groups_and_group_for_node_are_cached_until_refresh(harness):
    harness.fake.add_group("cpu", min_size=1, max_size=3, target=1)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [make_node("c1"), make_node("other")]
    standin = harness.standin()
    for _ in range(2):
        result = standin.run_once()
        names = [c.request for c in result.calls if c.method == "NodeGroupForNode"]
        assert methods(result).count("NodeGroups") == 1
        # c1 is answered from the cache after its first call; "other" (id "") is asked every time.
        assert names.count("node=c1") == 1 and names.count("node=other") == 2
        harness.clock.advance(10)


def test_gpu_label_and_types_are_asked_once_per_process(gpu_scenario):
    standin = gpu_scenario.standin()
    standin.run_once()
    gpu_scenario.fake.instances["gpu"].clear()
    gpu_scenario.fake.targets["gpu"] = 0  # the scale-up finished without a node: the pod is pending again
    for _ in range(2):
        gpu_scenario.clock.advance(10)
        standin.run_once()
    asked = [m for m, _ in gpu_scenario.fake.requests]
    assert asked.count("GPULabel") == 1 and asked.count("GetAvailableGPUTypes") == 1
    assert asked.count("NodeGroupIncreaseSize") == 2


def test_stop_calls_cleanup(gpu_scenario):
    standin = gpu_scenario.standin()
    standin.stop()
    assert [m for m, _ in gpu_scenario.fake.requests] == ["Cleanup"]
