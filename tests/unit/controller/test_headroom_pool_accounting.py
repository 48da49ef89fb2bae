"""Room headroom and warm headroom are planned in one pass on one snapshot: warm headroom is planned on the snapshot
as it will be once room headroom's attaches are started, so the two never count on the same free GPU."""

from __future__ import annotations

from dds.planner.passes import with_attaches as _with_attaches
from dds.model.plan import Attach
from tests.unit.planner.builders import make_node, make_pool, make_snapshot


def test_a_plan_after_attaches_sees_their_devices_gone_from_the_pool_and_on_their_way() -> None:
    snapshot = make_snapshot(nodes=[make_node("a", gpus=1), make_node("b")], pools=[make_pool(A30=3, T4=1)])
    after = _with_attaches(snapshot, [Attach(node="b", pool="pool-a", model="A30", count=2, pods=(), reason="room"),
                                      Attach(node="a", pool="pool-a", model="A30", count=1, pods=(), reason="room")])
    assert dict(after.pools[0].free) == {"A30": 0, "T4": 1}
    assert {n.name: n.attaching for n in after.nodes} == {"a": 1, "b": 2}
    assert after.pods == snapshot.pods and after.groups == snapshot.groups


def test_no_attaches_leave_the_snapshot_as_it_is() -> None:
    snapshot = make_snapshot(nodes=[make_node("a")])
    assert _with_attaches(snapshot, []) is snapshot
