"""How a `dds` command ends when it cannot do its work: one line on stderr saying what is wrong and what to do, and a
documented exit code — never a traceback. The line is JSON when logs are (`--log-format json`, DDS_LOG_FORMAT=json,
or `log_format: json` in the settings), so a log pipeline reads the reason like any other line.

Exit codes (docs/configuration.md "Exit codes"):
  0  done (`dds serve`: a clean shutdown on SIGTERM/SIGINT)
  1  `dds serve` lost the leader Lease (restart as a standby)
  2  bad flags, settings or files (the kubeconfig included)
  3  cannot reach or log in to the cluster: no answer, credentials refused, `--in-cluster` outside a pod
  4  the cluster is not ready for DDS: RBAC denies what it needs, or a CRD it reads is not installed
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TextIO

from dds.kube.preflight import ClusterProblem, ProblemKind

EXIT_OK = 0
EXIT_LEASE_LOST = 1
EXIT_USAGE = 2
EXIT_NO_CLUSTER = 3
EXIT_CLUSTER_NOT_READY = 4

EXIT_OF_PROBLEM = {
    ProblemKind.KUBECONFIG: EXIT_USAGE,
    ProblemKind.NOT_IN_POD: EXIT_NO_CLUSTER,
    ProblemKind.UNREACHABLE: EXIT_NO_CLUSTER,
    ProblemKind.CREDENTIALS: EXIT_NO_CLUSTER,
    ProblemKind.PERMISSION: EXIT_CLUSTER_NOT_READY,
    ProblemKind.MISSING_API: EXIT_CLUSTER_NOT_READY,
}


class Failure(Exception):
    """Why a command stops: `message` (what is wrong), `fix` (what to do, may be empty) and its exit code."""

    def __init__(self, message: str, fix: str = "", exit_code: int = EXIT_USAGE, kind: str = "usage") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code
        self.kind = kind

    @classmethod
    def of(cls, problem: ClusterProblem) -> "Failure":
        return cls(problem.message, problem.fix, EXIT_OF_PROBLEM[problem.kind], problem.kind.value)


def requested_log_format(args: Optional[argparse.Namespace] = None) -> str:
    """The log format asked for before the settings are read (they may be what failed): the flag, else
    DDS_LOG_FORMAT, else text."""
    flag = getattr(args, "log_format", None) if args is not None else None
    value = flag or os.environ.get("DDS_LOG_FORMAT", "")
    return "json" if value.strip().lower() == "json" else "text"


def report(command: str, failure: Failure, log_format: str = "text", stream: Optional[TextIO] = None) -> int:
    """Write `failure` as one line on stderr and return its exit code."""
    stream = stream or sys.stderr
    if log_format == "json":
        from dds.logs import JsonFormatter

        record = logging.makeLogRecord({"name": f"dds.{command}", "levelno": logging.ERROR, "levelname": "ERROR",
                                        "msg": failure.message, "fix": failure.fix, "exit_code": failure.exit_code,
                                        "reason": failure.kind})
        formatter = JsonFormatter()
        formatter.converter = __import__("time").gmtime
        stream.write(formatter.format(record) + "\n")
    else:
        fix = f" — to fix: {failure.fix}" if failure.fix else ""
        stream.write(f"dds {command}: {failure.message}{fix}\n")
    stream.flush()
    return failure.exit_code


def settings_problems(exc: Exception) -> str:
    """A settings error as one line naming each setting at fault, and the DDS_* variable it came from when one is
    set (docs/configuration.md: a malformed variable stops the start and names the variable)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "invalid settings: " + "; ".join(invalid_settings(exc))
    environment = {name.upper(): name for name in os.environ if name.upper().startswith("DDS_")}
    text = str(exc)
    found = re.search(r'error parsing value for field "([^"]+)" from source "EnvSettingsSource"', text)
    if found:  # pydantic-settings could not decode a list or mapping given as JSON
        variable = _variable_of([found.group(1)], environment) or f"DDS_{found.group(1).upper()}"
        return (f"cannot load settings: {variable} is not valid JSON (lists and mappings are JSON in the environment, "
                f"e.g. DDS_MACHINESET_NAMESPACES='[\"team-a\"]')")
    return f"cannot load settings: {text}"


def invalid_settings(exc: Any) -> list[str]:
    """Each error of a pydantic ValidationError: the setting, the DDS_* variable it came from if any, what is wrong."""
    environment = {name.upper(): name for name in os.environ if name.upper().startswith("DDS_")}
    out = []
    for error in exc.errors():
        where = ".".join(map(str, error["loc"])) or "settings"
        variable = _variable_of([str(p) for p in error["loc"]], environment)
        out.append(f"{where}{f' (from {variable})' if variable else ''}: {error['msg']}")
    return out


def _variable_of(loc: list[str], environment: dict[str, str]) -> str:
    """The DDS_* variable that set the setting at `loc` (or the section it is in), "" when none did."""
    for depth in range(len(loc), 0, -1):
        name = "DDS_" + "__".join(loc[:depth]).upper()
        if name in environment:
            return environment[name]
    return ""


@contextmanager
def cluster_failures(server: Callable[[], str] = lambda: "the apiserver") -> Iterator[None]:
    """Raise what goes wrong with the cluster inside as a Failure with its exit code (dds/kube/preflight.py says which
    problem an exception stands for); anything else passes through unchanged. `server`: the apiserver's address, once
    known."""
    from dds.kube.preflight import ClusterUnusable, explain

    try:
        yield
    except ClusterUnusable as exc:
        raise Failure.of(exc.problem) from exc
    except Failure:
        raise
    except Exception as exc:
        problem = explain(exc, server())
        if problem is None:
            raise
        raise Failure.of(problem) from exc
