"""Batch Jobs admitted by the real Kueue through ProvisioningRequests that DDS serves (issue 42, docs/kueue.md).

One stack for the module: DDS as a process under its shipped RBAC, the real cluster-autoscaler 1.36.1 with
--enable-provisioning-requests under its shipped RBAC and that flag's overlay (manifests/cluster-autoscaler/
provisioning-requests), kube-controller-manager's Job controller and garbage collector, and Kueue's manager built from its Go module, with its
CRDs, webhooks and own ServiceAccount (harness/kueue.py). Kueue is set up as a Kueue user would for DDS: a
ClusterQueue whose AdmissionCheck is Kueue's provisioning check with a ProvisioningRequestConfig of class
`attach-or-provision.dds.cdi.dev`, and a LocalQueue in the workload namespace.

Two workers of 4 GPU slots, each with the one GPU a node boots with, a pool of 12 A30s, the group's maximum 4 nodes. A Job is created
suspended with the queue's label; Kueue reserves quota, creates the ProvisioningRequest and its PodTemplate, DDS plans
the pods as one gang and attaches (and adds a node only where attaches cannot serve), sets `Provisioned`, Kueue admits
the Job, the Job controller makes the pods and kube-scheduler binds them on the booked nodes. (kwok completes a Job's
pod as soon as it runs: harness/kwok_stages.yaml, so "started" below is Running or Succeeded.)

One case uses cluster-autoscaler's own `best-effort-atomic-scale-up.autoscaling.x-k8s.io` class instead (a second
queue): CA's scale-up reaches DDS as an IncreaseSize with no pod behind it, which DDS plans for the request.

The time from the Job's creation to its admission and to all its pods started is printed (run with -s to see it); it
is measured here, not asserted: speed goals live in docs/kueue.md and the benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import pytest
from kubernetes import client

from dds import crashpoints
from dds.kube.capi import MACHINES, CapiObjects, name_of, namespace_of, node_ref_name
from dds.model.groups import ANN_CAPI_MAX, ANN_GPU_IDLE_COOLDOWN, ANN_NODE_IDLE_COOLDOWN
from dds.model.provisioning import (API_GROUP, API_VERSION, BOOKED_TAINT_KEY, CA_ATOMIC_CLASS, CONSUME_ANNOTATION,
                                    DEFAULT_CLASS, PLURAL)
from harness.controlplane import GARBAGE_COLLECTOR, JOB_CONTROLLER
from harness.kueue import PROVISIONING_CHECK_CONTROLLER, KueueManager
from harness.stack import WORKLOAD_NAMESPACE, Stack, StackOptions, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.cluster_facts import describe, fabric_facts, log_lines, machineset_replicas

pytestmark = pytest.mark.e2e

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's pkg/controller/constants QueueLabel
LOCAL_QUEUE = "gpus"
CLUSTER_QUEUE = "gpus"
CHECK = "dds-provisioning"
SLOTS = 4
WORKERS = 2
POOL = 12
QUOTA = 32  # GPUs Kueue admits at once: more than the pool, so that DDS, not the quota, is what refuses a job
# Bounds against a hung run only: Kueue requeues, DDS passes every second, attaches take 1-2 s, a node 10 s.
SETUP_TIMEOUT_S = 120.0
ADMIT_TIMEOUT_S = 180.0


@dataclass
class KueueRun:
    stack: Stack
    kueue: KueueManager
    workers: frozenset[str]  # the group's nodes before any Job

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.stack.api)

    def describe(self) -> str:
        requests = "; ".join(f"{r['metadata']['name']}: {conditions(r)}" for r in provisioning_requests(self))
        workloads = "; ".join(f"{w['metadata']['name']}: {conditions(w)}" for w in self.workloads())
        return (f"{describe(self.stack)} | requests: {requests} | workloads: {workloads}\n"
                f"Kueue log tail:\n{self.kueue.log_tail(15)}")

    def wait_for(self, what: str, predicate: Any, timeout: float) -> Any:
        if not self.kueue.running():
            raise AssertionError(f"Kueue stopped:\n{self.kueue.log_tail()}")
        return self.stack.wait_for(what, predicate, timeout, describe=self.describe, interval=0.2)

    def workloads(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_NAMESPACE,
                                                         "workloads")["items"]


def provisioning_requests(run: KueueRun) -> list[dict[str, Any]]:
    return run.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, WORKLOAD_NAMESPACE, PLURAL)["items"]


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or ()}


def condition(obj: dict[str, Any], kind: str) -> Optional[dict[str, Any]]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def kueue_setup(run: KueueRun) -> None:
    """What a Kueue user writes to send GPU Jobs through DDS's class: flavor, config, check, queues."""
    def create(plural: str, body: dict[str, Any], namespace: Optional[str] = None) -> None:
        body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body}
        if namespace:
            run.custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, plural, body)
        else:
            run.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)

    create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": "default"}, "spec": {}})
    create("provisioningrequestconfigs", {"kind": "ProvisioningRequestConfig", "metadata": {"name": "dds"},
                                          "spec": {"provisioningClassName": DEFAULT_CLASS,
                                                   "managedResources": ["nvidia.com/gpu"]}})
    create("admissionchecks", {"kind": "AdmissionCheck", "metadata": {"name": CHECK},
                               "spec": {"controllerName": PROVISIONING_CHECK_CONTROLLER,
                                        "parameters": {"apiGroup": KUEUE_GROUP, "kind": "ProvisioningRequestConfig",
                                                       "name": "dds"}}})
    create("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [{"name": "default", "resources": [
                                {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(QUOTA)}]}]}],
        "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]}}})
    create("localqueues", {"kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE},
                           "spec": {"clusterQueue": CLUSTER_QUEUE}}, WORKLOAD_NAMESPACE)

    def active(plural: str, name: str) -> bool:
        obj = run.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
        return conditions(obj).get("Active") == "True"
    run.wait_for("the AdmissionCheck Active (Kueue found its ProvisioningRequestConfig)",
                 lambda: active("admissionchecks", CHECK), SETUP_TIMEOUT_S)
    run.wait_for("the ClusterQueue Active", lambda: active("clusterqueues", CLUSTER_QUEUE), SETUP_TIMEOUT_S)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[KueueRun]:
    options = StackOptions(pool_size=POOL, workers=WORKERS, attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0,
                           machineset_annotations={"dds.cdi.dev/max-gpus-per-node": str(SLOTS), ANN_CAPI_MAX: "4"},
                           # Scale-down is not what this module is about: the Jobs' nodes stay for the next test.
                           autoscaler_timings={"scale_down_unneeded_time": 600.0},
                           controller_manager=True, controllers=(JOB_CONTROLLER, GARBAGE_COLLECTOR),
                           provisioning_requests=True)
    with start_stack(tmp_path_factory.mktemp("kueue"), options) as stack:
        stack.wait_for("two Ready workers with their boot GPU",
                       lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) >= 1]) == WORKERS,
                       SETUP_TIMEOUT_S, lambda: describe(stack))
        with KueueManager(stack.control_plane) as kueue:
            run = KueueRun(stack, kueue, frozenset(n.metadata.name for n in stack.nodes()))
            kueue_setup(run)
            yield run


