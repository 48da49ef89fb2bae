"""Crash points (dds/crashpoints.py): parsed strictly, silent unless armed, SIGKILL at exactly the armed hit, and every
point the campaign lists is really marked in the code (a renamed step must not silently stop being crashed)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dds import crashpoints

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("spec,expected", [
    pytest.param(None, {}, id="unset"),
    pytest.param("", {}, id="empty"),
    pytest.param("remove.cordoned", {"remove.cordoned": 1}, id="first-hit-by-default"),
    pytest.param(" fabric.attach.accepted:3 , nodes.add.patched:1 ",
                 {"fabric.attach.accepted": 3, "nodes.add.patched": 1}, id="several-with-spaces"),
])
def test_parse_accepts(spec, expected):
    assert dict(crashpoints.parse(spec).at_hit) == expected


@pytest.mark.parametrize("spec,message", [
    pytest.param("remove.cordonned", "unknown crash point 'remove.cordonned'", id="typo"),
    pytest.param("remove.cordoned:x", "whole number", id="not-a-number"),
    pytest.param("remove.cordoned:0", "at least 1", id="zero"),
])
def test_parse_refuses_with_the_reason(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        crashpoints.parse(spec)


def test_a_bad_value_is_a_usage_error_of_dds_serve(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dds", "serve", "--node-groups", str(tmp_path / "none.yaml"),
                             "--insecure"], env={"DDS_CRASH_AT": "no.such.point", "PATH": ""},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown crash point 'no.such.point'" in result.stderr


def run_hits(spec: str, hits: int) -> subprocess.CompletedProcess:
    program = ("from dds.crashpoints import crashpoint\n"
               f"for i in range({hits}):\n"
               "    print('before', i + 1, flush=True)\n"
               "    crashpoint('fabric.detach.accepted')\n"
               "print('survived', flush=True)\n")
    return subprocess.run([sys.executable, "-c", program], env={"DDS_CRASH_AT": spec}, capture_output=True,
                          text=True, timeout=60)


def test_the_process_is_killed_at_the_armed_hit_and_says_where():
    result = run_hits("fabric.detach.accepted:2", hits=5)
    assert result.returncode == -signal.SIGKILL
    assert result.stdout.split() == ["before", "1", "before", "2"]
    assert f"{crashpoints.LOG_MARKER} fabric.detach.accepted hit 2: SIGKILL" in result.stderr


def test_points_not_armed_do_nothing():
    result = run_hits("fabric.attach.accepted", hits=3)
    assert result.returncode == 0
    assert "survived" in result.stdout


def test_every_listed_point_is_marked_in_the_code_and_every_mark_is_listed():
    marked = set()
    for path in (ROOT / "dds").rglob("*.py"):
        marked |= set(re.findall(r'crashpoint\("([^"]+)"\)', path.read_text()))
    assert marked == set(crashpoints.POINTS)
