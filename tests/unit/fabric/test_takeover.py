"""A standby DDS replica taking over: its fabric backend was built when it started, the previous leader acted since.

After `resync()` the new leader sees what the previous one did and can act on it (the simulated manager and the Redfish
operation log both keep their state in a compare-and-swap store). The ComposabilityRequest backend keeps no copy: every
read goes to the apiserver, so it has nothing to resync.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dds.fabric.base import ResumableFabric
from tests.unit.fabric.contract import NODE_A, NODE_B, TOTAL, assert_counts_add_up, attach, attached, free, online
from tests.unit.fabric.harnesses import RedfishHarness, SimulatedHarness


@pytest.fixture(params=["simulated", "redfish"])
def h(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "simulated":
        yield SimulatedHarness()
        return
    harness = RedfishHarness()
    try:
        yield harness
    finally:
        harness.close()


def test_after_resync_the_new_leader_sees_and_continues_what_the_previous_one_did(h):
    leader = h.fabric
    standby = h.restart()  # built now, as a standby replica is at its own start
    h.fabric = leader
    done = attached(h, "by-leader", NODE_A, 1)
    attach(h, "in-flight-at-takeover", NODE_A, 1)

    assert isinstance(standby, ResumableFabric)
    standby.resync()
    h.fabric = standby
    assert {o.key for o in standby.operations()} >= {"by-leader", "in-flight-at-takeover"}
    assert h.settle("in-flight-at-takeover").state.done
    # the previous leader's key is the same operation here too: a retried request never attaches twice
    assert attach(h, "by-leader", NODE_A, 1).devices == done.devices
    attached(h, "by-new-leader", NODE_B, 1)
    assert len(online(standby, NODE_A)) == 2 and len(online(standby, NODE_B)) == 1
    assert free(standby) == TOTAL - 3
    assert_counts_add_up(standby)
