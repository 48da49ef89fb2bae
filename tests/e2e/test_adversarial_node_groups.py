"""A tenant tries to steer DDS at another team's nodes and GPUs, with the real cluster-autoscaler running
(issue 37: the node group access boundary; docs/operations.md "Threat model").

Team B is the stack's own group (namespace default, MachineSet gpu-workers, pool `default`, one worker). The
administrator's settings grant namespace team-a the pool `pool-a` only, and namespace outsider nothing. A tenant
ServiceAccount, in each of the two namespaces, may only create pods, ResourceClaims, MachineSets and Machines there
(Role + RoleBinding made here; the test acts with the ServiceAccount's token). It tries:

- an opted-in MachineSet in outsider, which may have no node groups;
- in team-a: one drawing from team B's pool, one asking for force detach and a GPU idle cooldown of 0, one with a
  mistyped key; and a Machine whose spec.providerID is a copy of team B's node's, whose status.nodeRef Cluster API then
  sets to that node (played here by the test: team-a has no workload Cluster here, so Cluster API's Machine
  controller, which runs, does not get that far).

Shown: none of it is served, each refusal is an InvalidNodeGroup Event saying why, no GPU or node of team B is touched,
and team B's pending GPU pod gets its GPU on its own node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dds.kube import capi
from dds.model import groups as g
from harness.stack import WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, machineset, pod, \
    start_stack
from tests.e2e.cluster_facts import GROUP, ProviderClient, dds_events, describe, fabric_facts, machineset_replicas, \
    pods_running

pytestmark = pytest.mark.e2e

TEAM_A, OUTSIDER = "team-a", "outsider"
TENANT = "tenant"
CAPI = "cluster.x-k8s.io"
TIMEOUT = 150.0
OPTIONS = StackOptions(
    pool_size=4, workers=1, attach_latency=(2.0, 3.0), detach_latency=(1.0, 2.0), node_provisioning_seconds=10.0,
    gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0,
    dds_settings={"simulated_fabric": {"pools": [{"name": "default", "devices": {"A30": 4}},
                                                 {"name": "pool-a", "devices": {"A30": 2}}]},
                  "node_group_namespaces": {"default": {"pools": ["default"]}, TEAM_A: {"pools": ["pool-a"]}}})


# --- the tenant: a ServiceAccount with a namespaced Role, acting with its own token ---

def tenant_client(stack: Stack, namespace: str) -> client.ApiClient:
    stack.core.create_namespace({"metadata": {"name": namespace}})
    stack.core.create_namespaced_service_account(namespace, {"metadata": {"name": TENANT}})
    rbac = client.RbacAuthorizationV1Api(stack.api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": TENANT}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create", "get", "list"]},
        {"apiGroups": [CAPI], "resources": ["machinesets", "machines"], "verbs": ["create", "get", "list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": TENANT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]})
    token = stack.core.create_namespaced_service_account_token(TENANT, namespace, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}}).status.token
    configuration = client.Configuration()
    configuration.host = stack.api.configuration.host
    configuration.ssl_ca_cert = stack.api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def tenant_machineset(name: str, **annotations: str) -> dict[str, Any]:
    """The example MachineSet, renamed, with no nodes and room for none (the tenant asks for groups: CA never scales
    them for team B's pod) and `annotations`."""
    obj = machineset(OPTIONS)
    sizes = {g.ANN_CAPI_MIN: "0", g.ANN_CAPI_MAX: "0"}
    obj["metadata"] = {"name": name, "annotations": {**obj["metadata"]["annotations"], **sizes, **annotations}}
    obj["spec"]["replicas"] = 0
    obj["spec"]["selector"]["matchLabels"][capi.LABEL_SET_NAME] = name
    obj["spec"]["template"]["metadata"]["labels"][capi.LABEL_SET_NAME] = name
    return obj


def create(api: client.ApiClient, namespace: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(CAPI, "v1beta2", namespace, plural, body)


@pytest.fixture(scope="module")
def attempt(tmp_path_factory) -> Iterator[dict[str, Any]]:
    with start_stack(tmp_path_factory.mktemp("adversarial"), OPTIONS) as stack:
        (node_b,) = stack.wait_for("team B's worker Ready with its boot GPU", lambda: [
            n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) >= 1] or None, TIMEOUT,
            lambda: describe(stack))
        machine_b = next(m for m in client.CustomObjectsApi(stack.api).list_namespaced_custom_object(
            CAPI, "v1beta2", "default", "machines")["items"] if capi.node_ref_name(m) == node_b.metadata.name)
        outsider, team_a = tenant_client(stack, OUTSIDER), tenant_client(stack, TEAM_A)

        create(outsider, OUTSIDER, "machinesets", tenant_machineset("outsider-gpu"))
        create(team_a, TEAM_A, "machinesets", tenant_machineset("a-gpu", **{g.ANN_FABRIC_POOL: "pool-a"}))
        create(team_a, TEAM_A, "machinesets", tenant_machineset("a-steal-pool", **{g.ANN_FABRIC_POOL: "default"}))
        create(team_a, TEAM_A, "machinesets", tenant_machineset("a-force", **{
            g.ANN_FABRIC_POOL: "pool-a", g.ANN_FORCE_DETACH: "true", g.ANN_GPU_IDLE_COOLDOWN: "0"}))
        create(team_a, TEAM_A, "machinesets", tenant_machineset("a-typo", **{
            g.ANN_FABRIC_POOL: "pool-a", "dds.cdi.dev/gpu-idle-cooldwn": "0"}))
        plain = tenant_machineset("a-plain")
        del plain["metadata"]["annotations"][g.ANN_ENABLED]
        owner = create(team_a, TEAM_A, "machinesets", plain)
        create(team_a, TEAM_A, "machines", {
            "apiVersion": f"{CAPI}/v1beta2", "kind": "Machine",
            "metadata": {"name": "a-copy", "labels": {capi.LABEL_SET_NAME: "a-plain"},
                         "ownerReferences": [{"apiVersion": f"{CAPI}/v1beta2", "kind": "MachineSet",
                                              "name": "a-plain", "uid": owner["metadata"]["uid"],
                                              "controller": True}]},
            "spec": {"clusterName": "demo", "providerID": node_b.spec.provider_id,
                     "bootstrap": {"dataSecretName": "a-plain-bootstrap"},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine",
                                           "name": "a-copy"}}})
        # Cluster API's machine controller: the Node whose providerID the Machine names becomes its nodeRef
        # (core/reconcilers/machine/machine_controller_noderef.go, no check that another Machine has it).
        client.CustomObjectsApi(stack.api).patch_namespaced_custom_object_status(
            CAPI, "v1beta2", TEAM_A, "machines", "a-copy", {"status": {"nodeRef": {"name": node_b.metadata.name}}})
        yield {"stack": stack, "node_b": node_b, "machine_b": machine_b, "team_a": team_a}


