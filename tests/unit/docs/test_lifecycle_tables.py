"""The lifecycle tables as the docs print them (docs/lifecycles.md and each module's docstring) are the tables the code
runs: a row added, dropped or reworded in the code fails here until the docs say the same."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from dds.controller import gpu_retries, removals
from dds.model.lifecycle import Lifecycle
from dds.scaling import instances

LIFECYCLES = Path(__file__).resolve().parents[3] / "docs" / "lifecycles.md"
TABLES: list[tuple[str, ModuleType, Lifecycle]] = [
    ("In-flight instances", instances, instances.INSTANCE_LIFECYCLE),
    ("GPU-instance retries", gpu_retries, gpu_retries.GPU_INSTANCE_LIFECYCLE),
    ("Node removals", removals, removals.NODE_REMOVAL_LIFECYCLE),
]


def tables_in(text: str) -> list[str]:
    """Every markdown table of `text` (runs of lines starting with "|"), each as one string."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    if current:
        found.append("\n".join(current))
    return found


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


@pytest.mark.parametrize("heading, module, lifecycle", TABLES, ids=[t[0] for t in TABLES])
def test_the_docs_table_is_the_codes(heading, module, lifecycle):
    assert tables_in(section(LIFECYCLES.read_text(encoding="utf-8"), heading)) == [lifecycle.to_markdown()]


@pytest.mark.parametrize("heading, module, lifecycle", TABLES, ids=[t[0] for t in TABLES])
def test_the_modules_docstring_table_is_the_codes(heading, module, lifecycle):
    assert tables_in(module.__doc__) == [lifecycle.to_markdown()]
