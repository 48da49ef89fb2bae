"""Crash points: named steps at which the reliability campaign makes DDS kill itself with SIGKILL.

Production code marks a step with one line, `crashpoint("fabric.attach.accepted")`. It does nothing unless the
environment variable DDS_CRASH_AT arms that point:

    DDS_CRASH_AT="fabric.attach.accepted:2,nodes.remove.marked"  # SIGKILL at the 2nd hit of one, the 1st of the other

On the armed hit the process writes one line, `dds-crashpoint: <name> hit <n>: SIGKILL`, straight to stderr (the
campaign reads from the log which step it died at) and sends itself SIGKILL: no `finally`, no atexit, no flush — what
kill -9, a node failure or the OOM killer does.

Why named points and not only kills at random times: a random kill lands where the process spends its time (waiting on
I/O), almost never between the two writes of a step; a named point lands exactly there, every time, so every window the
design claims is safe gets tested. The campaign does both (tests/e2e/test_crash_campaign.py).

`POINTS` lists every step with what is persisted when it is hit; an armed name that is not in it is refused when
`dds serve` starts (a typo must not silently test nothing).
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

ENV = "DDS_CRASH_AT"
LOG_MARKER = "dds-crashpoint:"

# name -> the state of the world when a crash hits there (what a restarted DDS must cope with)
POINTS: Mapping[str, str] = MappingProxyType({
    # attach (case 1 through CA's IncreaseSize, case 2 and new nodes' initial GPUs through the controller loop)
    "scale-up.gpu-instance-recorded": "CA's GPU instance is persisted; no attach started for it yet",
    "attach.before-fabric": "an attach was decided; the fabric was not asked yet",
    "fabric.attach.accepted": "the fabric persisted an accepted attach; DDS has not followed it yet",
    "fabric.attach.completed": "the fabric persisted a finished attach; the Node's GPU capacity is not updated yet",
    "scale-up.gpu-instance-done": "a GPU instance's attaches ended; the instance is still listed to CA",
    # detach (idle GPUs, nodes being removed, orphans)
    "detach.before-fabric": "a detach was decided; the fabric was not asked yet",
    "fabric.detach.accepted": "the fabric persisted an accepted detach; DDS has not followed it yet",
    "fabric.detach.completed": "the fabric persisted a finished detach; the Node's GPU capacity is not updated yet",
    # node add
    "scale-up.node-instance-recorded": "CA's node instance is persisted; the MachineSet is not scaled yet",
    "nodes.add.patched": "the MachineSet's replicas (and request record) are patched; CA not answered yet",
    "initial-gpus.attached": "a new node's initial GPUs are being attached; the node is not labelled done yet",
    "loop.attach-started": "the loop's fast path (or warm refill) started an attach; the pod is still pending",
    # node remove
    "remove.cordoned": "the node carries the dds.cdi.dev/removing taint; its Machine is not marked yet",
    "nodes.remove.marked": "the Machine is marked cluster.x-k8s.io/delete-machine; replicas not lowered yet",
    "nodes.remove.patched": "the MachineSet's replicas are lowered; DDS has not logged or recorded the removal",
})


@dataclass(frozen=True)
class Arming:
    """Which points kill the process, and at which hit (1 = the first time the step runs)."""

    at_hit: Mapping[str, int]

    @property
    def armed(self) -> bool:
        return bool(self.at_hit)


def parse(spec: Optional[str]) -> Arming:
    """`name[:n][,name[:n]...]` -> Arming; raises ValueError naming the bad part and the known points."""
    at_hit: dict[str, int] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition(":")
        name = name.strip()
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown crash point {name!r} in {spec!r}; known: {', '.join(POINTS)}")
        try:
            hit = int(count) if count.strip() else 1
        except ValueError:
            raise ValueError(f"{ENV}: hit count of {name} must be a whole number, got {count!r}") from None
        if hit < 1:
            raise ValueError(f"{ENV}: hit count of {name} must be at least 1, got {hit}")
        at_hit[name] = hit
    return Arming(MappingProxyType(at_hit))


_lock = threading.Lock()
_arming: Optional[Arming] = None
_hits: dict[str, int] = {}


def arm_from_environment() -> Arming:
    """Read DDS_CRASH_AT (raises ValueError when malformed). `dds serve` calls it at start, so a bad value is a usage
    error there rather than a surprise at the first step."""
    global _arming
    arming = parse(os.environ.get(ENV))
    with _lock:
        _arming = arming
        _hits.clear()
    return arming


def crashpoint(name: str) -> None:
    """Mark step `name` (one of POINTS); SIGKILL this process if DDS_CRASH_AT armed this hit of it."""
    arming = _arming
    if arming is None:
        arming = arm_from_environment()
    if not arming.armed or name not in arming.at_hit:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name]
    if hit == arming.at_hit[name]:
        _die(name, hit)


def _die(name: str, hit: int) -> None:
    os.write(2, f"\n{LOG_MARKER} {name} hit {hit}: SIGKILL\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
