"""Scale-up bookkeeping as CA keeps it: upcoming nodes, backoff, failed and unregistered instances, timeouts,
template choice and group options."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb

from .conftest import GPU_LABEL, T0, make_node, make_pod, methods, template_proto

FAKE_REASON = "k8s.io/cluster-autoscaler/fake-node-reason"


@pytest.fixture
def scenario(harness):
    harness.fake.add_group("gpu", max_size=3)
    harness.fake.templates["gpu"] = template_proto()
    harness.cluster.nodes = [make_node("n1")]
    harness.cluster.pods = [make_pod("trainer", gpus=2)]
    return harness


def requests_of(fake, method):
    return [r for m, r in fake.requests if m == method]


def loop(harness, standin, seconds=10.0):
    harness.clock.advance(seconds)
    return standin.run_once()


# --- upcoming nodes ---

def test_pod_covered_by_an_upcoming_node_does_not_scale_up_again(scenario):
    standin = scenario.standin()
    assert standin.run_once().scale_up == ("gpu", 1)
    for _ in range(3):
        assert loop(scenario, standin).scale_up is None
    assert len(requests_of(scenario.fake, "NodeGroupIncreaseSize")) == 1


def test_once_nothing_is_upcoming_the_pending_pod_triggers_a_new_scale_up(scenario):
    standin = scenario.standin()
    standin.run_once()
    scenario.fake.targets["gpu"] = 0  # the provider served the request without a node (e.g. GPUs attached)
    scenario.fake.instances["gpu"].clear()
    assert loop(scenario, standin).scale_up == ("gpu", 1)


def test_registered_not_ready_node_still_counts_as_upcoming(scenario):
    standin = scenario.standin()
    standin.run_once()
    instance = scenario.fake.instances["gpu"][0].id
    scenario.fake.group_of_node["gpu-node"] = "gpu"
    scenario.cluster.nodes.append(make_node("gpu-node", gpus=4, ready=False, created=T0 + 5, provider_id=instance,
                                            labels={GPU_LABEL: "A30"}))
    assert loop(scenario, standin).pods_to_help == []


def test_scale_up_is_capped_at_max_minus_target(harness):
    harness.fake.add_group("gpu", max_size=3, target=1)
    harness.fake.templates["gpu"] = template_proto()
    harness.cluster.pods = [make_pod(f"p{i}", gpus=4) for i in range(5)]
    assert harness.standin().run_once().scale_up == ("gpu", 2)


def test_least_waste_group_wins(harness):
    harness.fake.add_group("big", max_size=3)
    harness.fake.templates["big"] = template_proto(cpu="64", memory="256Gi")
    harness.fake.add_group("small", max_size=3)
    harness.fake.templates["small"] = template_proto(cpu="4", memory="16Gi")
    harness.cluster.pods = [make_pod("p", cpu="3", memory="12Gi", gpus=1)]
    assert harness.standin().run_once().scale_up == ("small", 1)


def test_young_gpu_pods_wait_one_buffer(harness):
    harness.fake.add_group("gpu", max_size=3)
    harness.fake.templates["gpu"] = template_proto()
    harness.cluster.pods = [make_pod("fresh", gpus=1, created=T0 - 5)]
    standin = harness.standin(unschedulable_gpu_pod_time_buffer=30.0)
    assert standin.run_once().scale_up is None
    assert loop(harness, standin, 30).scale_up == ("gpu", 1)


# --- backoff ---

def test_increase_size_error_backs_the_group_off_doubling(scenario):
    scenario.fake.fail["NodeGroupIncreaseSize"] = grpc.StatusCode.RESOURCE_EXHAUSTED
    standin = scenario.standin(initial_node_group_backoff=300.0, max_node_group_backoff=1800.0)
    attempts = []
    for step in range(0, 1500, 10):
        result = loop(scenario, standin, 0 if step == 0 else 10)
        if "NodeGroupIncreaseSize" in methods(result):
            attempts.append(step)
    # 5 min after the first failure, then 10 min after the second (the backoff doubles).
    assert attempts == [0, 310, 920]


def test_backed_off_group_leaves_the_pod_to_another_group(scenario):
    scenario.fake.add_group("spare", max_size=3)
    scenario.fake.templates["spare"] = template_proto(cpu="64", memory="256Gi")
    scenario.fake.fail["NodeGroupIncreaseSize"] = grpc.StatusCode.UNAVAILABLE
    standin = scenario.standin()
    standin.run_once()
    del scenario.fake.fail["NodeGroupIncreaseSize"]
    assert loop(scenario, standin).scale_up == ("spare", 1)


# --- failed and unregistered instances ---

def test_failed_instance_is_deleted_every_loop_with_a_create_error_placeholder(scenario):
    standin = scenario.standin()
    standin.run_once()
    scenario.fake.instances["gpu"].clear()
    scenario.fake.creating("gpu", "dds://gpu/broken", error_code="OutOfGPUs")
    scenario.fake.fail["NodeGroupDeleteNodes"] = grpc.StatusCode.INTERNAL  # it stays listed
    for _ in range(3):
        loop(scenario, standin)
    deletes = requests_of(scenario.fake, "NodeGroupDeleteNodes")
    assert len(deletes) == 3
    node = deletes[0].nodes[0]
    assert (deletes[0].id, node.name, node.providerID, dict(node.annotations)) == (
        "gpu", "dds://gpu/broken", "dds://gpu/broken", {FAKE_REASON: "create-error"})
    assert standin.backoff.backed_off("gpu", scenario.clock()) is not None


def test_failed_instance_seen_while_not_scaling_up_does_not_back_off(scenario):
    scenario.cluster.pods = []
    scenario.fake.creating("gpu", "dds://gpu/broken", error_code="OutOfGPUs")
    standin = scenario.standin()
    result = standin.run_once()
    assert "NodeGroupDeleteNodes" in methods(result)
    assert standin.backoff.backed_off("gpu", scenario.clock()) is None


def test_scale_up_not_done_within_provision_time_is_reverted_and_backed_off(scenario):
    standin = scenario.standin(max_node_provision_time=60.0)
    standin.run_once()
    assert standin.backoff.backed_off("gpu", scenario.clock()) is None
    result = loop(scenario, standin, 61)
    assert ("NodeGroupDecreaseTargetSize", "id=gpu delta=-1") in [(c.method, c.request) for c in result.calls]
    assert standin.backoff.backed_off("gpu", scenario.clock()) is not None


def test_instance_not_registered_within_provision_time_is_deleted_with_a_placeholder(harness):
    harness.fake.add_group("cpu", min_size=0, max_size=3, target=1)
    harness.fake.creating("cpu", "dds://cpu/stuck")
    standin = harness.standin(max_node_provision_time=60.0)
    standin.run_once()
    assert not requests_of(harness.fake, "NodeGroupDeleteNodes")
    result = loop(harness, standin, 61)
    assert ("NodeGroupDeleteNodes", "id=cpu nodes=dds://cpu/stuck reason=unregistered") in [
        (c.method, c.request) for c in result.calls]
    node = requests_of(harness.fake, "NodeGroupDeleteNodes")[0].nodes[0]
    assert (node.name, node.providerID, node.annotations[FAKE_REASON]) == (
        "dds://cpu/stuck", "dds://cpu/stuck", "unregistered")


def test_unregistered_removal_respects_the_group_min(harness):
    harness.fake.add_group("fixed", min_size=1, max_size=3, target=1)
    harness.fake.creating("fixed", "stuck")
    standin = harness.standin(max_node_provision_time=60.0)
    standin.run_once()
    loop(harness, standin, 120)
    assert not requests_of(harness.fake, "NodeGroupDeleteNodes")


def test_group_short_of_nodes_for_provision_time_gets_its_target_decreased(harness):
    harness.fake.add_group("cpu", min_size=0, max_size=3, target=2)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [make_node("c1")]
    standin = harness.standin(max_node_provision_time=60.0)
    standin.run_once()
    result = loop(harness, standin, 61)
    assert result.outcome == "fixed-group-size"
    assert ("NodeGroupDecreaseTargetSize", "id=cpu delta=-1") in [(c.method, c.request) for c in result.calls]


# --- templates ---

def test_good_live_node_of_the_group_is_the_template(harness):
    harness.fake.add_group("cpu", min_size=0, max_size=3, target=1)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [make_node("c1", cpu="2", memory="4Gi")]
    harness.cluster.pods = [make_pod("busy", cpu="1", node="c1"), make_pod("p", cpu="1500m", memory="1Gi")]
    harness.fake.templates["cpu"] = template_proto(cpu="64")  # would fit twice as many pods: must not be used
    result = harness.standin().run_once()
    assert "NodeGroupTemplateNodeInfo" not in methods(result)
    assert result.scale_up == ("cpu", 1)


@pytest.mark.parametrize("node, asks_provider", [
    pytest.param(make_node("c1", ready_since=T0 - 30), True, id="ready-for-less-than-a-minute"),
    pytest.param(make_node("c1", unschedulable=True), True, id="cordoned"),
    pytest.param(make_node("c1", labels={GPU_LABEL: "A30"}), True, id="gpu-label-without-gpus-is-unready"),
    pytest.param(make_node("c1"), False, id="good-node"),
])
def test_only_a_good_node_replaces_the_template(harness, node, asks_provider):
    harness.fake.add_group("cpu", max_size=3, target=1)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [node]
    result = harness.standin().run_once()
    assert ("NodeGroupTemplateNodeInfo" in methods(result)) is asks_provider


def test_template_cached_from_a_good_node_outlives_the_node_until_it_expires(harness):
    harness.fake.add_group("cpu", max_size=3, target=1)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [make_node("c1")]
    standin = harness.standin(node_info_cache_expire_time=100.0)
    standin.run_once()
    harness.cluster.nodes = []
    assert "NodeGroupTemplateNodeInfo" not in methods(loop(harness, standin, 50))
    assert "NodeGroupTemplateNodeInfo" in methods(loop(harness, standin, 60))


def test_unready_node_is_the_last_resort_template(harness):
    harness.fake.add_group("cpu", max_size=3, target=1)
    harness.fake.group_of_node["c1"] = "cpu"
    harness.cluster.nodes = [make_node("c1", ready=False, cpu="8", memory="32Gi")]
    harness.cluster.pods = [make_pod("busy", cpu="4", node="c1"), make_pod("p", cpu="6")]
    assert harness.standin().run_once().scale_up == ("cpu", 1)  # no template from the provider: UNIMPLEMENTED


def test_template_without_node_bytes_crashes_like_cluster_autoscaler(harness):
    harness.fake.add_group("gpu", max_size=3)
    harness.fake.templates["gpu"] = type(template_proto())()  # an empty Node encodes to zero bytes
    standin = harness.standin()
    result = standin.run_once()
    assert result.outcome.startswith("crashed: NodeGroupTemplateNodeInfo for group 'gpu' answered no node")
    assert standin.crashed


# --- options ---

def test_get_options_sends_ca_defaults(scenario):
    scenario.standin(max_node_provision_time=123.0).run_once()
    defaults = requests_of(scenario.fake, "NodeGroupGetOptions")[0].defaults
    assert (defaults.scaleDownUtilizationThreshold, defaults.scaleDownGpuUtilizationThreshold,
            defaults.MaxNodeProvisionDuration.seconds, defaults.scaleDownUnneededDuration.seconds,
            defaults.scaleDownUnreadyDuration.seconds) == (0.5, 0.5, 123, 600, 1200)


def test_get_options_answer_replaces_the_defaults(scenario):
    scenario.fake.options = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5, scaleDownGpuUtilizationThreshold=0.5,
        MaxNodeProvisionDuration=duration_pb2.Duration(seconds=30),
        scaleDownUnneededDuration=duration_pb2.Duration(seconds=600))
    standin = scenario.standin(max_node_provision_time=900.0)
    standin.run_once()
    scenario.fake.apply_increase = False
    loop(scenario, standin, 31)  # the group's 30 s, not the 900 s default
    assert requests_of(scenario.fake, "NodeGroupDecreaseTargetSize")
