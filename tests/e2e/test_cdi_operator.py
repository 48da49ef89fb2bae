"""The talk's demo and its failure cases through CoHDI's real CDI operator and the real cluster-autoscaler (issue 24).

One stack for the module (harness/cdi_stack.py): DDS on `fabric: composability-request`, the composable-resource-
operator built from the pinned source in DRA mode under its shipped RBAC and webhook, the fabric-manager emulator, each
node's GPUs published by NVIDIA's DRA driver (harness/gpu_node_agent.py), pods asking for GPUs through ResourceClaims
selecting `gpu.nvidia.com` devices by productName. First the demo runs end to end (harness/demo_cdi.py); the tests
after it share the settled stack (two workers, one busy A30 each) and each leaves it settled again.

What is checked is what a user sees: pods Running, DDS's and CA's Events, nodes added and removed, and the fabric's own
view (the emulator's attachments: a device attached to no live node's machine is a leak).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from kubernetes import client

from dds import crashpoints
from harness.cdi_stack import MODEL, CdiFabricSide, delete_node_holding_devices, fabric_side
from harness.demo import DemoOptions, DemoResult, Entry, pod_state
from harness.demo_cdi import CdiDemo, cdi_demo_options
from harness.demo_dra import dra_pod
from harness.gpu_node_agent import NVIDIA_DRA_DRIVER, gpu_spec
from harness.stack import WORKLOAD_NAMESPACE, StackOptions

pytestmark = pytest.mark.e2e

ATTACH_LATENCY = (3.0, 4.0)
POOL_SIZE = 8
# Bounds only against a hung run: the operator requeues its waiting states every 30 s.
SERVE_TIMEOUT_S = 240.0
SETTLE_TIMEOUT_S = 240.0
CRO_GROUP, CRO_VERSION = "cro.hpsys.ibm.ie.com", "v1alpha1"


@dataclass
class CdiRun:
    demo: CdiDemo
    result: DemoResult
    side: CdiFabricSide
    workers_at_end: set[str]  # the demo's two workers, as it leaves them

    @property
    def core(self) -> client.CoreV1Api:
        return self.demo.stack.core

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.demo.stack.api)

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float) -> Any:
        return self.demo.stack.wait_for(what, predicate, timeout, describe=self.describe)

    def describe(self) -> str:
        return (f"pods: {self.demo.pods_describe()} | nodes: {self.demo.nodes_describe()} | slices: "
                f"{self.demo.slices()} | fabric: {self.side.emulator.attachments()}\n"
                f"operator log:\n{self.side.operator_log()}")

    def workers(self) -> set[str]:
        return {n.metadata.name for n in self.demo.nodes()}

    def events(self, reason: str, involved: str = "") -> list[Any]:
        return [e for e in self.core.list_event_for_all_namespaces().items
                if e.reason == reason and (not involved or e.involved_object.name == involved)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiRun]:
    # Node cooldown 20 s: the workers stand idle from Ready until both boot GPUs are attached and the demo's busy pods
    # come; with 10 s a slow attach (a loaded machine) let DDS remove an idle worker as the busy pods arrived, and a pod
    # took the GPU being detached (reported; the operator taints a GPU only after its in-use check).
    options = cdi_demo_options(DemoOptions(
        workdir=tmp_path_factory.mktemp("demo-cdi"), step_timeout_seconds=300.0, echo=True,
        stack=StackOptions(attach_latency=ATTACH_LATENCY, detach_latency=(1.0, 2.0), node_provisioning_seconds=12.0,
                           gpu_idle_cooldown_seconds=8.0, node_idle_cooldown_seconds=20.0, pool_size=POOL_SIZE)))
    demo = CdiDemo(options, sys.stdout)
    try:
        demo.start()
        result = demo.run()
        yield CdiRun(demo, result, fabric_side(demo.stack), {n.metadata.name for n in demo.nodes()})
    finally:
        demo.close()


def first(result: DemoResult, kind: str, subject: str, text: str) -> Entry:
    matches = [e for e in result.timeline if e.kind == kind and e.subject == subject and text in e.text]
    assert matches, f"no {kind} entry for {subject} containing {text!r}; timeline:\n" + \
        "\n".join(e.line() for e in result.timeline)
    return matches[0]


def assert_nothing_leaked(run: CdiRun) -> None:
    """Every device the fabric has attached is on a live node's machine and published in that node's slice."""
    live = {run.side.machine_of(name): name for name in run.workers()}
    attachments = run.side.emulator.attachments()
    stray = {machine: serials for machine, serials in attachments.items() if machine not in live and serials}
    assert not stray, f"devices attached to machines of no live node: {stray}"
    published = {s.spec.node_name: {d.attributes["uuid"].string for d in s.spec.devices or ()}
                 for s in client.ResourceV1Api(run.demo.stack.api).list_resource_slice().items
                 if s.spec.driver == NVIDIA_DRA_DRIVER}
    for machine, node in live.items():
        assert set(attachments.get(machine, [])) == published.get(node, set()), (node, attachments, published)


def settled(run: CdiRun) -> bool:
    """Back to the demo's end: its two workers, one device each in the fabric (busy-0's and busy-1's), and every
    ComposableResource Online (none attaching, none going: an operation still under way would carry into the next
    test, whose pod DDS would then plan onto the device on its way)."""
    workers = run.workers_at_end
    attachments = run.side.emulator.attachments()
    resources = run.custom.list_cluster_custom_object(CRO_GROUP, CRO_VERSION, "composableresources")["items"]
    quiet = all((r.get("status") or {}).get("state") == "Online" and not r["metadata"].get("deletionTimestamp")
                for r in resources)
    return quiet and run.workers() == workers and \
        all(len(attachments.get(run.side.machine_of(n), [])) == 1 for n in workers)


def wait_settled(run: CdiRun) -> None:
    run.wait_for("the two workers back to one A30 each in the fabric, every ComposableResource Online",
                 lambda: settled(run), SETTLE_TIMEOUT_S)
    assert_nothing_leaked(run)


def running(run: CdiRun, name: str) -> bool:
    pod = run.core.read_namespaced_pod(name, WORKLOAD_NAMESPACE)
    return pod.status.phase == "Running"


def finish(run: CdiRun, *names: str) -> None:
    for name in names:
        run.core.delete_namespaced_pod(name, WORKLOAD_NAMESPACE, grace_period_seconds=0)
    wait_settled(run)


# --- the demo ---

def test_the_gpu_path_is_one_attach_through_the_operator_and_no_node(run: CdiRun) -> None:
    result = run.result
    attaching = first(result, "dds", "pod/train-0", "AttachingGPU")
    running_at = first(result, "pod", "train-0", "Running")
    assert first(result, "pod", "train-0", "Pending").at <= attaching.at <= running_at.at
    assert not [e for e in result.timeline if e.kind == "dds" and "AddingNode" in e.text and e.at < running_at.at]
    # The operator's fabric calls did it: DDS's attaches are reported by the composability-request backend only, and
    # the fabric manager saw the operator's PATCHes.
    counts = {k: v for k, v in result.metrics.items() if k.startswith("dds_attach_duration_seconds_count{")}
    assert set(counts) == {'dds_attach_duration_seconds_count{backend="composability-request"}'}, counts
    # At least the three nodes' boot GPUs, train-0's, and the added node's second (mem-0 and mem-1 claim one each).
    assert result.gpus_attached >= 5 and result.gpus_attached_at_boot == 3
    patches = [c for c in run.side.emulator.calls() if c.method == "PATCH" and c.status == 200]
    assert len(patches) >= result.gpus_attached  # the operator attaches one device per fabric call


def test_the_node_path_adds_one_node_for_pods_no_live_node_can_take(run: CdiRun) -> None:
    result = run.result
    adding = first(run.result, "dds", "machineset/gpu-workers", "AddingNode")
    for name in ("mem-0", "mem-1"):
        assert adding.at <= first(result, "pod", name, "Running").at
    assert result.nodes_added == 1 and result.nodes_removed == 1


def test_idle_gpus_are_detached_after_the_cooldown_and_gone_from_the_fabric(run: CdiRun) -> None:
    result = run.result
    removed = [e for e in result.timeline if e.kind == "node" and "removed from the cluster" in e.text]
    assert len(removed) == 1
    node = removed[0].subject
    assert first(result, "dds", f"node/{node}", "DetachedGPU").at <= removed[0].at
    assert result.gpus_detached == result.gpus_attached - 2  # all but each worker's boot GPU went back
    # In the fabric: one A30 on each worker's machine, the removed node's machine empty, the rest back in the pool.
    attachments = run.side.emulator.attachments()
    assert sum(len(serials) for serials in attachments.values()) == 2, attachments
    assert run.side.emulator.free_count(MODEL) == POOL_SIZE - 2
    assert not run.side.devices_on(node)
    assert_nothing_leaked(run)


# --- failures, on the settled stack ---

def test_a_failed_attach_is_retried_and_the_pod_served_with_nothing_leaked(run: CdiRun) -> None:
    run.side.emulator.fail_next_attaches(1)
    failed_before = [c for c in run.side.emulator.calls() if c.method == "PATCH" and c.status >= 500]
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("retry-0", 8))
    seen_errors: set[str] = set()

    def served() -> bool:
        # What `kubectl get composableresources` shows while the operator retries: the fabric's answer.
        for plural in ("composableresources", "composabilityrequests"):
            for item in run.custom.list_cluster_custom_object(CRO_GROUP, CRO_VERSION, plural)["items"]:
                if (item.get("status") or {}).get("error"):
                    seen_errors.add(item["status"]["error"])
        return running(run, "retry-0")

    run.wait_for("retry-0 Running after the fabric failed its first attach", served, SERVE_TIMEOUT_S)
    failed = [c for c in run.side.emulator.calls() if c.method == "PATCH" and c.status >= 500]
    assert len(failed) == len(failed_before) + 1, "the injected fault was not hit"
    assert any("fabric switch did not answer the composition request" in e for e in seen_errors), seen_errors
    assert_nothing_leaked(run)
    finish(run, "retry-0")


def test_the_operator_restarted_mid_attach_still_serves_the_pod(run: CdiRun) -> None:
    free = run.side.emulator.free_count(MODEL)
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("restart-0", 8))
    # Mid-attach: the operator's call reached the fabric, which reserved a device and holds the call for the latency.
    run.wait_for("the operator's attach call reaching the fabric", lambda: run.side.emulator.free_count(MODEL) < free,
                 SERVE_TIMEOUT_S)
    assert run.side.operator is not None
    before_restart = run.side.operator.pid
    run.side.operator.restart()
    assert run.side.operator.pid != before_restart
    run.wait_for("restart-0 Running after the operator restarted", lambda: running(run, "restart-0"),
                 SERVE_TIMEOUT_S)
    assert_nothing_leaked(run)
    finish(run, "restart-0")


def test_a_model_no_fabric_device_has_is_refused_with_a_clear_event_and_no_node(run: CdiRun) -> None:
    resource = client.ResourceV1Api(run.demo.stack.api)
    product = gpu_spec("H100").product_name
    resource.create_namespaced_resource_claim(WORKLOAD_NAMESPACE, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "h100", "namespace": WORKLOAD_NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": NVIDIA_DRA_DRIVER,
            "selectors": [{"cel": {"expression": f"device.attributes['{NVIDIA_DRA_DRIVER}'].productName == "
                                                 f"'{product}'"}}]}}]}}})
    body = dra_pod("h100-0", 8)
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "h100"}]
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, body)
    nodes_before = run.workers()
    refused = run.wait_for("DDS's NoMatchingDevice Event for h100-0", lambda: run.events("NoMatchingDevice", "h100-0"),
                           SERVE_TIMEOUT_S)
    message = refused[0].message
    assert product in message and "no GPU DDS can attach satisfies it" in message, message
    time.sleep(10)  # a few loop passes and CA scans: still no node, no attach for it
    assert run.workers() == nodes_before
    assert not run.events("AddingNode", "h100-0") and not run.events("AttachingGPU", "h100-0")
    assert pod_state(run.core.read_namespaced_pod("h100-0", WORKLOAD_NAMESPACE)).startswith("Pending")
    run.core.delete_namespaced_pod("h100-0", WORKLOAD_NAMESPACE, grace_period_seconds=0)
    resource.delete_namespaced_resource_claim("h100", WORKLOAD_NAMESPACE)
    assert_nothing_leaked(run)


def test_dds_sigkilled_mid_attach_resumes_it_once_and_serves_the_pod(run: CdiRun) -> None:
    """DDS dies right after it wrote the request's new size (the operator is attaching, DDS has not followed it): the
    restarted DDS finds its operation in the request's record and follows it; no second device comes for the pod."""
    stack = run.demo.stack
    attached_before = sum(len(s) for s in run.side.emulator.attachments().values())
    patches_before = _fabric_attaches(run)
    stack.restart_dds(env={crashpoints.ENV: "fabric.attach.accepted"})
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("crash-0", 8))
    assert stack.dds is not None
    killed = stack.dds
    run.wait_for("DDS killing itself once the request's size is written", lambda: not killed.running, SERVE_TIMEOUT_S)
    assert f"{crashpoints.LOG_MARKER} fabric.attach.accepted" in killed.log_path.read_text()
    stack.restart_dds()
    run.wait_for("crash-0 Running after DDS restarted", lambda: running(run, "crash-0"), SERVE_TIMEOUT_S)
    time.sleep(5)  # a few more loop passes and CA scans: nothing else is attached for crash-0
    assert sum(len(s) for s in run.side.emulator.attachments().values()) == attached_before + 1
    assert _fabric_attaches(run) == patches_before + 1, "the fabric attached more than once for one pod"
    assert_nothing_leaked(run)
    finish(run, "crash-0")


