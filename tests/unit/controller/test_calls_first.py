"""CA's calls before the loop's work: the loop waits at its step boundaries while a call is under way, and only so
long (a stream of calls delays a pass, never stops it)."""

from __future__ import annotations

import threading

from dds.controller.calls_first import CallsFirst


def test_the_loop_waits_until_the_call_under_way_is_done() -> None:
    gate = CallsFirst(longest_wait_seconds=60.0)
    entered, release, waited = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def call() -> None:
        with gate.call():
            entered.set()
            release.wait(10)
            order.append("call done")

    def loop_step() -> None:
        gate.wait_for_calls()
        order.append("loop step")
        waited.set()

    caller = threading.Thread(target=call)
    caller.start()
    entered.wait(10)
    stepper = threading.Thread(target=loop_step)
    stepper.start()
    assert not waited.wait(0.2) and gate.under_way() == 1  # still waiting while the call runs
    release.set()
    assert waited.wait(10)
    caller.join(10)
    stepper.join(10)
    assert order == ["call done", "loop step"] and gate.under_way() == 0


def test_with_no_call_under_way_the_loop_goes_on_at_once() -> None:
    assert CallsFirst(longest_wait_seconds=60.0).wait_for_calls() < 1.0


def test_a_call_that_never_ends_delays_the_loop_only_for_the_longest_wait() -> None:
    gate = CallsFirst(longest_wait_seconds=0.3)
    with gate.call():
        waited = gate.wait_for_calls()
    assert 0.3 <= waited < 10.0 and gate.under_way() == 0


def test_a_call_that_fails_is_no_longer_under_way() -> None:
    gate = CallsFirst()
    try:
        with gate.call():
            raise RuntimeError("the plan failed")
    except RuntimeError:
        pass
    assert gate.under_way() == 0
