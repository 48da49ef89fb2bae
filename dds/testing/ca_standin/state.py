"""cluster-autoscaler's cluster-state bookkeeping (clusterstate/), re-implemented: readiness per group, upcoming nodes,
scale-up requests and their timeouts, node-group backoff, and groups whose size looks wrong."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Readiness:
    """Node names of one group by state, as CA counts them."""

    ready: list[str] = field(default_factory=list)
    unready: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)  # registered, not Ready, younger than max-node-startup-time
    deleted: list[str] = field(default_factory=list)  # tainted ToBeDeleted (CA's HasInstance is not implemented)
    registered: list[str] = field(default_factory=list)
    unregistered: list[str] = field(default_factory=list)
    long_unregistered: list[str] = field(default_factory=list)


@dataclass
class ScaleUpRequest:
    increase: int
    time: float
    expected_add_time: float


@dataclass(frozen=True)
class ScaleDownRequest:
    group_id: str
    node_name: str
    expected_delete_time: float


@dataclass(frozen=True)
class AcceptableRange:
    min_nodes: int
    max_nodes: int
    current_target: int


@dataclass(frozen=True)
class IncorrectSize:
    current: int
    expected: int
    first_observed: float


@dataclass(frozen=True)
class BackoffEntry:
    duration: float
    until: float
    last_failure: float
    reason: str


class Backoff:
    """Per-group exponential backoff: the first failure backs off `initial`, each failure after the previous backoff
    ran out doubles it up to `maximum`; `reset_after` seconds without failures forget the group."""

    def __init__(self, initial: float, maximum: float, reset_after: float) -> None:
        self.initial, self.maximum, self.reset_after = initial, maximum, reset_after
        self.entries: dict[str, BackoffEntry] = {}

    def fail(self, group_id: str, reason: str, now: float) -> float:
        duration = self.initial
        previous = self.entries.get(group_id)
        if previous is not None:
            duration = previous.duration
            if previous.until < now:
                duration = min(2 * previous.duration, self.maximum)
        self.entries[group_id] = BackoffEntry(duration, now + duration, now, reason)
        return now + duration

    def backed_off(self, group_id: str, now: float) -> Optional[BackoffEntry]:
        entry = self.entries.get(group_id)
        return entry if entry is not None and entry.until >= now else None

    def forget_stale(self, now: float) -> None:
        for group_id in [g for g, e in self.entries.items() if e.last_failure + self.reset_after < now]:
            del self.entries[group_id]


def acceptable_ranges(targets: dict[str, int], readiness: dict[str, Readiness],
                      scale_ups: dict[str, ScaleUpRequest], scale_downs: list[ScaleDownRequest]) -> dict[str, AcceptableRange]:
    ranges = {}
    for group_id, target in targets.items():
        lower = target - len(readiness.get(group_id, Readiness()).long_unregistered)
        if group_id in scale_ups:
            lower -= scale_ups[group_id].increase
        upper = target + sum(1 for r in scale_downs if r.group_id == group_id)
        ranges[group_id] = AcceptableRange(lower, upper, target)
    return ranges


def upcoming_nodes(target: int, readiness: Optional[Readiness]) -> int:
    """target − (Ready + Unready + long-unregistered): what CA still waits for (NotStarted and unregistered count)."""
    if readiness is None:
        return target
    return target - (len(readiness.ready) + len(readiness.unready) + len(readiness.long_unregistered))


def incorrect_size(target: int, readiness: Optional[Readiness], previous: Optional[IncorrectSize],
                   now: float) -> Optional[IncorrectSize]:
    if readiness is None:
        return None
    unregistered = len(readiness.unregistered) + len(readiness.long_unregistered)
    registered = len(readiness.registered)
    if target - unregistered <= registered <= target:
        return None
    if previous is not None and (previous.current, previous.expected) == (registered, target):
        return previous
    return IncorrectSize(registered, target, now)
