"""harness/netns.py: a parallel test worker's network namespace of its own, where a port the machine's network holds is
free (the CDI operator's fixed webhook port, one per worker), and the reasons it gives when it cannot make one."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import netns

ROOT = Path(__file__).resolve().parents[3]


def test_turned_off_it_says_by_what(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(netns.DISABLE_ENV, "0")
    assert netns.worker_prefix(ROOT) == (None, f"{netns.DISABLE_ENV}=0")


def test_without_unshare_it_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(netns.DISABLE_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert netns.worker_prefix(ROOT) == (None, "no unshare (util-linux) on PATH")


def test_a_worker_listens_on_a_port_the_machines_network_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(netns.DISABLE_ENV, raising=False)
    prefix, how = netns.worker_prefix(ROOT)
    if prefix is None:
        pytest.skip(f"this machine gives a worker no network namespace of its own: {how}")
    with socket.create_server(("", 0)) as held:  # all interfaces, as the operator's webhook listens
        port = held.getsockname()[1]
        script = f"""
import socket
from harness.netns import loopback_up
loopback_up()
socket.create_server(("", {port})).close()
print("listened")
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5)
except ConnectionRefusedError:
    print("nothing else listens there")
"""
        done = subprocess.run([*prefix, sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["listened", "nothing else listens there"], done.stdout
