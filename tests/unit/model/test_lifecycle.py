"""The lifecycle table primitive: legal moves go where the row says, every other move raises with what is allowed."""

from enum import Enum

import pytest

from dds.model.lifecycle import IllegalTransition, Lifecycle, Transition


class Light(str, Enum):
    OFF = "off"
    ON = "on"
    BROKEN = "broken"


def _lamp() -> Lifecycle[Light, str]:
    return Lifecycle("lamp", Light.OFF, [
        Transition(Light.OFF, "switch", Light.ON, "turned on"),
        Transition(Light.ON, "switch", Light.OFF, "turned off"),
        Transition(Light.ON, "burn out", Light.BROKEN, "the bulb failed"),
    ], final=[Light.BROKEN])


def test_every_row_moves_where_it_says_and_every_other_pair_raises():
    lamp = _lamp()
    rows = {(r.source, r.event): r.target for r in lamp.rows}
    for state in lamp.states:
        for event in lamp.events:
            if (state, event) in rows:
                assert lamp.next(state, event) is rows[(state, event)]
            else:
                with pytest.raises(IllegalTransition):
                    lamp.next(state, event)


def test_an_illegal_move_names_the_lifecycle_the_state_and_what_is_allowed():
    with pytest.raises(IllegalTransition, match=r"lamp: no move from 'off' on 'burn out' \(events allowed there: switch\)"):
        _lamp().next(Light.OFF, "burn out")
    with pytest.raises(IllegalTransition, match="a final state"):
        _lamp().next(Light.BROKEN, "switch")


@pytest.mark.parametrize("rows, final, message", [
    ([Transition("a", "x", "b", ""), Transition("a", "x", "c", "")], [], "two rows from 'a' on 'x'"),
    ([Transition("a", "x", "b", ""), Transition("b", "y", "a", "")], ["b"], "a row leaves the final state 'b'"),
    ([Transition("a", "x", "b", ""), Transition("c", "y", "b", "")], [], r"states no row reaches: \['c'\]"),
])
def test_a_table_that_contradicts_itself_is_refused_when_built(rows, final, message):
    with pytest.raises(ValueError, match=message):
        Lifecycle("t", "a", rows, final=final)


def test_the_markdown_table_has_one_line_per_row():
    text = _lamp().to_markdown()
    assert text.splitlines()[2] == "| off | switch | on | turned on |"
    assert len(text.splitlines()) == 2 + len(_lamp().rows)