def batch_job(name: str, pods: int, gpus: int, queue: str = LOCAL_QUEUE) -> dict[str, Any]:
    """A training Job as a Kueue user submits it: suspended, labelled with the LocalQueue, GPUs in its pod template."""
    template = pod(name, memory_gib=2, gpus=gpus)
    spec = {**template["spec"], "restartPolicy": "Never"}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE, "labels": {QUEUE_LABEL: queue}},
            "spec": {"suspend": True, "parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


@dataclass(frozen=True)
class Admission:
    """One Job through Kueue and DDS: when each step was first seen (seconds after the Job was created)."""

    request: dict[str, Any]  # the ProvisioningRequest, as it was once Provisioned
    pods: list[Any]  # the Job's pods, all started
    provisioned_s: float
    admitted_s: float
    started_s: float

    def report(self, name: str) -> str:
        return (f"[kueue] {name}: ProvisioningRequest Provisioned {self.provisioned_s:.1f} s, Job admitted "
                f"{self.admitted_s:.1f} s, all {len(self.pods)} pods started {self.started_s:.1f} s after the Job "
                f"was created")


def job_pods(run: KueueRun, name: str) -> list[Any]:
    return run.stack.core.list_namespaced_pod(WORKLOAD_NAMESPACE, label_selector=f"job-name={name}").items


def request_of(run: KueueRun, job: str) -> Optional[dict[str, Any]]:
    """The ProvisioningRequest Kueue made for the Job's Workload (each owned by the one before)."""
    return next(iter(requests_of(run, job)), None)


def requests_of(run: KueueRun, job: str) -> list[dict[str, Any]]:
    """Every ProvisioningRequest Kueue made for the Job's Workload (a retry is a new one)."""
    workloads = {w["metadata"]["name"] for w in run.workloads() if owned_by(w, "Job", job)}
    return [r for r in provisioning_requests(run) if any(owned_by(r, "Workload", workload) for workload in workloads)]


def owned_by(obj: dict[str, Any], kind: str, name: str) -> bool:
    return any(o["kind"] == kind and o["name"] == name for o in obj["metadata"].get("ownerReferences") or ())


def submit(run: KueueRun, name: str, pods: int, gpus: int) -> Admission:
    """Create the Job and follow it to all its pods started; every step bounded by ADMIT_TIMEOUT_S."""
    began = time.monotonic()
    client.BatchV1Api(run.stack.api).create_namespaced_job(WORKLOAD_NAMESPACE, batch_job(name, pods, gpus))
    return follow(run, name, pods, began)


def wait_provisioned(run: KueueRun, name: str) -> dict[str, Any]:
    """The Job's ProvisioningRequest once it is Provisioned (never Failed on the way)."""
    def provisioned() -> Optional[dict[str, Any]]:
        request = request_of(run, name)
        if request is None:
            return None
        failed = condition(request, "Failed")
        assert failed is None or failed["status"] != "True", f"{name}'s request Failed: {failed}"
        return request if conditions(request).get("Provisioned") == "True" else None
    return run.wait_for(f"{name}'s ProvisioningRequest Provisioned", provisioned, ADMIT_TIMEOUT_S)


def follow(run: KueueRun, name: str, pods: int, began: float) -> Admission:
    """A created Job followed to its request Provisioned, its admission and all its pods started."""
    batch = client.BatchV1Api(run.stack.api)
    request = wait_provisioned(run, name)
    provisioned_s = time.monotonic() - began
    run.wait_for(f"{name} admitted (unsuspended by Kueue)",
                 lambda: batch.read_namespaced_job(name, WORKLOAD_NAMESPACE).spec.suspend is False, ADMIT_TIMEOUT_S)
    admitted_s = time.monotonic() - began

    def started() -> list[Any]:
        found = job_pods(run, name)
        return found if len(found) == pods and all(p.status.phase in ("Running", "Succeeded") for p in found) else []
    started_pods = run.wait_for(f"{name}'s {pods} pods started", started, ADMIT_TIMEOUT_S)
    admission = Admission(request, started_pods, provisioned_s, admitted_s, time.monotonic() - began)
    print(admission.report(name), flush=True)
    return admission


def check_served_by_its_booking(admission: Admission, booked: Optional[set[str]] = None) -> set[str]:
    """Every pod consumed the request (Kueue's annotation), tolerated its booking (DDS's toleration), and ran on a
    node the request's Provisioned message names; that message names every node of `booked`. Returns the nodes the
    pods ran on: kwok ends a Job's pods at once and the Job controller creates them in batches, so later pods may take
    the GPUs earlier ones left on one booked node, and not every booked node need run one."""
    request = admission.request
    assert request["spec"]["provisioningClassName"] == DEFAULT_CLASS
    provisioned = condition(request, "Provisioned")
    assert provisioned is not None and provisioned["reason"] == "CapacityAttached", provisioned
    uid, name = request["metadata"]["uid"], request["metadata"]["name"]
    nodes = set()
    for started in admission.pods:
        assert (started.metadata.annotations or {}).get(CONSUME_ANNOTATION) == name
        assert any(t.key == BOOKED_TAINT_KEY and t.value == uid for t in started.spec.tolerations or ()), \
            f"{started.metadata.name} lacks the booking's toleration"
        assert started.spec.node_name and started.spec.node_name in provisioned["message"], \
            (started.spec.node_name, provisioned["message"])
        nodes.add(started.spec.node_name)
    assert all(node in provisioned["message"] for node in booked or ()), (booked, provisioned["message"])
    return nodes


def test_a_job_kueue_admits_is_served_by_attaches_on_live_nodes_with_no_node_added(run: KueueRun):
    workers = {n.metadata.name for n in run.stack.nodes()}
    assert len(workers) == WORKERS and fabric_facts(run.stack).attached_count() == WORKERS

    admission = submit(run, "train-attach", pods=4, gpus=2)  # 8 GPUs: the two workers' 4 slots each, 6 attaches

    assert check_served_by_its_booking(admission, booked=workers) <= workers
    assert {n.metadata.name for n in run.stack.nodes()} == workers and machineset_replicas(run.stack) == WORKERS, \
        "no node added"
    assert fabric_facts(run.stack).attached_count() == WORKERS * SLOTS
    run.wait_for("the booking released once every pod is bound",
                 lambda: not any(t.key == BOOKED_TAINT_KEY for n in run.stack.nodes() for t in n.spec.taints or ()),
                 ADMIT_TIMEOUT_S)


def test_a_job_that_attaches_cannot_serve_gets_a_node_too(run: KueueRun):
    workers = {n.metadata.name for n in run.stack.nodes()}

    # 3 x 4 GPUs: the two workers hold one pod each (4 slots), the third needs a node of its own.
    admission = submit(run, "train-node", pods=3, gpus=4)

    check_served_by_its_booking(admission)
    added = {n.metadata.name for n in run.stack.nodes()} - workers
    # Provisioned on the two workers and the added node, one pod each. Where each pod then runs is kube-scheduler's:
    # kwok ends a Job's pod as soon as it runs, so the last pod DDS lets onto the booking may take a worker the first
    # two have already left (seen on a loaded machine), and the added node may run none of them.
    provisioned = condition(admission.request, "Provisioned")
    assert provisioned is not None and len(added) == 1, added
    assert all(f"{node} (1 pod(s), 4 GPU(s)" in provisioned["message"] for node in workers | added), provisioned
    assert machineset_replicas(run.stack) == WORKERS + 1
    assert fabric_facts(run.stack).attached_count() == (WORKERS + 1) * SLOTS == POOL


def test_a_job_the_pool_cannot_serve_stays_suspended_and_its_request_fails_saying_why(run: KueueRun):
    nodes = {n.metadata.name for n in run.stack.nodes()}
    attached = fabric_facts(run.stack).attached_count()
    batch = client.BatchV1Api(run.stack.api)
    # 5 x 4 GPUs: more than the group's 4 nodes of 4 slots and than the pool's 12 GPUs; within Kueue's quota.
    batch.create_namespaced_job(WORKLOAD_NAMESPACE, batch_job("train-too-big", pods=5, gpus=4))

    def failed() -> Optional[dict[str, Any]]:
        request = request_of(run, "train-too-big")
        found = condition(request, "Failed") if request else None
        return found if found and found["status"] == "True" else None
    refused = run.wait_for("train-too-big's request Failed", failed, ADMIT_TIMEOUT_S)
    assert refused["reason"] in ("LargerThanCluster", "CapacityNotFound"), refused
    assert "nothing attached or added" in refused["message"], refused
    assert batch.read_namespaced_job("train-too-big", WORKLOAD_NAMESPACE).spec.suspend is True
    assert job_pods(run, "train-too-big") == []
    assert fabric_facts(run.stack).attached_count() == attached
    assert {n.metadata.name for n in run.stack.nodes()} == nodes
    assert not any(t.key == BOOKED_TAINT_KEY for n in run.stack.nodes() for t in n.spec.taints or ())
    batch.delete_namespaced_job("train-too-big", WORKLOAD_NAMESPACE, propagation_policy="Background")


# --- capacity given back: the cases below run on a cluster scaled back to its workers, idle GPUs detached ---

GPU_COOLDOWN, NODE_COOLDOWN = "2s", "4s"  # the group's idle cooldowns from here on (MachineSet annotations)
SETTLE_TIMEOUT_S = 120.0  # cooldowns (2 s, 4 s), detaches (1-2 s), DDS's 1 s passes, a loaded 2-core machine


def settled(run: KueueRun) -> None:
    """The cluster at rest with short cooldowns: only the workers (each kept by a CPU pod, so the group's scale-down
    takes the nodes Jobs added, not them), every idle GPU detached, no fabric operation running, no booking."""
    custom = client.CustomObjectsApi(run.stack.api)
    custom.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "default", "machinesets", "gpu-workers", {
        "metadata": {"annotations": {ANN_GPU_IDLE_COOLDOWN: GPU_COOLDOWN, ANN_NODE_IDLE_COOLDOWN: NODE_COOLDOWN}}})
    present = {p.metadata.name for p in run.stack.pods()}
    for node in sorted(run.workers):
        name = f"keep-{node}"
        if name not in present:
            body = pod(name, memory_gib=1)
            body["spec"]["nodeName"] = node
            run.stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, body)

    def at_rest() -> bool:
        facts = fabric_facts(run.stack)
        nodes = run.stack.nodes()
        return ({n.metadata.name for n in nodes} == run.workers and facts.attached_count() == 0
                and not facts.running("attach") and not facts.running("detach")
                and all(gpus_allocatable(n) == 0 for n in nodes) and not booked_nodes(run))
    run.wait_for("the workers alone, every idle GPU detached", at_rest, SETTLE_TIMEOUT_S)