def refusals(stack: Stack) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for event in dds_events(stack):
        if event.reason == "InvalidNodeGroup":
            out.setdefault(event.involved, []).append(event.message)
    return out


def test_the_tenant_acts_with_its_own_narrow_rights(attempt):
    team_a = attempt["team_a"]
    review = client.AuthenticationV1Api(team_a).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == f"system:serviceaccount:{TEAM_A}:{TENANT}"
    with pytest.raises(client.ApiException) as denied:
        create(team_a, "default", "machinesets", tenant_machineset("into-team-b"))
    assert denied.value.status == 403


def test_each_attempt_is_refused_with_an_event_saying_why(attempt):
    stack = attempt["stack"]
    expected = {"machineset/outsider-gpu": "namespace outsider may not have node groups",
                "machineset/a-steal-pool": "pool default is not one namespace team-a may draw from",
                "machineset/a-force": "force_detach: true",
                "machineset/a-typo": "did you mean dds.cdi.dev/gpu-idle-cooldown?",
                "machine/a-copy": f"names Node {attempt['node_b'].metadata.name}, which Machine default/"}
    found = stack.wait_for("an InvalidNodeGroup Event on each attempt", lambda: (
        lambda seen: seen if set(expected) <= set(seen) else None)(refusals(stack)), 60.0,
        lambda: str(refusals(stack)))
    for involved, fragment in expected.items():
        assert any(fragment in message for message in found[involved]), (involved, found[involved])
    assert any("0s is shorter than the 60s" in m for m in found["machineset/a-force"]), found["machineset/a-force"]
    assert "machineset/a-gpu" not in found, "team A's group within its grant is not refused"
    metrics = stack.dds.metrics()
    for reason in ("namespace-not-allowed", "pool-not-allowed", "force-detach-not-allowed", "cooldown-below-floor",
                   "unknown-key"):
        assert metrics.get(f'dds_node_group_config_errors_total{{reason="{reason}",source="machineset"}}', 0) >= 1, \
            reason
    assert metrics.get("dds_machine_node_claims_refused_total", 0) >= 1


def test_cluster_autoscaler_is_served_only_the_groups_within_their_grants(attempt):
    stack, node_b = attempt["stack"], attempt["node_b"]
    with ProviderClient(stack) as provider:
        groups = {group_id.partition("#")[0] for group_id in provider.node_groups()}
        assert groups == {GROUP, f"MachineSet/{TEAM_A}/a-gpu"}, groups
        owner = provider.node_group_for_node(node_b.metadata.name, node_b.spec.provider_id)
    assert owner.partition("#")[0] == GROUP, owner


def test_team_bs_pending_pod_gets_its_gpu_on_its_own_node_and_nothing_of_team_b_is_touched(attempt):
    stack, node_b = attempt["stack"], attempt["node_b"]
    name = node_b.metadata.name
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("train-b", memory_gib=4, gpus=2))
    stack.wait_for("team B's pod Running", lambda: pods_running(stack, ["train-b"]), TIMEOUT, lambda: describe(stack))
    assert stack.core.read_namespaced_pod("train-b", WORKLOAD_NAMESPACE).spec.node_name == name

    node = stack.core.read_node(name)
    assert node.metadata.uid == node_b.metadata.uid and not node.spec.unschedulable
    assert not [t.key for t in node.spec.taints or () if t.key.startswith("dds.cdi.dev/")]
    assert [n.metadata.name for n in stack.nodes()] == [name], "no node added, none removed"
    machine = client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
        CAPI, "v1beta2", "default", "machines", capi.name_of(attempt["machine_b"]))
    assert not capi.marked_for_deletion(machine) and not capi.is_deleting(machine)
    assert machineset_replicas(stack) == 1
    facts = fabric_facts(stack)
    pools_on_b = {d["pool"] for d in facts.devices if d.get("node") == name}
    assert pools_on_b == {"default"}, facts.devices
    assert not [d for d in facts.devices if d["pool"] == "pool-a" and d.get("node")], "team A's pool untouched"
    assert len(facts.attached().get(name, [])) == 2
