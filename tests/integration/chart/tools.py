"""helm and promtool for the chart, alert and dashboard tests: the binaries hack/build-tools.sh builds (make setup),
found where it caches them. Missing tools fail the test with the command that builds them, never skip it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from harness.chart import CHART, KUBE_VERSION, tools_dir

ROOT = Path(__file__).resolve().parents[3]
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"


def tool(name: str) -> Path:
    path = tools_dir() / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not built ({path} is missing): run `make setup` (or `bash hack/build-tools.sh`), "
                    f"which builds helm and promtool from their Go modules", pytrace=False)
    return path


def run(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(tool(name)), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check and result.returncode != 0:
        pytest.fail(f"{name} {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}",
                    pytrace=False)
    return result


def set_args(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


_rendered: dict[tuple[Any, ...], str] = {}


def helm_template(values: dict[str, str], namespace: str = "dds-system", release: str = "dds",
                  check: bool = True) -> Any:
    """The chart rendered as `helm install` would (release `release` in `namespace`): its objects (fresh copies, so a
    test may change them), or with check=False the finished process (to read a refusal's message)."""
    if not check:
        return run("helm", "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION,
                   *set_args(values), check=False)
    key = (tuple(sorted(values.items())), namespace, release)
    if key not in _rendered:  # one helm process per value set and session: each takes a second or two
        _rendered[key] = run("helm", "template", release, str(CHART), "--namespace", namespace, "--kube-version",
                             KUBE_VERSION, *set_args(values)).stdout
    return [doc for doc in yaml.safe_load_all(_rendered[key]) if doc]


def script_module(script: Path, name: str) -> ModuleType:
    """A hack/ generator as a module (it imports its neighbour hack/generated_file.py, as when run from hack/)."""
    if str(script.parent) not in sys.path:
        sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