def booked_nodes(run: KueueRun) -> dict[str, str]:
    return {n.metadata.name: t.value for n in run.stack.nodes() for t in n.spec.taints or ()
            if t.key == BOOKED_TAINT_KEY}


def events_of(run: KueueRun, kind: str, name: str) -> list[Any]:
    """Events about one object (DDS's and others'), oldest first."""
    events = run.stack.core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind={kind},involvedObject.name={name}").items
    return sorted(events, key=lambda e: e.metadata.creation_timestamp)


def seen_since(events: list[Any], reason: str, since: float) -> list[Any]:
    """The Events of `reason` last seen at or after `since` (a repeat bumps an Event's lastTimestamp and count)."""
    return [e for e in events if e.reason == reason
            and (e.last_timestamp or e.event_time or e.metadata.creation_timestamp).timestamp() >= since]


def attach_operations_since(run: KueueRun, began: float) -> list[dict[str, Any]]:
    return [op for op in fabric_facts(run.stack).operations if op["kind"] == "attach" and op["started_at"] >= began]


def ended_attaches_since(run: KueueRun, began: float) -> Optional[list[dict[str, Any]]]:
    """The attaches begun since `began`, once there are some and none is still running."""
    attaches = attach_operations_since(run, began)
    return attaches if attaches and all(op["state"] != "running" for op in attaches) else None


