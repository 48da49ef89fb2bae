"""A large GPU pod is not starved by small ones: on the real kube-scheduler, with DDS as a process (`dds serve`,
`reservations: true`) and the real cluster-autoscaler, an 8-GPU pod starts while 1-GPU pods keep arriving.

Two workers of 8 GPU slots (the group at its maximum size, so only GPUs move), a pool of 12 A30s. Ten 1-GPU pods
hold 10 of them: eight on worker A, two on worker B, 2 GPUs left in the pool. Then an 8-GPU pod arrives and, once a
second, the oldest small pod ends and a new one arrives. No node ever has 8 GPUs free on its own: each GPU a small pod
frees on A goes to the next small pod at once. Once the large pod has waited the reservation age, DDS reserves A
for it (a taint the pod alone tolerates): A's small pods end one by one and no new one lands there, while the new
small pods run on B with the pool's GPUs; the large pod starts on A when its last small pod is gone, and the
reservation is lifted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from dds.model.groups import ANN_CAPI_MAX
from dds.planner.reservations import RESERVATION_TAINT_KEY
from harness.stack import Stack, StackOptions, is_ready, pod, start_stack
from tests.e2e.cluster_facts import dds_events, describe, pods_running

pytestmark = pytest.mark.e2e

NAMESPACE = "demo"
TIMEOUT = 90.0
SLOTS = 8
MIN_AGE_SECONDS = 4.0
SMALL_PODS = 10  # small pods alive at any time: 8 on worker A, 2 on B, then whatever arrives
ARRIVAL_INTERVAL_SECONDS = 1.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    options = StackOptions(pool_size=12, attach_latency=(1.0, 2.0), detach_latency=(1.0, 2.0),
                           node_provisioning_seconds=10.0, gpu_idle_cooldown_seconds=600.0,
                           node_idle_cooldown_seconds=600.0,
                           machineset_annotations={"dds.cdi.dev/max-gpus-per-node": str(SLOTS), ANN_CAPI_MAX: "2"},
                           dds_settings={"reservations": True, "reservation_min_age_seconds": MIN_AGE_SECONDS})
    with start_stack(tmp_path_factory.mktemp("reservations"), options) as stack:
        stack.wait_for("two Ready workers", lambda: len([n for n in stack.nodes() if is_ready(n)]) == 2, TIMEOUT,
                       lambda: describe(stack))
        yield stack


def pinned_pod(name: str, node: str) -> dict[str, Any]:
    body = pod(name, memory_gib=2, gpus=1)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


@dataclass
class Watch:
    """What the test saw, once a second: the pods created (in order), where and when each first ran."""

    small: deque[str] = field(default_factory=deque)  # alive, oldest first
    created_at: dict[str, int] = field(default_factory=dict)  # pod -> tick it was created at
    bound_to: dict[str, str] = field(default_factory=dict)  # pod -> node kube-scheduler bound it to
    bound_at: dict[str, int] = field(default_factory=dict)  # pod -> tick it was first seen bound at
    ran_on: dict[str, str] = field(default_factory=dict)  # pod -> node it was first seen Running on
    ran_at: dict[str, int] = field(default_factory=dict)  # pod -> tick it was first seen Running at
    reserved_at: Optional[int] = None  # tick the reservation taint was first seen
    reserved_node: Optional[str] = None
    tick: int = 0
    next_index: int = SMALL_PODS


def reservation_on(stack: Stack) -> Optional[str]:
    for node in stack.nodes():
        if any(t.key == RESERVATION_TAINT_KEY for t in node.spec.taints or ()):
            return node.metadata.name
    return None


def look(stack: Stack, watch: Watch) -> None:
    for p in stack.pods():
        if p.spec.node_name and p.metadata.name not in watch.bound_to:
            watch.bound_to[p.metadata.name] = p.spec.node_name
            watch.bound_at[p.metadata.name] = watch.tick
        if p.status.phase == "Running" and p.metadata.name not in watch.ran_on:
            watch.ran_on[p.metadata.name] = p.spec.node_name
            watch.ran_at[p.metadata.name] = watch.tick
    if watch.reserved_at is None and (node := reservation_on(stack)) is not None:
        watch.reserved_at, watch.reserved_node = watch.tick, node


def small_pods_keep_coming(stack: Stack, watch: Watch) -> None:
    """The oldest small pod ends and a new one arrives: the stream of short jobs that starves a large one."""
    oldest = watch.small.popleft()
    stack.core.delete_namespaced_pod(oldest, NAMESPACE, grace_period_seconds=0)
    name = f"small-{watch.next_index}"
    watch.next_index += 1
    stack.core.create_namespaced_pod(NAMESPACE, pod(name, memory_gib=2, gpus=1))
    watch.small.append(name)
    watch.created_at[name] = watch.tick


def test_an_8_gpu_pod_starts_while_1_gpu_pods_keep_arriving(stack: Stack):
    node_a, node_b = sorted(n.metadata.name for n in stack.nodes())
    watch = Watch()
    for index in range(SMALL_PODS):
        name = f"small-{index}"
        stack.core.create_namespaced_pod(NAMESPACE, pinned_pod(name, node_a if index < SLOTS else node_b))
        watch.small.append(name)
        watch.created_at[name] = 0
    stack.wait_for("ten small pods Running, 8 on A and 2 on B", lambda: pods_running(stack, list(watch.small)),
                   TIMEOUT, lambda: describe(stack))

    stack.core.create_namespaced_pod(NAMESPACE, pod("big", memory_gib=16, gpus=SLOTS, cpu="4"))

    def big_running() -> bool:
        watch.tick += 1
        look(stack, watch)
        if watch.ran_on.get("big"):
            return True
        small_pods_keep_coming(stack, watch)
        return False

    stack.wait_for("the 8-GPU pod Running", big_running, TIMEOUT, lambda: describe(stack),
                   interval=ARRIVAL_INTERVAL_SECONDS)

    assert watch.reserved_node == node_a, (watch.reserved_node, describe(stack))
    assert watch.ran_on["big"] == node_a
    # Before the reservation, freed GPUs on A went to new small pods: without it the large pod would starve.
    before = [p for p, t in watch.created_at.items() if t and watch.bound_to.get(p) == node_a
              and watch.bound_at[p] <= (watch.reserved_at or 0)]
    assert before, f"no small pod took a GPU freed on A before the reservation: {watch}"
    # From the reservation on, small pods kept arriving and running, on B, and none landed on A.
    during = {p: watch.ran_on[p] for p, t in watch.created_at.items()
              if t > (watch.reserved_at or 0) and p in watch.ran_at and watch.ran_at[p] <= watch.ran_at["big"]}
    assert during, f"no small pod ran while the large pod waited for its reservation: {watch}"
    assert set(during.values()) == {node_b}, during
    late = {p: n for p, n in watch.bound_to.items() if watch.created_at.get(p, 0) > (watch.reserved_at or 0)}
    assert node_a not in late.values(), late

    events = dds_events(stack)
    reserved = [e for e in events if e.reason == "GPUsReserved" and e.involved == "pod/big"]
    assert reserved and f"{node_a} is reserved for it" in reserved[0].message, [e.line() for e in events]
    assert any(e.reason == "ReservedForPod" and e.involved == f"node/{node_a}" for e in events)
    stack.wait_for("the reservation lifted once the pod is bound", lambda: reservation_on(stack) is None
                   and any(e.reason == "ReservationReleased" and e.involved == f"node/{node_a}"
                           for e in dds_events(stack)), TIMEOUT, lambda: describe(stack))
