"""The oracle behind docs/simulation.md's starvation floor (hack/starvation_bound.py), on a trace worked out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from dds.sim.trace import Job

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "starvation_bound.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("starvation_bound", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def job(name: str, at: float, gpus: int, duration: float = 300.0) -> Job:
    return Job(name=name, arrival_s=at, duration_s=duration, milli_cpu=40_000, memory=2**30, gpus=gpus)


# 8 GPUs: a and b hold 6 until 300 s; c would run past 300 s, d ends at 70 s.
JOBS = [job("a", 0.0, 4), job("b", 0.0, 2), job("big", 10.0, 8), job("c", 20.0, 1), job("d", 20.0, 1, duration=50.0)]


def test_unreserved_a_large_job_waits_while_small_ones_keep_the_gpus():
    started = load().run(JOBS, {})
    assert (started["c"], started["d"]) == (20.0, 20.0)
    assert started["big"] == 320.0  # not at 300 s, when a and b end: c still holds a GPU


def test_a_planned_start_holds_back_what_would_delay_it_and_backfills_what_would_not():
    started = load().run(JOBS, {"big": 300.0})
    assert started["big"] == 300.0
    assert started["d"] == 20.0  # ends before 300 s: backfilled
    assert started["c"] == 600.0  # would run past 300 s on a GPU the large job needs: held back