def test_a_job_deleted_after_provisioning_gives_back_every_gpu_and_node_gathered_for_it(run: KueueRun):
    """The user deletes a Job Kueue admitted: its Workload and ProvisioningRequest go with it (garbage collector),
    DDS releases the booking, the GPUs it attached go back to the pool after the idle cooldown, and the node it added
    is removed once empty: the pool and the group exactly as before the Job."""
    settled(run)
    batch = client.BatchV1Api(run.stack.api)
    began = time.time()
    # 3 x 4 GPUs: the two workers take one pod each (4 attaches each), the third needs a node (and its 4 GPUs).
    batch.create_namespaced_job(WORKLOAD_NAMESPACE, batch_job("train-deleted", pods=3, gpus=4))
    request = wait_provisioned(run, "train-deleted")
    name, uid = request["metadata"]["name"], request["metadata"]["uid"]
    added = {n.metadata.name for n in run.stack.nodes()} - run.workers
    assert len(added) == 1, added
    assert fabric_facts(run.stack).attached_count() == POOL
    booked = {node for node, token in booked_nodes(run).items() if token == uid}
    assert booked == run.workers | added or booked == set(), booked  # all or none (its pods may all have bound)

    batch.delete_namespaced_job("train-deleted", WORKLOAD_NAMESPACE, propagation_policy="Background")
    custom = run.custom

    def request_gone() -> bool:
        try:
            custom.get_namespaced_custom_object(API_GROUP, API_VERSION, WORKLOAD_NAMESPACE, PLURAL, name)
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False
    run.wait_for(f"{name} deleted with its Job's Workload", request_gone, ADMIT_TIMEOUT_S)
    run.wait_for("the Job's pods gone", lambda: not job_pods(run, "train-deleted"), ADMIT_TIMEOUT_S)
    run.wait_for("no node booked for the deleted request", lambda: uid not in booked_nodes(run).values(),
                 ADMIT_TIMEOUT_S)
    for node in run.workers:  # its booking released, said on each node it held (unless the node went)
        assert seen_since(events_of(run, "Node", node), "BookingReleased", began - 1), \
            f"no BookingReleased Event on {node}"

    settled(run)  # the GPUs detached after the 2 s cooldown, the added node removed after 4 s empty
    assert machineset_replicas(run.stack) == WORKERS
    for node in run.workers:
        assert seen_since(events_of(run, "Node", node), "DetachedGPU", began - 1), f"no DetachedGPU Event on {node}"
    assert not [e for e in run.stack.core.list_namespaced_event(WORKLOAD_NAMESPACE).items
                if e.reason in ("CapacityRevoked", "BookingExpired") and e.involved_object.name == name]


