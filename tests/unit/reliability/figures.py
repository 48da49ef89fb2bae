"""Hypothesis profiles of the reliability campaign and the figures it reports (requests fuzzed, per RPC).

Profiles: `dds-reliability` (the short run of `make test`, the default) and `dds-reliability-soak` (`make soak`,
DDS_SOAK=1). They are registered here and applied per test with `FUZZ`/`STATEFUL`, not loaded globally, so the rest of
the suite keeps its own hypothesis settings.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest
from hypothesis import HealthCheck, settings

SOAK = os.environ.get("DDS_SOAK") == "1"
# Under DDS_SOAK=1 the fuzz modules carry the `slow` mark (their `pytestmark`), so `make soak` (-m slow) runs them
# with the long profile; `make test` runs them with the short one.
SOAK_MARKS = [pytest.mark.slow] if SOAK else []

settings.register_profile(
    "dds-reliability", max_examples=40, stateful_step_count=25, deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile(
    "dds-reliability-soak", settings.get_profile("dds-reliability"), max_examples=1500, stateful_step_count=60)
PROFILE = "dds-reliability-soak" if SOAK else "dds-reliability"

FUZZ = settings(settings.get_profile(PROFILE))
# The stateful campaign: fewer runs, each a sequence of `stateful_step_count` calls on one server.
STATEFUL = settings(FUZZ, max_examples=FUZZ.max_examples if not SOAK else FUZZ.max_examples // 3)

# Requests sent with fuzzed content, by kind ("grpc" = a well-formed message with random fields, "raw" = random
# bytes as the payload, "config" = a malformed group definition or settings file) and RPC / input name.
REQUESTS: Counter[tuple[str, str]] = Counter()
_lock = threading.Lock()


def count(kind: str, name: str, n: int = 1) -> None:
    with _lock:
        REQUESTS[(kind, name)] += n


class CountingStub:
    """A CloudProvider stub whose calls are counted as fuzzed requests."""

    def __init__(self, stub: Any, kind: str = "grpc") -> None:
        self._stub = stub
        self._kind = kind

    def __getattr__(self, rpc: str) -> Callable[..., Any]:
        method = getattr(self._stub, rpc)

        def call(request: Any, **kwargs: Any) -> Any:
            count(self._kind, rpc)
            return method(request, **kwargs)

        return call


ALLOWED_REJECTIONS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                      grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      grpc.StatusCode.UNIMPLEMENTED}


def assert_clean_rejection(error: grpc.RpcError, rpc: str) -> str:
    """A refusal CA can act on: a specific status (never UNKNOWN or INTERNAL) and a message. Returns the message."""
    code, details = error.code(), error.details() or ""
    assert code in ALLOWED_REJECTIONS, f"{rpc} answered {code.name}: {details!r}"
    assert details.strip(), f"{rpc} answered {code.name} without a message"
    return details


def summary_lines() -> list[str]:
    with _lock:
        figures = dict(REQUESTS)
    if not figures:
        return []
    lines = [f"profile {PROFILE}: {sum(figures.values())} fuzzed requests/inputs in all"]
    for kind in sorted({k for k, _ in figures}):
        per_name = {name: n for (k, name), n in figures.items() if k == kind}
        detail = ", ".join(f"{name} {n}" for name, n in sorted(per_name.items()))
        lines.append(f"{kind}: {sum(per_name.values())} ({detail})")
    return lines


def write_figures(path: Path) -> None:
    """Merge the figures into a JSON file (DDS_RELIABILITY_FIGURES), for the docs' reliability section."""
    with _lock:
        figures = {f"{kind}/{name}": n for (kind, name), n in sorted(REQUESTS.items())}
    merge_section(path, "fuzz", {"profile": PROFILE, "total": sum(figures.values()), "requests": figures})


# Other campaigns' summaries (e.g. the SIGKILL campaign, tests/e2e): name -> lines, printed at the end of the run.
SUMMARIES: dict[str, list[str]] = {}


def add_summary(name: str, lines: list[str]) -> None:
    with _lock:
        SUMMARIES[name] = list(lines)


def export() -> dict[str, Any]:
    """This process's figures, plain enough for pytest-xdist to send from a worker to the controller (tests/conftest.py)."""
    with _lock:
        return {"requests": [[kind, name, n] for (kind, name), n in REQUESTS.items()], "summaries": dict(SUMMARIES)}


def absorb(exported: Any) -> None:
    """Add a worker's `export()` to this process's figures."""
    if not exported:
        return
    with _lock:
        for kind, name, n in exported["requests"]:
            REQUESTS[(kind, name)] += n
        SUMMARIES.update(exported["summaries"])


def merge_section(path: Path, key: str, section: Any) -> None:
    """Set `key` in the JSON file at `path` to `section`, keeping the other campaigns' sections (fuzz, crash, ...)."""
    with _lock:
        existing: dict[str, Any] = {}
        if path.exists():
            try:
                existing = json.loads(path.read_text())
            except ValueError:
                existing = {}
        existing[key] = section
        path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
