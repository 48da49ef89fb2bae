"""A one-line progress bar on stderr for long simulations (plain text, no dependency).

Redrawn only when the shown percentage changes, so a million events cost a hundred writes. Off when the stream is not a
terminal (CI logs stay clean) unless forced.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO


class ProgressBar:
    def __init__(self, label: str, stream: Optional[TextIO] = None, width: int = 30, enabled: Optional[bool] = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown = -1

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        percent = min(100, done * 100 // total)
        if percent == self._shown:
            return
        self._shown = percent
        filled = self.width * percent // 100
        self.stream.write(f"\r{self.label:<22} [{'#' * filled}{'.' * (self.width - filled)}] {percent:3d}% "
                          f"{done}/{total} jobs")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._shown >= 0:
            self.stream.write("\n")
            self.stream.flush()