def test_dds_sigkilled_mid_provisioning_provisions_the_request_once_when_restarted(run: KueueRun):
    """DDS dies (SIGKILL, dds/crashpoints.py) right after the fabric accepted the first attach for a request it had
    booked nodes for; the restarted DDS finds the bookings on the nodes and the attaches in the fabric, attaches
    nothing twice, says Provisioned once, and the Job runs; once it has, its GPUs go back to the pool."""
    settled(run)
    stack = run.stack
    began = time.time()
    stack.restart_dds(env={crashpoints.ENV: "fabric.attach.accepted"})
    killed = stack.dds
    assert killed is not None
    created = time.monotonic()
    # 4 x 2 GPUs: 4 attaches on each worker, no node added.
    client.BatchV1Api(stack.api).create_namespaced_job(WORKLOAD_NAMESPACE, batch_job("train-crash", pods=4, gpus=2))
    run.wait_for("DDS killing itself once the fabric accepted an attach", lambda: not killed.running, ADMIT_TIMEOUT_S)
    assert f"{crashpoints.LOG_MARKER} fabric.attach.accepted" in killed.log_path.read_text()
    stack.restart_dds()

    admission = follow(run, "train-crash", pods=4, began=created)
    assert check_served_by_its_booking(admission, booked=set(run.workers)) <= run.workers
    assert {n.metadata.name for n in stack.nodes()} == run.workers, "no node added"
    attaches = attach_operations_since(run, began)
    attached = [device for op in attaches for device in op["devices"]]
    assert len(attached) == len(set(attached)) == 4 * 2, f"GPUs attached twice or more than needed: {attaches}"
    request = admission.request
    provisioned = [e for e in events_of(run, "ProvisioningRequest", request["metadata"]["name"])
                   if e.reason == "CapacityAttached"]
    assert len(provisioned) == 1 and (provisioned[0].count or 1) == 1, \
        [(e.reason, e.count, e.message) for e in provisioned]
    assert [r["metadata"]["name"] for r in requests_of(run, "train-crash")] == [request["metadata"]["name"]], \
        "Kueue retried the request"

    settled(run)  # the Job's pods ended (kwok), the booking released, its 8 GPUs detached after the cooldown


