"""HiGHS instances that write nothing on the process's stdout (the batch planner's MILP solver, dds/planner/batch.py).

HiGHS prints its version and copyright banner on the process's stdout when the first instance is built, before any
option can be set (`output_flag` quiets only what comes after): it landed in DDS's log on its first batch plan. Which
instance is the process's first is process-wide state, with a lock and file descriptor juggling: it lives here, out of
the planner, which holds no state and no lock of its own (the import contracts in pyproject.toml check that).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import highspy

_FIRST_HIGHS = threading.Lock()
_banner_swallowed = False


def silent_highs() -> highspy.Highs:
    """A HiGHS instance that writes nothing; the process's first one is built with file descriptor 1 on /dev/null."""
    global _banner_swallowed
    with _FIRST_HIGHS:
        if _banner_swallowed:
            h = highspy.Highs()
        else:
            h = _built_with_stdout_muted()
            _banner_swallowed = True
    h.silent()
    return h


def _built_with_stdout_muted() -> highspy.Highs:
    # The banner is C stdio output, so it is flushed to /dev/null before stdout comes back. DDS logs to stderr; for the
    # instant fd 1 is muted, nothing else of DDS's writes there.
    libc = ctypes.CDLL(None)
    for stream in (sys.stdout, sys.stderr):  # what was written before belongs on the real stdout
        if stream is not None:
            stream.flush()
    libc.fflush(None)
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