def test_a_node_deleted_with_devices_attached_gets_them_detached_before_it_goes(run: CdiRun) -> None:
    """Someone deletes a worker that holds a GPU (busy). The operator alone would drop the node's ComposableResources
    without calling the fabric; DDS's finalizer keeps the Node while DDS detaches its devices through the operator
    (forced: the node's work goes with it), says so in an Event, and then lets the Node go. Last in the module: the
    stack is not put back (CA and the Cluster API part deal with the lost worker)."""
    node = sorted(run.workers())[0]
    machine = run.side.machine_of(node)
    assert run.side.devices_on(node), f"{node} holds no device to begin with"
    busy = [p.metadata.name for p in run.core.list_namespaced_pod(WORKLOAD_NAMESPACE).items
            if p.spec.node_name == node and p.status.phase == "Running"]
    assert busy, f"no pod runs on {node}: its GPU would not need the forced detach"
    detaches_before = _fabric_detaches(run, machine)
    delete_node_holding_devices(run, node, event_timeout=SERVE_TIMEOUT_S, gone_timeout=SETTLE_TIMEOUT_S)
    assert not run.side.emulator.attachments().get(machine), "the deleted node's devices stayed in the fabric"
    assert _fabric_detaches(run, machine) > detaches_before, "the devices left without a fabric detach"
    attached = sum(len(s) for s in run.side.emulator.attachments().values())
    assert run.side.emulator.free_count(MODEL) == POOL_SIZE - attached
    assert run.events("DetachedGPU", node), "DDS did not report the detach done"


def _fabric_attaches(run: CdiRun) -> int:
    return len([c for c in run.side.emulator.calls() if c.method == "PATCH" and c.status == 200])


def _fabric_detaches(run: CdiRun, machine: str) -> int:
    return len([c for c in run.side.emulator.calls() if c.method == "DELETE" and machine in c.path and c.status < 300])
