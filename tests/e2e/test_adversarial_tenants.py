"""A namespace user cannot stop DDS for everyone else (issue 37), on the real cluster-autoscaler and kube-scheduler.

A tenant ServiceAccount that may only create pods and ResourceClaims in its own namespace (a Role made here, its own
TokenRequest token, nothing else) creates what stopped DDS's loop cluster-wide before:
- a ResourceClaim whose CEL selector is valid and admitted by the apiserver (far under its cost limit) but over the
  CEL evaluator's iteration budget (two nested `.all()` over 100-element lists), and a pod naming it;
- a pod with a hostile spec: the largest GPU count a quantity holds, a 120,000-character unicode annotation (220 kB)
  and a long node affinity.
Then another namespace's ordinary 1-GPU pod, on workers whose boot GPUs are busy, must be served as usual (DDS
attaches a GPU, the pod runs), the tenant's pods get DDS's refusal Events saying why, and DDS's log shows no failed
pass. DDS and CA run under the shipped RBAC, as in every e2e test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from harness import rbac
from harness.stack import ROOT, Stack, StackOptions, pod, start_stack
from tests.e2e.cluster_facts import busy_workers, dds_events, describe, pods_running

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
TENANT = "tenant-a"
DRIVER = "gpu.dds.cdi.dev"
HUNDRED = "[" + ",".join(str(i) for i in range(100)) + "]"
EXPENSIVE = f"{HUNDRED}.all(x, {HUNDRED}.all(y, x + y >= 0))"  # 610 characters
LARGEST_QUANTITY = str(2**63 - 1)


def tenant_role() -> tuple[dict[str, Any], dict[str, Any]]:
    """A Role granting pods and ResourceClaims in the tenant's namespace only, bound to its ServiceAccount."""
    role = {"metadata": {"name": "tenant", "namespace": TENANT}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create", "get", "list"]}]}
    binding = {"metadata": {"name": "tenant", "namespace": TENANT},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
               "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT}]}
    return role, binding


def tenant_client(stack: Stack) -> client.ApiClient:
    """An ApiClient acting with the tenant ServiceAccount's own token (TokenRequest), nothing of the admin's."""
    stack.core.create_namespace({"metadata": {"name": TENANT}})
    stack.core.create_namespaced_service_account(TENANT, {"metadata": {"name": "tenant", "namespace": TENANT}})
    role, binding = tenant_role()
    rbac_api = client.RbacAuthorizationV1Api(stack.api)
    rbac_api.create_namespaced_role(TENANT, role)
    rbac_api.create_namespaced_role_binding(TENANT, binding)
    token = stack.core.create_namespaced_service_account_token(
        "tenant", TENANT, {"spec": {"expirationSeconds": 3600}}).status.token
    identity = rbac.Identity("tenant", TENANT, ROOT)
    plane = stack.control_plane
    ca_pem = (Path(plane.workdir) / "pki" / "ca.crt").read_bytes()
    path = Path(plane.workdir) / "kubeconfig-tenant"
    path.write_text(yaml.safe_dump(rbac.kubeconfig_document(plane.server, ca_pem, identity, token)))
    path.chmod(0o600)
    return rbac.api_client(path)


def expensive_claim() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "expensive", "namespace": TENANT},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": EXPENSIVE}}]}}]}}}


def claim_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "expensive-claim", "namespace": TENANT},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "expensive"}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


def hostile_spec_pod() -> dict[str, Any]:
    body = pod("hostile-spec", memory_gib=1, namespace=TENANT)
    resources = body["spec"]["containers"][0]["resources"]
    resources["requests"]["nvidia.com/gpu"] = resources["limits"]["nvidia.com/gpu"] = LARGEST_QUANTITY
    body["metadata"]["annotations"] = {"example.com/unicode": "ünïcödé ☃😀\u202e" * 10_000}  # keys are ASCII
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": f"example.com/k{i}", "operator": "NotIn",
                                                     "values": [f"v{j}" * 20 for j in range(20)]}]}
                              for i in range(20)]}}}
    return body


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0), gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0)
    with start_stack(tmp_path_factory.mktemp("adversarial-tenants"), options) as stack:
        client.ResourceV1Api(stack.api).create_device_class(
            yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
        busy_workers(stack, timeout=TIMEOUT)
        yield stack


def test_a_tenants_hostile_claim_and_pod_are_refused_and_another_namespaces_pod_is_served(stack: Stack) -> None:
    tenant = tenant_client(stack)
    tenant_core = client.CoreV1Api(tenant)
    with pytest.raises(client.ApiException) as denied:  # the tenant's reach: its own namespace's pods and claims
        tenant_core.list_namespaced_pod("demo")
    assert denied.value.status == 403
    client.ResourceV1Api(tenant).create_namespaced_resource_claim(TENANT, expensive_claim())
    tenant_core.create_namespaced_pod(TENANT, claim_pod())
    tenant_core.create_namespaced_pod(TENANT, hostile_spec_pod())

    def refusal(name: str, reason: str) -> list[Any]:
        return [e for e in dds_events(stack) if e.involved == f"pod/{name}" and e.reason == reason]

    def events() -> str:
        return f"{describe(stack)} | events: {[e.line() for e in dds_events(stack)]}"

    (claim_refused,) = stack.wait_for("DDS's refusal of the expensive claim's pod",
                                      lambda: refusal("expensive-claim", "NoMatchingDevice"), TIMEOUT, events)
    assert "Iteration budget exceeded" in claim_refused.message, claim_refused.message
    assert f"ResourceClaim {TENANT}/expensive request 'gpu'" in claim_refused.message
    (spec_refused,) = stack.wait_for("DDS's refusal of the hostile-spec pod",
                                     lambda: refusal("hostile-spec", "TooManyGPUs"), TIMEOUT, events)
    assert f"needs {LARGEST_QUANTITY} GPUs on one node" in spec_refused.message, spec_refused.message

    # With both pending, another namespace's ordinary pod gets its GPU attached and runs.
    stack.core.create_namespaced_pod("demo", pod("ordinary", memory_gib=8, gpus=1))
    stack.wait_for("the ordinary 1-GPU pod Running", lambda: pods_running(stack, ["ordinary"]), TIMEOUT, events)
    assert "AttachingGPU" in [e.reason for e in dds_events(stack) if e.involved == "pod/ordinary"]
    assert "control loop failed" not in stack.dds.log_path.read_text(errors="replace")
    assert "Iteration budget exceeded" not in stack.autoscaler.log_path.read_text(errors="replace")
    metrics = stack.dds.metrics()
    assert metrics.get('dds_objects_refused_total{kind="pods",reason="NoMatchingDevice"}', 0.0) >= 1.0
    assert metrics.get('dds_objects_refused_total{kind="pods",reason="TooManyGPUs"}', 0.0) >= 1.0