CA_QUEUE = "gpus-ca-atomic"  # LocalQueue and ClusterQueue whose check asks cluster-autoscaler's own atomic class
CA_CHECK = "ca-atomic-provisioning"


def ca_atomic_queue(run: KueueRun) -> None:
    """A Kueue user's queue whose ProvisioningRequestConfig names CA's `best-effort-atomic-scale-up` class (once)."""
    custom = run.custom
    if any(q["metadata"]["name"] == CA_QUEUE for q in custom.list_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues")["items"]):
        return
    body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}"}
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "provisioningrequestconfigs", {
        **body, "kind": "ProvisioningRequestConfig", "metadata": {"name": "ca-atomic"},
        "spec": {"provisioningClassName": CA_ATOMIC_CLASS, "managedResources": ["nvidia.com/gpu"]}})
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", {
        **body, "kind": "AdmissionCheck", "metadata": {"name": CA_CHECK},
        "spec": {"controllerName": PROVISIONING_CHECK_CONTROLLER,
                 "parameters": {"apiGroup": KUEUE_GROUP, "kind": "ProvisioningRequestConfig", "name": "ca-atomic"}}})
    custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", {
        **body, "kind": "ClusterQueue", "metadata": {"name": CA_QUEUE}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                "flavors": [{"name": "default", "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": str(QUOTA)}]}]}],
            "admissionChecksStrategy": {"admissionChecks": [{"name": CA_CHECK}]}}})
    custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_NAMESPACE, "localqueues", {
        **body, "kind": "LocalQueue", "metadata": {"name": CA_QUEUE}, "spec": {"clusterQueue": CA_QUEUE}})

    def active() -> bool:
        queue = custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", CA_QUEUE)
        return conditions(queue).get("Active") == "True"
    run.wait_for("the ClusterQueue of CA's class Active", active, SETUP_TIMEOUT_S)


