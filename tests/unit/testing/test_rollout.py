"""harness/rollout.py plays a Deployment's RollingUpdate as its controller does, and harness/replicas.py reads the
handover from what LeadershipWatch sampled (tests/e2e/test_upgrade.py relies on both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.replicas import Gap, LeadershipWatch, Replica, Sample, lease_handover
from harness.rollout import Deployment, Strategy, pod_name, template_hash


def deployment(replicas: Any = 2, surge: Any = 1, unavailable: Any = 0, annotation: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": "dds"}, "spec": {
        "replicas": replicas,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
        "template": {"metadata": {"annotations": {"checksum/settings": annotation}},
                     "spec": {"terminationGracePeriodSeconds": 30}}}}


def test_strategy_counts_as_the_deployment_controller_rounds_them():
    assert Strategy.of(deployment()) == Strategy(2, 1, 0, 30.0)
    # Percentages: surge rounds up, unavailable rounds down.
    assert Strategy.of(deployment(replicas=3, surge="25%", unavailable="25%")) == Strategy(3, 1, 0, 30.0)
    recreate = deployment()
    recreate["spec"]["strategy"] = {"type": "Recreate"}
    with pytest.raises(ValueError, match="Recreate"):
        Strategy.of(recreate)


def test_a_changed_template_is_a_new_hash_and_pod_names_carry_it():
    assert template_hash(deployment()) == template_hash(deployment())
    assert template_hash(deployment(annotation="b")) != template_hash(deployment())
    name = pod_name("dds", template_hash(deployment()))
    assert name.startswith(f"dds-{template_hash(deployment())}-") and len(name.rsplit("-", 1)[1]) == 5


class FakePopen:
    def __init__(self, owner: "FakeProcess") -> None:
        self.owner = owner

    def terminate(self) -> None:  # a replica that exits at once on SIGTERM
        self.owner.running = False


class FakeProcess:
    def __init__(self) -> None:
        self.running = True
        self.process = FakePopen(self)

    def ready(self) -> bool:
        return self.running

    def kill(self) -> None:
        self.running = False

    def stop(self) -> None:
        self.running = False


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def patch_namespaced_pod_status(self, name: str, _namespace: str, body: Any) -> None:
        self.calls.append(("status", name, body["status"]["conditions"][0]["status"]))

    def delete_namespaced_pod(self, name: str, _namespace: str, grace_period_seconds: int) -> None:
        self.calls.append(("delete", name, grace_period_seconds))


def test_the_rollout_surges_one_waits_for_ready_and_sigterms_the_newest_ready_old_replica_first():
    core = FakeCore()
    started: list[str] = []

    def start(name: str, _template: str) -> Replica:
        started.append(name)
        return Replica(name, Path("/dev/null"), 0, FakeProcess())  # type: ignore[arg-type]

    rolled = Deployment(core, deployment(), start)  # type: ignore[arg-type]
    rolled.scale(timeout=5)
    first, second = started
    terminated: list[str] = []
    rollout = rolled.roll_to(deployment(annotation="b"), timeout=5, on_terminate=lambda r: terminated.append(r.identity))
    new = template_hash(deployment(annotation="b"))
    assert [r.replica.identity.split("-")[1] for r in rolled.pods] == [new, new]
    assert terminated == [second, first]  # Ready for the shorter time goes first
    assert rollout.created == started[2:] and len(rollout.created) == 2
    assert rollout.min_available == 2  # maxUnavailable 0: never fewer Ready than replicas
    # Each new replica was reported Ready before an old one was reported not Ready and deleted.
    events = [(kind, name) for kind, name, _ in core.calls]
    assert events.index(("status", started[2])) < events.index(("delete", second))
    assert events.index(("status", started[3])) < events.index(("delete", first))
    assert ("delete", first, 0) in core.calls and ("delete", second, 0) in core.calls


def test_the_handover_is_read_from_the_lease_holders_and_the_routable_replicas():
    watch = LeadershipWatch(api=None, replicas=list)  # type: ignore[arg-type]
    watch.samples = [Sample(0.0, "old", ("old",)), Sample(1.0, "old", ()), Sample(1.5, "", ()),
                     Sample(2.0, "new", ()), Sample(2.5, "new", ("new",))]
    assert watch.unroutable() == [Gap(1.0, 2.5)]
    changes = watch.holders()
    assert changes == [(0.0, "old"), (1.5, ""), (2.0, "new")]
    assert lease_handover(changes, "old") == (0.5, "new")
    assert lease_handover(changes, "new") is None  # never left "new"
    assert lease_handover([(0.0, "old"), (1.0, "")], "old") is None  # released, nobody took it
