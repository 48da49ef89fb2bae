"""The stand-in's own scheduling check, binpacking and least-waste score."""

from __future__ import annotations

import pytest

from dds.testing.ca_standin import Snapshot, binpack, utilization, waste_score, why_not
from dds.testing.ca_standin.fit import NodeUsage
from dds.testing.ca_standin.views import Taint

from .conftest import make_node, make_pod

NODE = make_node("n1", cpu="4", memory="16Gi", gpus=2, labels={"zone": "a", "tier": "7"})


@pytest.mark.parametrize("pod, node, expected", [
    pytest.param(make_pod("p", cpu="4", memory="16Gi"), NODE, None, id="exactly-fills-the-node"),
    pytest.param(make_pod("p", cpu="4001m"), NODE, "Insufficient cpu", id="one-millicore-too-many"),
    pytest.param(make_pod("p", memory="17Gi"), NODE, "Insufficient memory", id="too-much-memory"),
    pytest.param(make_pod("p", gpus=3), NODE, "Insufficient nvidia.com/gpu", id="too-many-gpus"),
    pytest.param(make_pod("p", gpus=1), make_node("cpu-only"), "Insufficient nvidia.com/gpu",
                 id="extended-resource-the-node-lacks"),
    pytest.param(make_pod("p", cpu="0", memory="0"), make_node("full", pods=0), "Too many pods", id="pod-count"),
    pytest.param(make_pod("p", node_selector={"zone": "a"}), NODE, None, id="node-selector-matches"),
    pytest.param(make_pod("p", node_selector={"zone": "b"}), NODE,
                 "node(s) didn't match Pod's node affinity/selector", id="node-selector-differs"),
    pytest.param(make_pod("p"), make_node("t", taints=(Taint("gpu", "yes", "NoSchedule"),)),
                 "node(s) had untolerated taint {gpu: yes}", id="untolerated-taint"),
    pytest.param(make_pod("p", tolerations=[{"key": "gpu", "operator": "Exists"}]),
                 make_node("t", taints=(Taint("gpu", "yes", "NoSchedule"),)), None, id="tolerated-by-exists"),
    pytest.param(make_pod("p", tolerations=[{"key": "gpu", "value": "no", "effect": "NoSchedule"}]),
                 make_node("t", taints=(Taint("gpu", "yes", "NoSchedule"),)),
                 "node(s) had untolerated taint {gpu: yes}", id="equal-toleration-with-other-value"),
    pytest.param(make_pod("p"), make_node("t", taints=(Taint("soft", "", "PreferNoSchedule"),)), None,
                 id="prefer-no-schedule-is-ignored"),
    pytest.param(make_pod("p"), make_node("u", unschedulable=True), "node(s) were unschedulable", id="cordoned"),
    pytest.param(make_pod("p", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["5"]}]}]}}}),
        NODE, None, id="affinity-gt"),
    pytest.param(make_pod("p", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}),
        NODE, None, id="affinity-second-term-by-name"),
    pytest.param(make_pod("p", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}]}}}),
        NODE, "node(s) didn't match Pod's node affinity/selector", id="affinity-does-not-exist"),
])
def test_why_not(pod, node, expected):
    assert why_not(pod, node, NodeUsage()) == expected


def test_usage_counts_against_allocatable():
    snapshot = Snapshot([NODE], [make_pod("running", cpu="3", node="n1")])
    assert snapshot.place(make_pod("p", cpu="2")) is None
    assert snapshot.place(make_pod("q", cpu="1")) == "n1"


def test_init_containers_and_overhead_count_as_the_scheduler_counts_them():
    pod = make_pod("p", cpu="1", initContainers=[{"name": "init", "resources": {"requests": {"cpu": "3"}}}],
                   overhead={"cpu": "250m"})
    assert pod.requests["cpu"] == 3250


@pytest.mark.parametrize("pods, max_nodes, expected_nodes, expected_pods", [
    pytest.param(["p1", "p2", "p3", "p4"], 10, 2, 4, id="two-gpus-each-on-four-gpu-nodes"),
    pytest.param(["p1", "p2", "p3", "p4"], 1, 1, 2, id="capped-by-max"),
    pytest.param([], 10, 0, 0, id="nothing-to-place"),
])
def test_binpack(pods, max_nodes, expected_nodes, expected_pods):
    template = make_node("template", cpu="16", memory="64Gi", gpus=4)
    estimate = binpack([make_pod(name, gpus=2) for name in pods], template, max_nodes)
    assert (estimate.node_count, len(estimate.pods)) == (expected_nodes, expected_pods)


def test_binpack_leaves_out_pods_that_never_fit_the_template():
    template = make_node("template", gpus=1)
    estimate = binpack([make_pod("big", gpus=2), make_pod("small", gpus=1)], template, 5)
    assert [p.name for p in estimate.pods] == ["small"]


def test_least_waste_prefers_the_tighter_node():
    pods = (make_pod("p", cpu="3", memory="12Gi"),)
    tight, loose = make_node("tight", cpu="4", memory="16Gi"), make_node("loose", cpu="32", memory="128Gi")
    assert waste_score(tight, binpack(pods, tight, 1)) < waste_score(loose, binpack(pods, loose, 1))


@pytest.mark.parametrize("gpu_resource, expected", [
    pytest.param("nvidia.com/gpu", 0.5, id="gpu-node-judged-by-gpus-only"),
    pytest.param("", 0.75, id="cpu-node-judged-by-the-larger-of-cpu-and-memory"),
])
def test_utilization(gpu_resource, expected):
    pods = [make_pod("a", cpu="3", memory="1Gi", gpus=1, node="n1")]
    assert utilization(NODE, pods, gpu_resource) == expected