def ca_backoffs(run: KueueRun) -> list[str]:
    """cluster-autoscaler's log lines saying it backs a group off after a failed scale-up."""
    return log_lines(run.stack.autoscaler.log_path, "Disabling scale-up for node group")


def test_a_job_through_cas_own_atomic_class_is_admitted_through_attaches_with_no_node_added(run: KueueRun):
    """Kueue asks for the Job's capacity with cluster-autoscaler's `best-effort-atomic-scale-up` class. CA finds no
    live node holding the pods (the workers' GPU slots are empty), simulates the group's template and calls
    IncreaseSize (externalgrpc has no AtomicIncreaseSize); no pod is behind the call, so DDS plans the request's pods
    as one gang: 8 attaches on the two workers, both booked for the request, no node. CA says Provisioned, Kueue
    admits, the pods run on the booked workers, the booking goes once they bound; CA backs nothing off."""
    settled(run)
    ca_atomic_queue(run)
    stack = run.stack
    backoffs = len(ca_backoffs(run))
    began = time.time()
    created = time.monotonic()
    client.BatchV1Api(stack.api).create_namespaced_job(
        WORKLOAD_NAMESPACE, batch_job("train-ca-atomic", pods=4, gpus=2, queue=CA_QUEUE))

    admission = follow(run, "train-ca-atomic", pods=4, began=created)

    request = admission.request
    name, uid = request["metadata"]["name"], request["metadata"]["uid"]
    assert request["spec"]["provisioningClassName"] == CA_ATOMIC_CLASS
    provisioned = condition(request, "Provisioned")
    assert provisioned is not None and provisioned["reason"] == "CapacityIsProvisioned", "CA's own condition"
    assert {n.metadata.name for n in stack.nodes()} == run.workers and machineset_replicas(stack) == WORKERS, \
        "no node added"
    # kwok ends a Job's pods at once: the Job may be done on the first worker's GPUs before the second worker's attach
    # has ended, so its devices are counted once every attach begun for the request has ended.
    attaches = run.wait_for("every attach for the request ended", lambda: ended_attaches_since(run, began),
                            ADMIT_TIMEOUT_S)
    attached = [device for op in attaches for device in op["devices"]]
    assert len(attached) == len(set(attached)) == 4 * 2 and {op["node"] for op in attaches} == run.workers, attaches
    for started in admission.pods:
        assert (started.metadata.annotations or {}).get(CONSUME_ANNOTATION) == name
        assert any(t.key == BOOKED_TAINT_KEY and t.value == uid for t in started.spec.tolerations or ()), \
            f"{started.metadata.name} lacks the booking's toleration"
        assert started.spec.node_name in run.workers
    said = [e for e in events_of(run, "ProvisioningRequest", name) if e.reason == "AttachingCapacity"]
    assert said and "cluster-autoscaler's scale-up of" in said[0].message \
        and all(f"to {node}" in said[0].message for node in run.workers), [e.message for e in said]
    run.wait_for("the booking released once every pod bound", lambda: uid not in booked_nodes(run).values(),
                 ADMIT_TIMEOUT_S)
    assert [e for e in events_of(run, "ProvisioningRequest", name) if e.reason == "CapacityConsumed"]
    assert ca_backoffs(run)[backoffs:] == [], "CA backed a group off"

    settled(run)


