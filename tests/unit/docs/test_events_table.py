"""docs/operations.md's Events table names every Event reason DDS writes, and only those (issue 30 part 6).

The reasons are read from dds/'s source, not from a list kept beside it:
- the reason argument of every `emit(involved, type, reason, message)` call (dds/model/events.py's EventRecorder) and
  of the helpers that forward one (`tell(pod, reason, message)`, `_tell(type, reason, message, nodes, pods)` and the
  GPU-instance retries' `outcomes.tell(type, reason, message, nodes, pods)`);
- the "cannot help" reasons, which travel in `PodDecision.refusal` / `CannotServe.reason` before they reach `tell`:
  the constants assigned to `refusal` or passed to `CannotServe(...)`.
A reason must be a string literal or a module-level constant (one f-string is expanded below); anything else fails here
with its file and line, so that a new way of naming a reason cannot slip past the table.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from dds.fabric.base import OperationKind

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "dds"
OPERATIONS = ROOT / "docs" / "operations.md"
# Callee name -> {positional arguments of an Event call: index of the reason among them}.
REASON_ARGUMENT = {"emit": {4: 2}, "tell": {3: 1, 5: 1}, "_tell": {5: 1}}
# Fields that carry a refusal reason chosen elsewhere (PodDecision.refusal, the DRA demand's and pod's refusal_reason,
# CannotServe.reason as `found.reason`): where they are read, the reasons are those collected where they are set.
# A ProvisioningRequest's decision's `event_reason` (dds/planner/provisioning.py RequestDecision) likewise.
REFUSAL_FIELDS = {"refusal", "refusal_reason", "dra_refusal_reason", "event_reason"}
CANNOT_SERVE_CARRIERS = {"found.reason"}


@dataclass(frozen=True)
class Site:
    path: Path
    line: int
    expression: ast.expr

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {ast.unparse(self.expression)}"


def modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SOURCE.rglob("*.py")):
        if "gen" not in path.relative_to(SOURCE).parts:  # generated gRPC code
            yield path, ast.parse(path.read_text(), str(path))


def string_constants() -> dict[str, set[str]]:
    """Module-level NAME = "text" across dds/ (a name may be bound to different texts in different modules)."""
    found: dict[str, set[str]] = {}
    for _path, tree in modules():
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(value.value)
    return found


def enclosing_functions(tree: ast.Module) -> dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef]:
    """For every node inside a function, the innermost function holding it."""
    out: dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:  # ast.walk is breadth-first: inner functions come later and win
        for node in ast.walk(function):
            out[node] = function
    return out


def parameters(function: Optional[ast.FunctionDef | ast.AsyncFunctionDef]) -> set[str]:
    return {a.arg for a in function.args.args + function.args.kwonlyargs} if function else set()


def local_assignments(function: Optional[ast.FunctionDef | ast.AsyncFunctionDef], name: str) -> list[ast.expr]:
    return [node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)] if function else []


def reason_sites() -> tuple[list[Site], list[Site]]:
    """(where a reason is given to an Event call, where a refusal reason is chosen)."""
    events: list[Site] = []
    refusals: list[Site] = []
    for path, tree in modules():
        functions = enclosing_functions(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            index = REASON_ARGUMENT.get(name or "", {}).get(len(node.args))
            if index is not None:
                reason = node.args[index]
                # A reason that is the function's own parameter is being forwarded: its callers are scanned.
                if not (isinstance(reason, ast.Name) and reason.id in parameters(functions.get(node))):
                    events.append(Site(path, node.lineno, reason))
            if name == "CannotServe" and node.args:
                refusals.append(Site(path, node.lineno, node.args[0]))
            # PodDecision(refusal=...) or replace(decision, refusal=...); a DRA Demand's `refusal` is its message.
            fields = REFUSAL_FIELDS if name in ("PodDecision", "replace") else REFUSAL_FIELDS - {"refusal"}
            for keyword in (k for k in node.keywords if k.arg in fields):
                value = keyword.value
                assigned = local_assignments(functions.get(node), value.id) if isinstance(value, ast.Name) else []
                refusals += [Site(path, node.lineno, v) for v in assigned or [value]]
        for node in ast.walk(tree):  # dataclass defaults, e.g. `refusal_reason: str = NO_MATCHING_DEVICE`
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
                    and node.target.id in REFUSAL_FIELDS - {"refusal"}):
                refusals.append(Site(path, node.lineno, node.value))
    return events, refusals


def carries_a_refusal(expression: ast.expr) -> bool:
    return (isinstance(expression, ast.Attribute) and expression.attr in REFUSAL_FIELDS) or \
        ast.unparse(expression) in CANNOT_SERVE_CARRIERS


def resolve(site: Site, constants: dict[str, set[str]]) -> Optional[set[str]]:
    """The reasons an expression can name, or None when it cannot be told from the source."""
    expression = site.expression
    if isinstance(expression, ast.BoolOp):  # `carried or DEFAULT`: the default, and what the carrier holds
        parts = [resolve(Site(site.path, site.line, v), constants) for v in expression.values
                 if not carries_a_refusal(v)]
        return None if any(p is None for p in parts) else set().union(*parts)
    if isinstance(expression, ast.IfExp):  # `"AttachingMemory" if memory else "AttachingGPU"`: either
        parts = [resolve(Site(site.path, site.line, v), constants) for v in (expression.body, expression.orelse)]
        return None if any(p is None for p in parts) else set().union(*parts)
    if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
        return {expression.value}
    if isinstance(expression, ast.Name) and len(constants.get(expression.id, ())) == 1:
        return set(constants[expression.id])
    # dds/controller/executor.py: f"{op.kind.value.capitalize()}Failed", one reason per kind of fabric operation.
    if ast.unparse(expression) == "f'{op.kind.value.capitalize()}Failed'":
        return {f"{kind.value.capitalize()}Failed" for kind in OperationKind}
    return None


def emitted_reasons() -> set[str]:
    constants = string_constants()
    events, refusals = reason_sites()
    reasons: set[str] = set()
    unknown: list[str] = []
    for site in events + refusals:
        if carries_a_refusal(site.expression) or (isinstance(site.expression, ast.Constant)
                                                   and site.expression.value in (None, "")):
            continue  # handed on (its reasons are collected where they are chosen), or no refusal at all
        found = resolve(site, constants)
        reasons |= (found or set()) - {""}
        unknown += [] if found is not None else [site.where()]
    assert not unknown, ("Event reasons that are neither a string literal nor a module constant (name them so, or "
                         "teach this test):\n" + "\n".join(unknown))
    return reasons


def documented_reasons(text: str) -> set[str]:
    """The reasons in the first column of the table under '## Events' (`A` or `A` / `B`)."""
    section = text.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Za-z]+)`", row.split("|")[1])}


def test_every_reason_dds_emits_is_in_the_events_table() -> None:
    missing = emitted_reasons() - documented_reasons(OPERATIONS.read_text())
    assert not missing, f"Event reasons DDS writes that docs/operations.md's Events table leaves out: {sorted(missing)}"


def test_the_events_table_names_no_reason_dds_never_emits() -> None:
    stale = documented_reasons(OPERATIONS.read_text()) - emitted_reasons()
    assert not stale, f"docs/operations.md's Events table names reasons no code in dds/ emits: {sorted(stale)}"


def test_the_scan_finds_the_reasons_of_each_kind_of_call_site() -> None:
    # One of each way a reason is named: a literal at emit(), a literal through _tell(), a refusal constant through
    # tell(), a CannotServe constant, a gang refusal, and the expanded f-string.
    assert {"AttachingGPU", "RetryingAttach", "NoFreeGPU", "NoMatchingGPU", "GangDoesNotFit", "AttachFailed",
            "DetachFailed", "NoMatchingDevice"} <= emitted_reasons()


def test_the_table_reader_takes_both_names_of_a_shared_row() -> None:
    text = ("# x\n\n## Events\n\n| reason | type |\n|---|---|\n| `A` / `B` | Normal |\n| `C` | Warning |\n\n"
            "## Next\n| `D` |\n")
    assert documented_reasons(text) == {"A", "B", "C"}
