"""ProvisioningRequests of DDS's class served on the real apiserver and kube-scheduler (docs/kueue.md).

What Kueue does is done here by the test: a PodTemplate per pod set and a ProvisioningRequest
(autoscaling.x-k8s.io/v1, the CRD vendored from cluster-autoscaler 1.36.1: tests/e2e/crds/provisioningrequests) of
class `attach-or-provision.dds.cdi.dev`; once the request says `Provisioned=True`, the job's pods, annotated
`autoscaling.x-k8s.io/consume-provisioning-request: <request>`. DDS runs as its ServiceAccount under the shipped RBAC
(manifests/dds, manifests/rbac/reservations for the pod toleration), its loop driven pass by pass on a virtual clock.

Two 4-slot workers with no GPU, a pool of 6 A30s, the group at its maximum size (2): whatever DDS does, it adds no node.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from kubernetes import client

from dds.model.provisioning import (API_GROUP, API_VERSION, BOOKED_TAINT_KEY, CA_ATOMIC_CLASS, CONSUME_ANNOTATION,
                                    DEFAULT_CLASS, PLURAL)
from dds.controller.ca_requests import ScaleUpRefused
from dds.kube.cache import cluster_cache
from dds.kube.provisioning import ProvisioningRequestReader
from dds.kube.requests import instrument
from tests.integration.controller.harness import GPU, TEST_LABEL, ControllerHarness
from tests.integration.nodes.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.pool_size(6)]

CRDS = Path(__file__).resolve().parents[2] / "e2e" / "crds" / "provisioningrequests"
BOOKING_SECONDS = 600.0  # the setting's default, which build_app passes on


@pytest.fixture
def dds(control_plane: Any, dds: ControllerHarness) -> ControllerHarness:
    control_plane.install_crds([CRDS])
    dds.create_group("workers", replicas=2, max_size=2, gpu_cooldown="1h")
    return dds


def pod_spec(dds: ControllerHarness, gpus: int) -> dict[str, Any]:
    return {"nodeSelector": {TEST_LABEL: dds.namespace},
            "containers": [{"name": "main", "image": "example.com/train:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "1Gi", GPU: str(gpus)},
                                          "limits": {GPU: str(gpus)}}}]}


def create_request(dds: ControllerHarness, name: str, count: int, gpus: int, *, template: bool = True,
                   klass: str = DEFAULT_CLASS) -> None:
    """As Kueue's provisioning admission check does: the pod set's PodTemplate, then the request naming it."""
    if template:
        dds.core.create_namespaced_pod_template(dds.namespace, {
            "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-main"},
            "template": {"spec": pod_spec(dds, gpus)}})
    custom(dds).create_namespaced_custom_object(API_GROUP, API_VERSION, dds.namespace, PLURAL, {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ProvisioningRequest", "metadata": {"name": name},
        "spec": {"provisioningClassName": klass,
                 "podSets": [{"podTemplateRef": {"name": f"{name}-main"}, "count": count}]}})


def create_consumer(dds: ControllerHarness, name: str, request: str, gpus: int) -> None:
    """One of the job's pods, as Kueue's podSetUpdates leave it once the job is admitted."""
    dds.core.create_namespaced_pod(dds.namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {CONSUME_ANNOTATION: request}},
        "spec": pod_spec(dds, gpus)})


def custom(dds: ControllerHarness) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(dds.api)


def condition(dds: ControllerHarness, request: str, kind: str) -> Optional[dict[str, Any]]:
    obj = custom(dds).get_namespaced_custom_object(API_GROUP, API_VERSION, dds.namespace, PLURAL, request)
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def is_true(dds: ControllerHarness, request: str, kind: str) -> bool:
    found = condition(dds, request, kind)
    return found is not None and found["status"] == "True"


def booked(dds: ControllerHarness) -> dict[str, str]:
    """Node -> the request uid its booking taint names."""
    out, ours = {}, set(dds.node_names())
    for item in dds.core.list_node().items:  # one read: a node removed once released is not booked
        if item.metadata.name not in ours:
            continue
        for taint in item.spec.taints or ():
            if taint.key == BOOKED_TAINT_KEY:
                out[item.metadata.name] = taint.value
    return out


def uid_of(dds: ControllerHarness, request: str) -> str:
    return custom(dds).get_namespaced_custom_object(API_GROUP, API_VERSION, dds.namespace, PLURAL,
                                                    request)["metadata"]["uid"]


def passes_until(dds: ControllerHarness, what: str, predicate: Callable[[], bool]) -> None:
    """Loop passes (the attaches' latency passed on the virtual clock) until `predicate` holds."""
    def step() -> bool:
        dds.pass_attach_latency()
        return predicate()
    wait_for(what, step, timeout=60.0, interval=0.5)


def provision(dds: ControllerHarness, request: str, count: int, gpus: int) -> None:
    create_request(dds, request, count, gpus)
    dds.run_once()
    assert is_true(dds, request, "Accepted")
    passes_until(dds, f"{request} Provisioned", lambda: is_true(dds, request, "Provisioned"))


def test_a_request_is_served_by_attaches_with_no_node_and_its_capacity_kept_for_its_pods(dds: ControllerHarness):
    w1, w2 = dds.node_names()
    create_request(dds, "job-a", count=2, gpus=2)
    dds.run_once()
    assert is_true(dds, "job-a", "Accepted")
    assert condition(dds, "job-a", "Provisioned")["status"] == "False"  # the GPUs are on their way
    attaches = dds.operations(started_by="provisioning/")
    assert sum(op.requested for op in attaches) == 4  # 2 pods x 2 GPUs, packed as the planner's policy packs them
    nodes = {op.node for op in attaches}
    uid = uid_of(dds, "job-a")
    assert booked(dds) == {node: uid for node in nodes}, "booked from the first GPU on"
    assert dds.events("ProvisioningRequest", "job-a", "AttachingCapacity")

    passes_until(dds, "job-a Provisioned", lambda: is_true(dds, "job-a", "Provisioned"))
    provisioned = condition(dds, "job-a", "Provisioned")
    assert provisioned["reason"] == "CapacityAttached"
    assert all(node in provisioned["message"] for node in nodes) and "A30" in provisioned["message"]
    assert dds.events("ProvisioningRequest", "job-a", "CapacityAttached")
    assert dds.replicas("workers") == 2 and dds.node_names() == [w1, w2], "no node added"

    # Another pod arrives before the job's: the booked GPUs are not its to take.
    dds.create_pod("other", gpus=1)
    dds.wait_unschedulable("other")
    for index in range(2):
        create_consumer(dds, f"job-a-{index}", "job-a", gpus=2)
    dds.run_once()  # the job's pods get the booking's toleration
    job_a = client.CoreV1Api(dds.api).read_namespaced_pod("job-a-0", dds.namespace)
    assert any(t.key == BOOKED_TAINT_KEY and t.value == uid for t in job_a.spec.tolerations or ())
    placed = {dds.wait_running(f"job-a-{index}") for index in range(2)}
    assert placed == nodes
    assert dds.pod_node("other") is None

    dds.run_once()
    assert booked(dds) == {}, "every pod of the request is bound: the booking ends"
    assert all(dds.events("Node", node, "BookingReleased") for node in nodes)
    assert is_true(dds, "job-a", "Provisioned") and condition(dds, "job-a", "Failed") is None
    assert condition(dds, "job-a", "Provisioned")["reason"] == "CapacityConsumed", "the booking served its pods"


def test_a_request_the_pool_cannot_serve_fails_and_nothing_is_attached(dds: ControllerHarness):
    create_request(dds, "too-big", count=4, gpus=2)  # 8 GPUs, the cluster has 6 in all
    create_request(dds, "no-template", count=1, gpus=1, template=False)
    dds.run_once()
    failed = condition(dds, "too-big", "Failed")
    assert failed["status"] == "True" and failed["reason"] == "LargerThanCluster"
    assert "nothing attached" in failed["message"]
    assert dds.events("ProvisioningRequest", "too-big", "LargerThanCluster")
    refused = condition(dds, "no-template", "Failed")
    assert refused["status"] == "True" and refused["reason"] == "InvalidRequest"
    assert f"PodTemplate {dds.namespace}/no-template-main does not exist" in refused["message"]
    assert dds.events("ProvisioningRequest", "no-template", "InvalidRequest")
    assert dds.operations() == [] and booked(dds) == {}
    assert condition(dds, "too-big", "Provisioned") is None

    # A request that fits, made after: served in the same way, the failed ones left as they are.
    create_request(dds, "fits", count=1, gpus=2)
    dds.run_once()
    assert [op.requested for op in dds.operations(started_by="provisioning/")] == [2]
    dds.run_once()
    assert len(dds.events("ProvisioningRequest", "too-big", "LargerThanCluster")) == 1
    assert dds.operations(started_by="provisioning/")[0].requested == 2


def test_a_request_deleted_after_provisioning_releases_its_capacity(dds: ControllerHarness):
    provision(dds, "job-b", count=1, gpus=4)
    [node] = booked(dds)
    assert dds.gpus_allocatable(node) == 4
    dds.create_pod("other", gpus=3)  # only the booked node can hold it (the pool has 2 GPUs left)
    dds.wait_unschedulable("other")
    dds.run_once()
    assert dds.pod_node("other") is None

    custom(dds).delete_namespaced_custom_object(API_GROUP, API_VERSION, dds.namespace, PLURAL, "job-b")
    wait_for("job-b gone", lambda: not custom(dds).list_namespaced_custom_object(
        API_GROUP, API_VERSION, dds.namespace, PLURAL)["items"])
    dds.run_once()
    assert booked(dds) == {}
    assert dds.events("Node", node, "BookingReleased")
    assert dds.wait_running("other") == node, "the GPUs gathered for the request are anyone's again"


def test_a_booking_whose_pods_never_come_expires_and_is_released(dds: ControllerHarness):
    provision(dds, "job-c", count=1, gpus=2)
    [node] = booked(dds)  # and the job's pod never comes (its job was deleted, say, before Kueue admitted it)

    dds.clock.advance(BOOKING_SECONDS / 2)
    dds.run_once()
    assert booked(dds) == {node: uid_of(dds, "job-c")}, "within the bound: still booked"
    assert condition(dds, "job-c", "BookingExpired") is None

    dds.clock.advance(BOOKING_SECONDS / 2 + 1)
    dds.run_once()
    expired = condition(dds, "job-c", "BookingExpired")
    assert expired["status"] == "True" and expired["reason"] == "BookingExpired"
    assert node in expired["message"] and "0 of the request's 1 pod(s)" in expired["message"]
    assert dds.events("ProvisioningRequest", "job-c", "BookingExpired")
    assert booked(dds) == {}
    assert dds.events("Node", node, "BookingReleased")


def test_a_booked_node_lost_before_the_pods_bind_revokes_the_capacity(dds: ControllerHarness):
    """Provisioned on both workers; one is deleted before the job's pods come: the request says CapacityRevoked (so
    Kueue deactivates the job rather than leave its pods waiting), with an Event, and the other worker is let go."""
    provision(dds, "job-d", count=2, gpus=3)
    uid = uid_of(dds, "job-d")
    assert set(booked(dds).values()) == {uid} and len(booked(dds)) == 2
    lost, kept = sorted(booked(dds))
    dds.core.delete_node(lost)
    wait_for(f"{lost} gone", lambda: lost not in {n.metadata.name for n in dds.core.list_node().items})
    passes_until(dds, "job-d CapacityRevoked", lambda: is_true(dds, "job-d", "CapacityRevoked"))
    revoked = condition(dds, "job-d", "CapacityRevoked")
    assert revoked is not None and revoked["status"] == "True" and revoked["reason"] == "BookedCapacityLost"
    assert "0 of the request's 2 pod(s) bound" in revoked["message"] and kept in revoked["message"]
    assert [e.message for e in dds.events("ProvisioningRequest", "job-d", "CapacityRevoked")] == [revoked["message"]]
    assert booked(dds) == {} and dds.events("Node", kept, "BookingReleased")
    assert is_true(dds, "job-d", "Provisioned"), "what was provisioned is not unsaid, only revoked"


def test_with_the_api_served_at_start_requests_are_watched_and_read_without_a_list(dds: ControllerHarness):
    """A DDS started where ProvisioningRequests are served watches them (its ServiceAccount's `watch` grant) and reads
    them from the watch cache: a pass sends no LIST for them."""
    cache = cluster_cache(dds.dds_api, provisioning=True)
    assert cache.provisioning is not None, "the CRD is installed: the requests are watched"
    cache.start()
    try:
        assert cache.wait_synced(60)
        reader = ProvisioningRequestReader(dds.dds_api, DEFAULT_CLASS, cached=cache.provisioning)
        create_request(dds, "job-w", count=1, gpus=1)
        wait_for("the watch to bring job-w", lambda: any(r.name == "job-w" for r in reader.read().requests))
        before = instrument(dds.dds_api).snapshot().get("LIST", 0)
        [request] = [r for r in reader.read().requests if r.name == "job-w"]
        assert request.error is None and request.pods == 1
        assert instrument(dds.dds_api).snapshot().get("LIST", 0) == before, "read from the cache, not listed"
    finally:
        cache.stop()


# --- cluster-autoscaler's best-effort-atomic class: CA's scale-up reaches DDS as an IncreaseSize with no pod behind it,
# and CA writes the request's conditions (the test does CA's part: the call, then Provisioned=True). ---

def ca_says_provisioned(dds: ControllerHarness, request: str) -> None:
    """What CA writes once its scale-up call succeeded (besteffortatomic/provisioning_class.go)."""
    now = datetime.fromtimestamp(dds.clock(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    custom(dds).patch_namespaced_custom_object_status(API_GROUP, API_VERSION, dds.namespace, PLURAL, request, {
        "status": {"conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": now},
            {"type": "Provisioned", "status": "True", "reason": "CapacityIsProvisioned", "message": "",
             "lastTransitionTime": now}]}})


def test_cas_atomic_scale_up_for_a_request_is_served_by_attaches_booked_until_its_pods_bind(dds: ControllerHarness):
    group = dds.group("workers")
    create_request(dds, "ca-job", count=2, gpus=2, klass=CA_ATOMIC_CLASS)
    dds.run_once()
    assert dds.operations() == [] and booked(dds) == {}, "the loop leaves CA's class to CA's call"
    assert condition(dds, "ca-job", "Accepted") is None, "CA's conditions are CA's to write"

    instances = dds.app.scale_up.increase(group, 2, "ca-request-1")  # no pod pending: CA's atomic scale-up

    assert [i.kind.value for i in instances] == ["gpu", "gpu"], "CA's units are the attaches, no node"
    attaches = dds.operations()
    assert sum(op.requested for op in attaches) == 4
    nodes = {op.node for op in attaches}
    uid = uid_of(dds, "ca-job")
    assert booked(dds) == {node: uid for node in nodes}, "booked before the GPUs are there"
    [said] = dds.events("ProvisioningRequest", "ca-job", "AttachingCapacity")
    assert "cluster-autoscaler's scale-up of" in said.message and all(f"to {n}" in said.message for n in nodes)
    assert condition(dds, "ca-job", "Provisioned") is None

    ca_says_provisioned(dds, "ca-job")
    passes_until(dds, "the GPU instances ended with their attaches (target size back to the live nodes)",
                 lambda: all(dds.app.tracker.get(i.id) is None for i in instances))
    assert booked(dds) == {node: uid for node in nodes}, "held for the job's pods, not idle"
    dds.create_pod("other", gpus=1)
    dds.wait_unschedulable("other")
    for index in range(2):
        create_consumer(dds, f"ca-job-{index}", "ca-job", gpus=2)
    dds.run_once()  # the job's pods get the booking's toleration
    assert {dds.wait_running(f"ca-job-{index}") for index in range(2)} == nodes
    assert dds.pod_node("other") is None
    dds.run_once()
    assert booked(dds) == {}, "every pod bound: the booking ends"
    assert dds.events("ProvisioningRequest", "ca-job", "CapacityConsumed")
    assert condition(dds, "ca-job", "Provisioned")["reason"] == "CapacityIsProvisioned", "DDS wrote no condition"
    assert dds.replicas("workers") == 2


def test_cas_atomic_scale_up_the_pool_cannot_serve_is_refused_with_why_and_nothing_attached(dds: ControllerHarness):
    create_request(dds, "ca-too-big", count=4, gpus=2, klass=CA_ATOMIC_CLASS)  # 8 GPUs, the cluster has 6 in all
    with pytest.raises(ScaleUpRefused, match="no ProvisioningRequest of class best-effort-atomic"):
        dds.app.scale_up.increase(dds.group("workers"), 2, "ca-request-1")
    assert dds.operations() == [] and booked(dds) == {}
    [said] = dds.events("ProvisioningRequest", "ca-too-big", "LargerThanCluster")
    assert "nothing attached or added" in said.message
    assert condition(dds, "ca-too-big", "Failed") is None, "CA marks it Provisioned=False and retries"


def test_a_stale_increase_with_no_pod_and_no_request_behind_it_adds_nothing_and_is_not_refused(
        dds: ControllerHarness):
    """CA asked for a pod the scheduler has bound since: success with nothing added (target size unchanged), so CA
    closes the scale-up at its next loop instead of backing the group off."""
    group = dds.group("workers")
    dds.create_pod("bound-meanwhile")
    dds.wait_running("bound-meanwhile")

    assert dds.app.scale_up.increase(group, 1, "ca-request-1") == []
    assert not dds.app.tracker.list(group.id) and dds.operations() == [] and dds.replicas("workers") == 2
