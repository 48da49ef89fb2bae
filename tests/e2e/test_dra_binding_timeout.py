"""DRA pool mode with a fabric slower than kube-scheduler's binding timeout (KEP-5007; issue 27, part 4).

kube-scheduler waits in PreBind for a pool slot's binding condition at most its DynamicResources `bindingTimeout`
(here 15 s; DDS is told the same with `dra_binding_timeout_seconds`), and every attach of this fabric takes 25 s. So no
attach can finish in time: DDS sets the failure condition dds.cdi.dev/attach-failed before the timeout, the scheduler
deallocates the claim and allocates again (a new attach, which fails the same way), and each GPU an abandoned attach
brings is detached back to the pool when the attach ends. Once the pod is deleted nothing stays attached.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from dds.model.groups import ANN_GPU_API, GpuApi
from harness.stack import ROOT, WORKLOAD_NAMESPACE, Stack, StackOptions, is_ready, start_stack
from harness.versions import active_profile
from tests.e2e.cluster_facts import dds_events, describe, fabric_facts
from tests.e2e.test_dra_node_local import claim_template, dra_pod
from tests.e2e.test_dra_pool_mode import pool_mode_gates, pool_slots

pytestmark = pytest.mark.e2e

TIMEOUT = 150.0
BINDING_TIMEOUT_SECONDS = 15.0
ATTACH_SECONDS = 25.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=4, attach_latency=(ATTACH_SECONDS, ATTACH_SECONDS), detach_latency=(1.0, 2.0),
                           gpu_idle_cooldown_seconds=600.0, node_idle_cooldown_seconds=600.0, autoscaler=False,
                           controller_manager=True, feature_gates=pool_mode_gates(active_profile()),
                           dra_binding_timeout_seconds=BINDING_TIMEOUT_SECONDS,
                           dds_settings={"dra_binding_timeout_seconds": BINDING_TIMEOUT_SECONDS},
                           machineset_annotations={ANN_GPU_API: GpuApi.DRA_POOL.value,
                                                   "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "0"})
    with start_stack(tmp_path_factory.mktemp("dra-binding-timeout"), options) as stack:
        resource = client.ResourceV1Api(stack.api)
        resource.create_device_class(yaml.safe_load((ROOT / "manifests" / "dra" / "deviceclass.yaml").read_text()))
        resource.create_namespaced_resource_claim_template(WORKLOAD_NAMESPACE, claim_template("one-gpu"))
        stack.wait_for("two Ready workers and the pool's free slots",
                       lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2 and len(pool_slots(stack)) == 4,
                       TIMEOUT, lambda: describe(stack))
        yield stack


def test_an_attach_slower_than_the_binding_timeout_fails_is_retried_and_leaves_nothing_attached(stack: Stack) -> None:
    stack.core.create_namespaced_pod(WORKLOAD_NAMESPACE, dra_pod("slow-0", "one-gpu"))

    def attaches_for_the_pod() -> list[str]:
        return [e.uid for e in dds_events(stack) if e.reason == "AttachingGPU" and e.involved == "pod/slow-0"]

    # DDS gives up on the first attach before the scheduler's timeout, the scheduler allocates again: a second attach.
    stack.wait_for("the failure condition set and a second allocation's attach started",
                   lambda: "binding timeout" in stack.dds.log_path.read_text() and len(attaches_for_the_pod()) >= 2,
                   TIMEOUT, lambda: f"{describe(stack)} | {[e.line() for e in dds_events(stack)]}")
    pod = stack.core.read_namespaced_pod("slow-0", WORKLOAD_NAMESPACE)
    assert pod.spec.node_name is None  # never bound on a GPU that was not there

    stack.core.delete_namespaced_pod("slow-0", WORKLOAD_NAMESPACE, grace_period_seconds=0)
    # Every attach started for it ends within ATTACH_SECONDS; its GPU is then detached back to the pool.
    def nothing_attached() -> bool:
        facts = fabric_facts(stack)  # a device attaching or detaching is on its node too
        return facts.attached_count() == 0 and not facts.running("attach") and not facts.running("detach")

    stack.wait_for("no GPU attached and none on its way", nothing_attached, ATTACH_SECONDS * 2 + TIMEOUT / 2,
                   lambda: f"{describe(stack)} | attached: {fabric_facts(stack).attached()}")
    log = stack.dds.log_path.read_text()
    assert "pool mode: releasing" in log
