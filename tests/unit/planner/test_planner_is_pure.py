"""The planner and the model keep no state of their own between calls: whatever a decision reuses from an earlier one
is the caller's (PlannerMemos, dds/planner/memos.py), so the same inputs always give the same plan and two callers never
share anything they did not hand over. (import-linter checks the rest: no clock, no thread, no lock; pyproject.toml.)

The rule, read from the source with `ast`, over every module of dds/planner and dds/model:

- A module-level assignment binds an immutable value only:
  - a literal constant (str, bytes, numbers, True/False/None), or an expression of constants and names (`A + "x"`,
    `2**62`, `-1`), a tuple of allowed values, a lambda;
  - another name or attribute (an alias: `DRIVER = DDS_DRA_DRIVER`), or a subscripted type (`Callable[[int], str]`,
    `dict[str, int]` as a type alias: a type, not a dict);
  - a call of an immutable constructor: `frozenset`, `tuple`, `MappingProxyType`, `re.compile`, `TypeVar`, `Decimal`,
    a numpy scalar type (`np.int64(...)`), or a class of dds/planner or dds/model that cannot change once built: a
    dataclass with `frozen=True`, an Enum, a NamedTuple, or a pydantic model whose `model_config` says `frozen=True`.
  Everything else fails, notably dict, list and set literals and comprehensions, and calls of any other constructor
  (a memo object, a Lock, `dict(...)`, `defaultdict(...)`): a read-only mapping is written `MappingProxyType({...})`.
- No assignment at module level to an attribute or an item (`X.y = ...`, `X[k] = ...`), no augmented assignment.
- No `global` statement anywhere: a function that rebinds a module name is module state too.

`__all__` follows the rule as well (a tuple). `functools.lru_cache` on a module-level function is not an assignment and
is allowed: it caches a pure function of its (hashable, by-value) arguments, e.g. a compiled CEL selector, so it can
never change an answer, only its cost.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = (ROOT / "dds" / "planner", ROOT / "dds" / "model")
MODULES = sorted(p for package in PACKAGES for p in package.glob("*.py"))

IMMUTABLE_CALLS = frozenset({"frozenset", "tuple", "MappingProxyType", "re.compile", "TypeVar", "Decimal", "bool",
                             "int", "float", "str", "bytes"})
COPYING_CALLS = frozenset({"frozenset", "tuple", "MappingProxyType"})
NUMPY_PREFIXES = ("np.", "numpy.")


def _decorator_frozen(decorator: ast.expr) -> bool:
    """`@dataclass(frozen=True)` (or `dataclasses.dataclass(...)`)."""
    if not isinstance(decorator, ast.Call) or ast.unparse(decorator.func) not in ("dataclass", "dataclasses.dataclass"):
        return False
    return any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in decorator.keywords)


def _pydantic_frozen(node: ast.ClassDef) -> bool:
    for statement in node.body:
        if (isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "model_config"
                                                      for t in statement.targets)):
            value = statement.value
            return (isinstance(value, ast.Call) and ast.unparse(value.func) == "ConfigDict"
                    and any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in value.keywords))
    return False


def _immutable_classes() -> frozenset[str]:
    """The classes of dds/planner and dds/model whose instances cannot change once built."""
    names = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if (any(_decorator_frozen(d) for d in node.decorator_list) or _pydantic_frozen(node)
                    or bases & {"Enum", "str, Enum", "IntEnum", "NamedTuple"} or any("Enum" in b for b in bases)):
                names.add(node.name)
    return frozenset(names)


IMMUTABLE_CLASSES = _immutable_classes()


def _display_of_immutables(value: ast.expr) -> bool:
    """A dict, list or set display whose keys and values are all immutable (what frozenset() and MappingProxyType()
    may be given: they copy it, or wrap the only reference to it)."""
    if isinstance(value, ast.Dict):
        return all(k is not None and _immutable(k) for k in value.keys) and all(_immutable(v) for v in value.values)
    return isinstance(value, (ast.List, ast.Set)) and all(_immutable(e) for e in value.elts)


def _immutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.Constant, ast.Name, ast.Attribute, ast.Lambda)):
        return True
    if isinstance(value, ast.JoinedStr):
        return all(_immutable(v) for v in value.values)
    if isinstance(value, ast.FormattedValue):
        return _immutable(value.value)
    if isinstance(value, ast.UnaryOp):
        return _immutable(value.operand)
    if isinstance(value, ast.BinOp):
        return _immutable(value.left) and _immutable(value.right)
    if isinstance(value, ast.Tuple):
        return all(_immutable(e) for e in value.elts)
    if isinstance(value, ast.Subscript):  # a type alias: Callable[...], dict[str, int], Union[...]
        return isinstance(value.value, (ast.Name, ast.Attribute))
    if isinstance(value, ast.Call):
        callee = ast.unparse(value.func)
        known = (callee in IMMUTABLE_CALLS or callee.startswith(NUMPY_PREFIXES)
                 or callee.rsplit(".", 1)[-1] in IMMUTABLE_CLASSES)
        if callee in COPYING_CALLS:  # a copy or a read-only view of a display nobody else holds
            return all(_immutable(a) or _display_of_immutables(a) for a in value.args)
        return known and all(_immutable(a) for a in value.args) and all(_immutable(k.value) for k in value.keywords)
    return False  # dict, list and set literals and comprehensions, and anything not listed


def module_state(source: str, where: str) -> Iterator[str]:
    """Each breach of the rule in one module's source, as `where:line: what`."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.AugAssign):
            yield f"{where}:{node.lineno}: augmented assignment at module level: {ast.unparse(node)}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                if not all(isinstance(n, ast.Name) for n in names):
                    yield f"{where}:{node.lineno}: module-level assignment to an attribute or item: {ast.unparse(node)}"
            if node.value is not None and not _immutable(node.value):
                yield f"{where}:{node.lineno}: module-level mutable value: {ast.unparse(node)[:100]}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            yield f"{where}:{node.lineno}: `global {', '.join(node.names)}` rebinds module state"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_module_of_the_pure_core_holds_no_mutable_state(path: Path) -> None:
    assert list(module_state(path.read_text(), str(path.relative_to(ROOT)))) == []


@pytest.mark.parametrize("source, breaches", [
    ("X = {}", 1), ("X: dict = {'a': 1}", 1), ("X = []", 1), ("X = {1, 2}", 1), ("X = [i for i in range(3)]", 1),
    ("import threading\nLOCK = threading.Lock()", 1), ("X = dict(a=1)", 1), ("X = Memo()", 1),
    ("X = (1, [])", 1), ("X = MappingProxyType({'a': []})", 1), ("X = frozenset([1])", 0), ("def f():\n    global X\n    X = 1", 1), ("X = 1\nX += 1", 1),
    ("X = 'a'", 0), ("X = 2**62", 0), ("X = ('a', 'b')", 0), ("X = frozenset({'a'})", 0),
    ("X = MappingProxyType({'a': 1})", 0), ("import re\nX = re.compile('a')", 0), ("X = np.int64(2**62)", 0),
    ("F = Callable[[int], str]", 0), ("X = Y + 'z'", 0), ("X = PlannerConfig()", 0), ("X = Verdict.FITS_NOW", 0),
])
def test_the_rule_tells_state_from_constants(source: str, breaches: int) -> None:
    """The checker itself: what it calls module state, and what it lets through (PlannerConfig is a frozen
    dataclass of dds/model)."""
    assert len(list(module_state(source, "probe.py"))) == breaches, source
