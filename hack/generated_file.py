"""The one way hack/'s generators keep a checked-in file equal to their output: write it, or with --check leave it and
say how to regenerate it when it differs (the tests run each generator with --check)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, wanted: str, check: bool, regenerate: str) -> int:
    """The process's exit code: 1 when checking a file that is not `wanted`, else 0 (after writing it)."""
    if check:
        if not path.is_file() or path.read_text() != wanted:
            print(f"{path} is not its generator's output: run `{regenerate}`", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    return 0
