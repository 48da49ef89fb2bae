"""The wheel holds the product and nothing else: no test harness, no tests, and it still has what `dds` needs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_dds_without_the_test_harness(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [wheel] = tmp_path.glob("dds-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("dds-")}
    assert packages == {"dds"}, sorted(packages)
    assert not [n for n in names if n.startswith(("dds/testing/", "harness/", "tests/"))]
    for needed in ("dds/cli.py", "dds/app.py", "dds/provider/servicer.py", "dds/scaling/requests.py",
                   "dds/provider/gen/externalgrpc/externalgrpc_pb2.py"):
        assert needed in names
