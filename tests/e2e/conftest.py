"""Print the SIGKILL campaign's figures at the end of the run (tests/e2e/test_crash_campaign.py records them)."""

from __future__ import annotations

from tests.unit.reliability import figures


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    for name, lines in figures.SUMMARIES.items():
        terminalreporter.write_sep("-", f"reliability: {name}")
        for line in lines:
            terminalreporter.write_line(line)
