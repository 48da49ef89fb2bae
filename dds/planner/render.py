"""Plans as text for people: what DDS would do and why, per pod and per node (logs, `dds plan`, Events)."""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from typing import Any

from dds.model.plan import DEVICE_GPU, ScaleDownPlan, ScaleUpPlan, Verdict
from dds.model.quantity import human_amount

MAX_REJECTS_SHOWN = 4


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def render_scale_up(plan: ScaleUpPlan) -> str:
    head = (f"scale-up plan (policy {plan.policy or '?'}, solver {plan.solver}): attach {_plural(plan.gpus, 'GPU')} "
            f"to {_plural(len({a.node for a in plan.attaches}), 'node')}, add {_plural(plan.nodes, 'node')}")
    if plan.memory_attaches:
        head += (f", attach {human_amount('memory', plan.cxl_memory)} of CXL memory to "
                 f"{_plural(len(plan.memory_attaches), 'node')}")
    lines = [head]
    if any(d.score is not None for d in plan.decisions):
        lines.append(f"  (score: {plan.policy or 'the policy'}'s score of a placement; the higher score wins)")
    if not plan.decisions:
        lines.append("  no pending pods")
    for decision in plan.decisions:
        lines.append(f"  pod {decision.pod}: {decision.verdict.value}: {decision.reason}")
        if decision.verdict != Verdict.FITS_NOW:
            for reject in decision.rejected[:MAX_REJECTS_SHOWN]:
                lines.append(f"      rejected {reject.message()}")
            if len(decision.rejected) > MAX_REJECTS_SHOWN:
                lines.append(f"      ... and {len(decision.rejected) - MAX_REJECTS_SHOWN} more rejected options")
    for attach in plan.attaches:
        lines.append(f"  attach {_plural(attach.count, attach.model + ' GPU' if attach.model else 'GPU')} from pool "
                     f"{attach.pool} to {attach.node}: {attach.reason}")
    for memory in plan.memory_attaches:
        lines.append(f"  attach {_plural(memory.chunks, 'CXL memory chunk')} ({human_amount('memory', memory.bytes)}) "
                     f"from pool {memory.pool} to {memory.node}: {memory.reason}")
    for new in plan.new_nodes:
        lines.append(f"  add {_plural(new.count, 'node')} to {new.group}: {new.reason}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def render_scale_down(plan: ScaleDownPlan) -> str:
    gpus = sum(len(d.device_ids) for d in plan.detaches if d.kind == DEVICE_GPU)
    chunks = sum(len(d.device_ids) for d in plan.detaches if d.kind != DEVICE_GPU)
    memory = f", {_plural(chunks, 'CXL memory chunk')}" if chunks else ""
    lines = [f"scale-down plan: detach {_plural(gpus, 'GPU')}{memory} from {_plural(len(plan.detaches), 'node')}, "
             f"remove {_plural(len(plan.removals), 'node')}, keep {_plural(len(plan.kept), 'node')}"]
    for detach in plan.detaches:
        force = " (force)" if detach.force else ""
        lines.append(f"  detach {', '.join(detach.device_ids)} from {detach.node}{force}: {detach.reason}")
    for removal in plan.removals:
        lines.append(f"  remove {removal.node} ({removal.group}): {removal.reason}")
    for keep in plan.kept:
        lines.append(f"  keep {keep.node}: {keep.reason}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    if len(lines) == 1:
        lines.append("  nothing to release")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def plan_to_dict(plan: ScaleUpPlan | ScaleDownPlan) -> dict[str, Any]:
    """A plan as plain JSON-ready data (field names as in dds/model/plan.py, enums as their values)."""
    data = _plain(asdict(plan))
    if isinstance(plan, ScaleUpPlan):
        data.update(gpus=plan.gpus, nodes=plan.nodes, cxl_memory=plan.cxl_memory)
    return data
