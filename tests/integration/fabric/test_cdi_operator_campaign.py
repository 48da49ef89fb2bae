"""A reliability campaign on the real CDI operator (issue 38, docs/reliability.md "The CDI operator under kills").

Attach/detach cycles through DDS's ComposabilityRequest backend (DRA mode, the fabric-manager API) while DDS, the
operator and the fabric manager's service are killed at random points:

- DDS: its fabric object is dropped and built again (DDS keeps nothing else: a new process finds every operation in
  the requests' annotations), right after a call or in the middle of following it;
- the operator: SIGKILL (its webhook stays registered with failurePolicy Fail, so DDS's writes are refused until it
  is back), then started again;
- the fabric manager: its service goes down for up to 2 s and comes back (the hardware keeps its state; a call under
  way may lose its answer).

After every cycle: every operation DDS started ended (bounded by its error and wait bounds), no device is attached
twice (the node never holds more devices than DDS's request asks for), and once the cycle's detach (or the failed
attach's give-back) is through, nothing is left: no ComposableResource, nothing attached to the node's machine. The
figures are printed at the end (`campaign:`) and are those of docs/reliability.md.

`make test` runs a short variant (CAMPAIGN_CYCLES_SHORT cycles); `make soak` the long one (slow, CAMPAIGN_CYCLES).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pytest

from dds.fabric.base import AttachRequest, DetachRequest, FabricError, Operation, OperationState
from tests.integration.fabric.test_composability_contract import (  # noqa: F401 (fixtures)
    MODEL, NODES, POOL, RealOperatorHarness, World, fresh, reset, world)
from tests.unit.fabric import contract

pytestmark = pytest.mark.integration

CAMPAIGN_CYCLES = 50
CAMPAIGN_CYCLES_SHORT = 6
ERROR_BOUND_S = 10.0
WAIT_BOUND_S = 60.0
OPERATION_END_S = WAIT_BOUND_S + 60.0  # every operation ends by then (its bound, and a few polls of the operator)
RETRY_S = 60.0  # a call refused while the operator or its webhook is down is asked again, as DDS's next passes do
CLEAN_S = 120.0
KILLS = ("none", "dds", "operator", "fabric-manager")
POINTS = ("after-attach", "while-attaching", "after-detach", "while-detaching")


@dataclass
class Figures:
    cycles: int = 0
    kills: Counter = field(default_factory=Counter)
    attaches: Counter = field(default_factory=Counter)  # by end state
    detaches: Counter = field(default_factory=Counter)
    refused_then_retried: int = 0
    double_attaches: int = 0
    leaks: int = 0
    unended: int = 0

    def line(self) -> str:
        kills = ", ".join(f"{k} {n}" for k, n in sorted(self.kills.items()))
        return (f"campaign: {self.cycles} cycles, kills: {kills}; attaches {dict(self.attaches)}, detaches "
                f"{dict(self.detaches)}; calls refused then retried {self.refused_then_retried}; double attaches "
                f"{self.double_attaches}, leaks {self.leaks}, operations not ended {self.unended}")


class Campaign:
    def __init__(self, world: World, seed: int) -> None:
        self.world = world
        self.rng = random.Random(seed)
        self.h = RealOperatorHarness(world, error_bound_s=ERROR_BOUND_S, wait_bound_s=WAIT_BOUND_S)
        self.figures = Figures()

    def close(self) -> None:
        self.h.close()

    # -- kills --
    def kill(self, what: str) -> None:
        self.figures.kills[what] += 1
        if what == "dds":
            self.h.restart()
        elif what == "operator":
            self.world.operator.kill()
            self.world.operator.restart()
        elif what == "fabric-manager":
            self.world.fm.restart_service(down_s=self.rng.uniform(0.0, 2.0))

    # -- calls, as DDS's passes make them --
    def call(self, start: Callable[[], Operation]) -> Operation:
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                return start()
            except FabricError as exc:
                self.figures.refused_then_retried += 1
                if time.monotonic() > deadline:
                    raise AssertionError(f"a call refused for {RETRY_S:.0f} s: {exc}") from exc
                time.sleep(1.0)

    def follow(self, key: str, kill_at: float, kill: str) -> Operation:
        started = time.monotonic()
        killed = kill == "none"
        while True:
            if not killed and time.monotonic() - started >= kill_at:
                self.kill(kill)
                killed = True
            try:
                op = self.h.fabric.operation(key)
            except FabricError:
                op = None  # the apiserver blinked; ask again
            if op is not None and op.state.done:
                return op
            if time.monotonic() - started > OPERATION_END_S:
                self.figures.unended += 1
                raise AssertionError(f"operation {key} did not end in {OPERATION_END_S:.0f} s: {op}\n"
                                     f"requests: {self.h.requests()}\n{self.world.operator.log_tail(40)}")
            time.sleep(0.2)

    # -- invariants --
    def check_no_double_attach(self, node: str) -> None:
        machine = self.world.machines[node]
        on_machine = len(self.world.fm.attachments().get(machine, []))
        asked = sum(int(r["spec"]["resource"].get("size", 0)) for r in self.h.requests()
                    if r["spec"]["resource"].get("target_node") == node)
        listed = sum(1 for r in self.h.resources() if r["spec"].get("target_node") == node)
        if on_machine > max(asked, listed):
            self.figures.double_attaches += 1
            raise AssertionError(f"{node}: {on_machine} device(s) attached for {asked} asked "
                                 f"({listed} ComposableResources)")

    def check_clean(self, node: str) -> None:
        machine = self.world.machines[node]
        deadline = time.monotonic() + CLEAN_S
        while self.h.resources() or self.world.fm.attachments().get(machine):
            if time.monotonic() > deadline:
                self.figures.leaks += 1
                raise AssertionError(f"{node}: left after the cycle: resources {self.h.resources()}, fabric "
                                     f"{self.world.fm.attachments()}\n{self.world.operator.log_tail(40)}")
            time.sleep(0.5)

    # -- one cycle --
    def cycle(self, index: int) -> None:
        node = self.rng.choice(NODES)
        kill, point = self.rng.choice(KILLS), self.rng.choice(POINTS)
        kill_at = self.rng.uniform(0.0, 3.0)
        attach_key = f"c{index}-attach"
        attached = self.call(lambda: self.h.fabric.attach(AttachRequest(
            key=attach_key, node=node, pool=POOL, model=MODEL, count=1, reason="campaign")))
        if point == "after-attach":
            self.kill(kill)
        attached = self.follow(attach_key, kill_at, kill if point == "while-attaching" else "none")
        self.figures.attaches[attached.state.value] += 1
        self.check_no_double_attach(node)
        if attached.state == OperationState.SUCCEEDED:
            detach_key = f"c{index}-detach"
            self.call(lambda: self.h.fabric.detach(DetachRequest(key=detach_key, node=node,
                                                                 device_ids=attached.devices)))
            if point == "after-detach":
                self.kill(kill)
            detached = self.follow(detach_key, kill_at, kill if point == "while-detaching" else "none")
            self.figures.detaches[detached.state.value] += 1
        self.check_clean(node)
        assert contract.free(self.h.fabric) == contract.TOTAL, f"cycle {index}: the pool is not whole"
        self.figures.cycles += 1


def run(world: World, cycles: int, seed: int) -> Figures:
    campaign = Campaign(world, seed)
    try:
        for index in range(cycles):
            try:
                campaign.cycle(index)
            finally:
                print(campaign.figures.line())
    finally:
        campaign.close()
        if not world.operator.running():
            world.operator.restart()
    return campaign.figures


def _assert_clean(figures: Figures, cycles: int) -> None:
    assert figures.cycles == cycles
    assert (figures.double_attaches, figures.leaks, figures.unended) == (0, 0, 0), figures.line()


# The short campaign's seed: its six cycles draw every kind of kill at a point that does not depend on timing
# (DDS twice and the fabric manager after a call; the operator while a detach runs, 0.7 s into it), four kills in
# all, as many as the seed it replaces (38, which drew no DDS kill).
SHORT_SEED = 15


def test_attach_detach_cycles_with_kills_short(fresh: World) -> None:
    figures = run(fresh, CAMPAIGN_CYCLES_SHORT, seed=SHORT_SEED)
    _assert_clean(figures, CAMPAIGN_CYCLES_SHORT)
    assert figures.kills["dds"] >= 1 and figures.kills["fabric-manager"] >= 1, figures.line()


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_attach_detach_cycles_with_kills(fresh: World) -> None:
    figures = run(fresh, CAMPAIGN_CYCLES, seed=int(time.time()))
    _assert_clean(figures, CAMPAIGN_CYCLES)
    assert sum(n for k, n in figures.kills.items() if k != "none") >= CAMPAIGN_CYCLES // 2
    reset(fresh)