def test_a_booked_node_lost_before_the_pods_bound_revokes_the_capacity_and_kueue_deactivates_the_job(run: KueueRun):
    """The Job's pods wait behind a scheduling gate (as pods of a job may wait on something else), so the booking
    holds; then a booked worker's machine fails (its Machine deleted, as harness/crash_campaign.py fails machines).
    DDS says `CapacityRevoked` with why, and Kueue deactivates the Job rather than leave its pods waiting for capacity
    that is gone. Last in the module: the lost worker is replaced by the MachineSet, with another name."""
    settled(run)
    batch = client.BatchV1Api(run.stack.api)
    body = batch_job("train-revoked", pods=2, gpus=4)  # one pod per worker, 3 attaches each
    body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "example.com/dataset-staged"}]
    batch.create_namespaced_job(WORKLOAD_NAMESPACE, body)
    request = wait_provisioned(run, "train-revoked")
    name, uid = request["metadata"]["name"], request["metadata"]["uid"]
    run.wait_for("the Job admitted, its 2 pods made and held by their gate",
                 lambda: len(job_pods(run, "train-revoked")) == 2, ADMIT_TIMEOUT_S)
    assert {node for node, token in booked_nodes(run).items() if token == uid} == run.workers
    assert all(p.spec.node_name is None for p in job_pods(run, "train-revoked"))

    lost, kept = sorted(run.workers)
    capi = CapiObjects(run.stack.api)
    machine = next(m for m in capi.list(MACHINES) if node_ref_name(m) == lost)
    capi.delete(MACHINES, namespace_of(machine), name_of(machine))

    def revoked() -> Optional[dict[str, Any]]:
        current = run.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, WORKLOAD_NAMESPACE, PLURAL, name)
        found = condition(current, "CapacityRevoked")
        return found if found and found["status"] == "True" else None
    said = run.wait_for(f"{name} CapacityRevoked", revoked, ADMIT_TIMEOUT_S)
    assert said["reason"] == "BookedCapacityLost" and kept in said["message"], said
    warned = [e for e in events_of(run, "ProvisioningRequest", name) if e.reason == "CapacityRevoked"]
    assert warned and warned[0].type == "Warning" and warned[0].message == said["message"]

    def deactivated() -> Optional[dict[str, Any]]:
        workload = next((w for w in run.workloads() if owned_by(w, "Job", "train-revoked")), None)
        return workload if workload is not None and workload["spec"].get("active") is False else None
    workload = run.wait_for("Kueue deactivating the Job's Workload", deactivated, ADMIT_TIMEOUT_S)
    rejected = [e for e in events_of(run, "Workload", workload["metadata"]["name"])
                if e.reason == "AdmissionCheckRejected"]
    assert rejected and said["message"][:80] in rejected[0].message, [e.message for e in rejected]
    run.wait_for("the Job suspended again, its pods gone",
                 lambda: batch.read_namespaced_job("train-revoked", WORKLOAD_NAMESPACE).spec.suspend is True
                 and not job_pods(run, "train-revoked"), ADMIT_TIMEOUT_S)
    run.wait_for(f"the booking on {kept} released", lambda: uid not in booked_nodes(run).values(), ADMIT_TIMEOUT_S)
    batch.delete_namespaced_job("train-revoked", WORKLOAD_NAMESPACE, propagation_policy="Background")
