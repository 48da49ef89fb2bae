"""The wheel holds the product and nothing else: no test harness, no tests, and it still has what `dds` needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Build outputs and caches of the checkout: setuptools copies into build/ without removing what was moved away since,
# so a wheel built in place could ship a module the sources no longer have there.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                                     ".pytest_cache", ".import_linter_cache")


def test_the_wheel_ships_dds_without_the_test_harness(tmp_path):
    sources = tmp_path / "checkout"
    shutil.copytree(ROOT, sources, ignore=NOT_SOURCES)
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(wheels), str(sources)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [wheel] = wheels.glob("dds-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("dds-")}
    assert packages == {"dds"}, sorted(packages)
    assert not [n for n in names if n.startswith(("dds/testing/", "harness/", "tests/"))]
    # The planner benchmark and its synthetic clusters are test support (tests/bench/), not product.
    assert not [n for n in names if n in ("dds/planner/bench.py", "dds/planner/synthetic.py")]
    for needed in ("dds/cli.py", "dds/app.py", "dds/provider/servicer.py", "dds/scaling/requests.py",
                   "dds/provider/gen/externalgrpc/externalgrpc_pb2.py"):
        assert needed in names
