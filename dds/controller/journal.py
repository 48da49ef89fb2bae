"""The decision journal: the last decisions DDS took, each with what triggered it and the plan's reasons, served on the
operations port at `/decisions` (text, newest first; `?format=json` for tools).

Logs and Events carry the same reasons; the journal answers "why did DDS just do that?" without searching logs:

    curl -s dds:8087/decisions | head -40
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class Decision:
    at: float  # unix seconds
    case: str  # the talk's case (dds/model/plan.py Case values)
    trigger: str  # "cluster-autoscaler IncreaseSize MachineSet/default/gpu-workers +1", "control loop", ...
    outcome: str  # gpu | node | mixed | none | error | kept
    plan: str  # the rendered plan: per pod or node, what was chosen and why, and the rejected options


class DecisionJournal:
    def __init__(self, clock: Callable[[], float], capacity: int = 200) -> None:
        self._clock = clock
        self._entries: deque[Decision] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def record(self, case: str, trigger: str, outcome: str, plan: str) -> Decision:
        decision = Decision(self._clock(), case, trigger, outcome, plan)
        with self._lock:
            self._entries.append(decision)
        return decision

    def entries(self) -> list[Decision]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._entries))

    def render_text(self) -> bytes:
        import time

        blocks = []
        for d in self.entries():
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.at))
            blocks.append(f"{stamp}  {d.case}  {d.outcome}  <- {d.trigger}\n{_indent(d.plan)}")
        return ("\n\n".join(blocks) or "no decision yet").encode() + b"\n"

    def render_json(self) -> bytes:
        return json.dumps([asdict(d) for d in self.entries()], indent=1).encode() + b"\n"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
