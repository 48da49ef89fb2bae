"""The README says which e2e files run without the real cluster-autoscaler, and why (issue 30 part 6): that list is
exactly the files of tests/e2e whose stack starts no CA — `StackOptions(autoscaler=False)` and no `start_autoscaler()`
later — so "every other e2e test runs the real CA" stays true as tests are added."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
E2E = ROOT / "tests" / "e2e"
README = ROOT / "README.md"
HEADING = "**The e2e files without CA**"


def starts_no_autoscaler(source: str) -> bool:
    tree = ast.parse(source)
    turned_off = any(isinstance(node, ast.keyword) and node.arg == "autoscaler"
                     and isinstance(node.value, ast.Constant) and node.value.value is False
                     for node in ast.walk(tree))
    started_later = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "start_autoscaler" for node in ast.walk(tree))
    return turned_off and not started_later


def files_without_autoscaler() -> set[str]:
    return {path.name for path in E2E.glob("test_*.py") if starts_no_autoscaler(path.read_text())}


def listed_in_readme(text: str) -> set[str]:
    """The files in the first column of the table after HEADING."""
    section = text.split(HEADING, 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break  # the table ended
    return {name for row in rows for name in re.findall(r"`(test_\w+\.py)`", row.split("|")[1])}


def test_the_readme_lists_exactly_the_e2e_files_without_the_autoscaler() -> None:
    actual, listed = files_without_autoscaler(), listed_in_readme(README.read_text())
    assert actual, "no e2e file runs without cluster-autoscaler any more: drop the README's list and its sentences"
    assert listed == actual, (f"README's e2e files without CA: not listed {sorted(actual - listed)}, listed but "
                              f"running CA (or gone) {sorted(listed - actual)}")


def test_a_file_that_starts_ca_after_its_stack_is_one_with_ca() -> None:
    later = "StackOptions(autoscaler=False)\ndef test_x(stack):\n    stack.start_autoscaler()\n"
    assert not starts_no_autoscaler(later)
    assert starts_no_autoscaler("StackOptions(workers=2, autoscaler=False)\n")
    assert not starts_no_autoscaler("StackOptions(workers=2)\n")
