"""DDS, the real CDI operator (DEVICE_PLUGIN mode, through the cluster manager) and the real cluster-autoscaler on a
node side as slow as real hardware (issue 38, deliverable 4): harness/gpu_node_agent.py NodeTimings, scaled down.

- The GPU driver pod of a node comes only DRIVER_DELAY_S after the node's first GPU (on a real server node feature
  discovery labels the node, then the GPU operator builds the driver: minutes; REALISTIC_NODE has 180 s). Until then
  the node shows no GPU, nvidia-smi cannot run and the operator reports "nvidia-driver-daemonset pod is not found"
  on the resource, longer than DDS's error bound here (OPERATOR_ERROR_BOUND_S).
- The GPU operator's device-plugin and DCGM DaemonSets have a pod on every GPU node, and the operator's restart of them
  after each attach and detach really restarts them: every GPU node's `nvidia.com/gpu` allocatable drops to 0 for
  PLUGIN_RESTART_S (REALISTIC_NODE's 20 s), its capacity unchanged.

The workers boot with no GPU, so each first GPU meets the slow driver. What a user must see: a pending GPU pod gets
exactly one GPU (one resize at the cluster manager, nothing given back, no node added) however long the driver takes;
and while another node's allocatable is down for a plugin restart, a pod that fits that node's idle GPU waits for it:
cluster-autoscaler adds no node and DDS attaches nothing for it.

A module of its own (one operator per machine: its webhook port is fixed; and the stack's node side is slow for
every test in it). Counted at the cluster-manager emulator: its resize calls (`increase_resource_count` for an add,
`remove_resources` for a give-back or detach) and its attachments.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.cdi_stack import cdi_options, fabric_side
from harness.gpu_node_agent import REALISTIC_NODE, DeviceMode, NodeTimings
from harness.stack import WORKLOAD_NAMESPACE, StackOptions, gpus_allocatable, is_ready, pod, start_stack
from tests.e2e.test_cdi_operator_device_plugin import DevicePluginRun

pytestmark = pytest.mark.e2e

# REALISTIC_NODE's driver delay (180 s) scaled down to what a test can wait, still three times DDS's error bound
# below: a DDS that took the operator's "driver pod not found" for a failure would give the GPU back.
DRIVER_DELAY_S = 45.0
PLUGIN_RESTART_S = REALISTIC_NODE.plugin_restart_s  # 20 s: ten of CA's scans
OPERATOR_ERROR_BOUND_S = 15.0
POOL_SIZE = 6
# The driver's delay, the operator's 30 s look after its resize, then another look (loaded machine).
SERVE_TIMEOUT_S = DRIVER_DELAY_S + 150.0
SETTLE_TIMEOUT_S = 300.0
NO_GPU = {"capacity.cluster-autoscaler.kubernetes.io/gpu-count": "0"}  # the workers boot GPU-less


@dataclass
class SlowNodeRun(DevicePluginRun):
    """The device-plugin e2e's view of the stack, plus each resize the cluster manager accepted with its action."""

    accepted: list[tuple[str, str]] = field(default_factory=list)  # (machine, action), in order

    def describe(self) -> str:
        nodes = "; ".join(f"{n.metadata.name}: {self.capacity(n.metadata.name)} GPU(s), {gpus_allocatable(n)} "
                          f"allocatable" for n in self.stack.nodes())
        return f"{super().describe()}\nnodes: {nodes} | resizes: {self.resizes()}"

    def allocatable(self, node: str) -> int:
        return gpus_allocatable(self.core.read_node(node))

    def resizes(self, action: str = "") -> list[tuple[str, str]]:
        """(machine, action) of each resize the cluster manager accepted, in order; only `action`'s when given."""
        return [(machine, kind) for machine, kind in self.accepted if not action or kind == action]


def record_resizes(run: SlowNodeRun) -> None:
    """Each resize the cluster manager accepts, with its action (its call records keep no body)."""
    manager = run.cm
    answer = manager.resize

    def recorded(tenant_uuid: str, cluster_uuid: str, machine_uuid: str, body: Any) -> None:
        answer(tenant_uuid, cluster_uuid, machine_uuid, body)
        run.accepted.append((machine_uuid, next(iter(body))))

    manager.resize = recorded  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlowNodeRun]:
    options = cdi_options(StackOptions(
        attach_latency=(3.0, 4.0), detach_latency=(1.0, 2.0), node_provisioning_seconds=12.0,
        # Nothing detached or removed while the tests run: the idle GPU of the second test must stay.
        gpu_idle_cooldown_seconds=900.0, node_idle_cooldown_seconds=900.0, pool_size=POOL_SIZE,
        machineset_annotations=NO_GPU,
        dds_settings={"composability": {"operator_error_bound_seconds": OPERATOR_ERROR_BOUND_S}}),
        device_mode=DeviceMode.DEVICE_PLUGIN,
        node_timings=NodeTimings(driver_delay_s=DRIVER_DELAY_S, plugin_restart_s=PLUGIN_RESTART_S))
    stack = start_stack(tmp_path_factory.mktemp("cdi-realistic-node"), options)
    try:
        started = SlowNodeRun(stack, fabric_side(stack), set())
        record_resizes(started)
        started.wait_for("two Ready workers, GPU-less", lambda: len(
            [n for n in stack.nodes() if is_ready(n)]) == 2, SETTLE_TIMEOUT_S)
        started.workers = started.live_workers()
        assert all(started.capacity(n) == 0 for n in started.workers)
        yield started
    finally:
        stack.close()


