"""Lifecycles as tables: every legal move of a stateful record is one row, and anything else raises.

A row says: from `source`, on `event`, go to `target` — and `why`, in words a log line or a doc can use. The table is
data, so it is tested as a table (every row, and every pair that is not a row) and printed into the docs as it is;
the code that moves a record asks the table for the next state instead of assigning one.

Times are not in the table: a lifecycle whose moves depend on time (a retry after a backoff, a removal given up after
a bound) gets its clock injected where it is driven and turns "the time has come" into an event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Hashable, Iterable, Optional, TypeVar

S = TypeVar("S", bound=Hashable)
E = TypeVar("E", bound=Hashable)


class IllegalTransition(ValueError):
    """A move the lifecycle's table does not have: a bug in the caller, never a condition to handle silently."""

    def __init__(self, lifecycle: str, state: object, event: object, allowed: Iterable[object]) -> None:
        self.lifecycle = lifecycle
        self.state = state
        self.event = event
        allowed_text = ", ".join(sorted(_label(e) for e in allowed)) or "none (a final state)"
        super().__init__(f"{lifecycle}: no move from {_label(state)!r} on {_label(event)!r} "
                         f"(events allowed there: {allowed_text})")


@dataclass(frozen=True, slots=True)
class Transition(Generic[S, E]):
    source: S
    event: E
    target: S
    why: str


class Lifecycle(Generic[S, E]):
    """A finite lifecycle: the initial state, the rows, and the final states (no row leaves them)."""

    def __init__(self, name: str, initial: S, rows: Iterable[Transition[S, E]], final: Iterable[S] = ()) -> None:
        self.name = name
        self.initial = initial
        self.rows: tuple[Transition[S, E], ...] = tuple(rows)
        self.final: frozenset[S] = frozenset(final)
        self._next: dict[tuple[S, E], Transition[S, E]] = {}
        for row in self.rows:
            key = (row.source, row.event)
            if key in self._next:
                raise ValueError(f"{name}: two rows from {_label(row.source)!r} on {_label(row.event)!r}")
            if row.source in self.final:
                raise ValueError(f"{name}: a row leaves the final state {_label(row.source)!r}")
            self._next[key] = row
        unreachable = self.states - self._reachable()
        if unreachable:
            raise ValueError(f"{name}: states no row reaches: {sorted(_label(s) for s in unreachable)}")

    @property
    def states(self) -> frozenset[S]:
        return frozenset({self.initial, *self.final, *(r.source for r in self.rows), *(r.target for r in self.rows)})

    @property
    def events(self) -> frozenset[E]:
        return frozenset(r.event for r in self.rows)

    def row(self, state: S, event: E) -> Optional[Transition[S, E]]:
        return self._next.get((state, event))

    def allows(self, state: S, event: E) -> bool:
        return (state, event) in self._next

    def events_from(self, state: S) -> tuple[E, ...]:
        return tuple(r.event for r in self.rows if r.source == state)

    def next(self, state: S, event: E) -> S:
        """The state `event` moves `state` to; IllegalTransition when the table has no such row."""
        found = self._next.get((state, event))
        if found is None:
            raise IllegalTransition(self.name, state, event, self.events_from(state))
        return found.target

    def to_markdown(self) -> str:
        """The table as the docs show it, one row per move."""
        lines = ["| from | on | to | why |", "|---|---|---|---|"]
        lines += [f"| {_label(r.source)} | {_label(r.event)} | {_label(r.target)} | {r.why} |" for r in self.rows]
        return "\n".join(lines)

    def _reachable(self) -> frozenset[S]:
        seen = {self.initial}
        frontier = [self.initial]
        while frontier:
            state = frontier.pop()
            for row in self.rows:
                if row.source == state and row.target not in seen:
                    seen.add(row.target)
                    frontier.append(row.target)
        return frozenset(seen)


def _label(value: object) -> str:
    return str(getattr(value, "value", value))
