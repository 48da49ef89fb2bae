"""Every (state, event) pair of a lifecycle, for a test that checks a table as a table: a row's pair goes where the row
says, every other pair raises IllegalTransition (final states included)."""

from __future__ import annotations

from typing import Any, Optional

from dds.model.lifecycle import Lifecycle


def every_pair(lifecycle: Lifecycle[Any, Any]) -> list[tuple[Any, Any, Optional[Any]]]:
    """(state, event, the row's target or None when no row has that pair), in a stable order for parametrize ids."""
    targets = {(row.source, row.event): row.target for row in lifecycle.rows}
    key = lambda value: str(getattr(value, "value", value))  # noqa: E731
    return [(state, event, targets.get((state, event)))
            for state in sorted(lifecycle.states, key=key) for event in sorted(lifecycle.events, key=key)]


def pair_id(value: Any) -> str:
    return str(getattr(value, "value", value))