def attached_total(run: SlowNodeRun) -> int:
    return sum(len(serials) for serials in run.cm.attachments().values())


def test_a_pending_pod_on_gpu_less_workers_gets_one_gpu_however_late_the_driver_comes(run: SlowNodeRun) -> None:
    """first-0 needs a GPU, no worker has one. DDS attaches one; the node shows it only once its driver pod runs,
    DRIVER_DELAY_S later, and the operator reports the missing driver pod meanwhile. CA scans all that time with the
    pod pending. One resize, nothing given back, no node added, no AttachFailed; the pod runs on that GPU."""
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("first-0", memory_gib=8, gpus=1))
    node = run.wait_for("first-0 Running", lambda: run.running_on("first-0"), SERVE_TIMEOUT_S)
    assert run.side.agent is not None and run.side.agent.driver_ready(node), f"{node}'s driver not up, yet the pod runs"
    run.wait_for(f"the operator's resource of {node} Online", lambda: _all_online(run, node))
    time.sleep(5)  # a few more DDS passes and CA scans
    assert run.live_workers() == run.workers, "a node was added for a pod one GPU serves"
    assert not run.events("AddingNode"), [e.message for e in run.events("AddingNode")]
    assert not run.events("AttachFailed"), [e.message for e in run.events("AttachFailed")]
    assert attached_total(run) == 1 and run.capacity(node) == 1, run.describe()
    assert len(run.resizes("increase_resource_count")) == 1, run.describe()
    assert not run.resizes("remove_resources"), "the first GPU was given back"


def test_a_device_plugin_restart_elsewhere_makes_no_node_and_no_second_attach(run: SlowNodeRun) -> None:
    """first-0 ends: its GPU stays attached, idle, on its worker (the cooldown is long). pinned-0 must run on the
    other worker: DDS attaches that worker's first GPU. As soon as the cluster manager has added it (before the node
    shows it: the slow driver again) the operator restarts the device-plugin DaemonSet cluster-wide, and the idle
    GPU's worker shows 0 allocatable for PLUGIN_RESTART_S, its capacity unchanged. after-0, made then, fits only that
    idle GPU: kube-scheduler and CA see no room for it anywhere for that long. CA adds no node, DDS attaches nothing
    for it (it counts the worker's devices, not its allocatable), and after-0 runs on the idle GPU once the plugin is
    back; pinned-0 runs once the other worker's driver is up."""
    idle_node = run.running_on("first-0")
    assert idle_node, "the first test's pod is not running"
    other = next(iter(run.workers - {idle_node}))
    run.core.delete_namespaced_pod("first-0", WORKLOAD_NAMESPACE, grace_period_seconds=0)
    run.wait_for("first-0 gone", lambda: not [p for p in run.stack.pods() if p.metadata.name == "first-0"])
    agent = run.side.agent
    assert agent is not None
    run.wait_for(f"{idle_node}'s idle GPU allocatable (no restart under way)", lambda: run.allocatable(idle_node) == 1)
    restarts_before = agent.plugin_restarts
    increases_before = len(run.resizes("increase_resource_count"))

    pinned = pod("pinned-0", memory_gib=8, gpus=1)
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": other}
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pinned)
    run.wait_for(f"the device plugin restarted after the add to {other}: {idle_node} at 0 allocatable", lambda: (
        agent.plugin_restarts > restarts_before and run.capacity(idle_node) == 1
        and run.allocatable(idle_node) == 0), SERVE_TIMEOUT_S)
    assert len(run.resizes("increase_resource_count")) == increases_before + 1, run.describe()
    flap_seen_at = time.monotonic()
    run.core.create_namespaced_pod(WORKLOAD_NAMESPACE, pod("after-0", memory_gib=8, gpus=1))
    assert run.wait_for("after-0 Running", lambda: run.running_on("after-0"), SERVE_TIMEOUT_S) == idle_node
    held = time.monotonic() - flap_seen_at
    assert held > 2, f"after-0 ran {held:.1f} s after the flap was seen: the flap did not hold it"
    assert run.wait_for("pinned-0 Running", lambda: run.running_on("pinned-0"), SERVE_TIMEOUT_S) == other
    time.sleep(10)  # more DDS passes and CA scans after it
    assert run.live_workers() == run.workers, "CA added a node while a plugin restart hid a GPU"
    assert not run.events("AddingNode"), [e.message for e in run.events("AddingNode")]
    assert not run.events("AttachingGPU", "after-0"), [e.message for e in run.events("AttachingGPU", "after-0")]
    assert len(run.resizes("increase_resource_count")) == increases_before + 1, run.describe()
    assert not run.resizes("remove_resources"), "a GPU was given back"
    assert attached_total(run) == 2 and run.capacity(idle_node) == 1 and run.capacity(other) == 1, run.describe()
    assert not run.events("AttachFailed"), [e.message for e in run.events("AttachFailed")]
    print(f"after-0 held {held:.1f} s by the plugin restart; {agent.plugin_restarts} restarts in the module")


def _all_online(run: SlowNodeRun, node: str) -> bool:
    mine = run.resources_on(node)
    return bool(mine) and all((r.get("status") or {}).get("state") == "Online" for r in mine)
