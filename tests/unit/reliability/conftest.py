"""Reliability campaign: print the fuzzing figures at the end of the run (and merge them into the JSON file named by
DDS_RELIABILITY_FIGURES, when set)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.unit.reliability import figures


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    lines = figures.summary_lines()
    if not lines:
        return
    terminalreporter.write_sep("-", "reliability: requests fuzzed")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ.get("DDS_RELIABILITY_FIGURES")
    if target:
        figures.write_figures(Path(target))
        terminalreporter.write_line(f"figures written to {target}")
