"""A claim asking for what DDS does not plan is refused, on the real kube-scheduler (issue 27, part 5).

One dra-node-local group of two workers, each booting with one A30; the pool also holds A100s. A monitoring pod in a
namespace allowed admin access (label resource.kubernetes.io/admin-access) names a ResourceClaim whose request asks
for an A100 with `adminAccess: true`. No node has an A100, so kube-scheduler leaves the pod Pending. Before, DDS read
the claim as a plain request for one A100 and attached one; now the pod gets a `ClaimNotPlanned` Event saying admin
access is not planned, and nothing is attached. No cluster-autoscaler: it plays no part in a DRA pod's scale-up
(docs/dra.md), and the claim is named by the pod, so no kube-controller-manager either.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from dds.model.groups import ANN_GPU_API, GpuApi
from harness.stack import ROOT, Stack, StackOptions, is_ready, start_stack
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
DRIVER = "gpu.dds.cdi.dev"
NAMESPACE = "monitoring"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"  # resource.k8s.io/v1 DRAAdminNamespaceLabelKey


def admin_claim(name: str, model: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "adminAccess": True,
                "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "{model}"'}}]}}]}}}


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0), autoscaler=False,
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_NODE_LOCAL.value},
                           dds_settings={"simulated_fabric": {"pools": [{"name": "default",
                                                                         "devices": {"A30": 4, "A100": 2}}]}})
    with start_stack(tmp_path_factory.mktemp("dra-refusals"), options) as stack:
        stack.core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {ADMIN_ACCESS_LABEL: "true"}}})
        resource = client.ResourceV1Api(stack.api)
        resource.create_device_class(yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
        stack.wait_for("two Ready DRA workers", lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2,
                       TIMEOUT, lambda: describe(stack))
        yield stack


def test_an_admin_access_claim_gets_claim_not_planned_and_nothing_attached(stack: Stack) -> None:
    client.ResourceV1Api(stack.api).create_namespaced_resource_claim(NAMESPACE, admin_claim("watch-a100", "A100"))
    stack.wait_for("the workers' boot GPUs attached", lambda: fabric_facts(stack).attached_count() == 2, TIMEOUT,
                   lambda: describe(stack))
    stack.core.create_namespaced_pod(NAMESPACE, claim_pod("gpu-monitor", "watch-a100"))

    def refused() -> list[Any]:
        return [e for e in dds_events(stack) if e.reason == "ClaimNotPlanned"
                and e.involved == "pod/gpu-monitor"]

    stack.wait_for("DDS's ClaimNotPlanned Event on gpu-monitor", refused, TIMEOUT,
                   lambda: f"{describe(stack)} | events: {[e.line() for e in dds_events(stack)]}")
    (event,) = refused()
    assert "ResourceClaim monitoring/watch-a100 request 'gpu' asks for adminAccess" in event.message
    # A few more loop passes (1 s each): still nothing attached for it, no node added.
    time.sleep(5)
    assert fabric_facts(stack).attached_count() == 2
    assert not [e.line() for e in dds_events(stack) if e.involved == "pod/gpu-monitor"
                and e.reason in ("AttachingGPU", "AddingNode")]
    pod = stack.core.read_namespaced_pod("gpu-monitor", NAMESPACE)
    assert pod.spec.node_name is None
