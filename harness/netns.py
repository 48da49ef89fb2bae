"""A network namespace of its own for each parallel test worker (harness/xdist_plugin.py), so that a port a component
fixes is one per worker rather than one per machine.

The port this is for: the CDI operator's admission webhook, 9443 on all interfaces. cro-manager has no flag or
environment variable that moves it: its cmd/main.go builds the webhook server with `webhook.NewServer(webhook.Options
{TLSOpts: tlsOpts})`, so controller-runtime (v0.23.3, pkg/webhook/server.go) fills in `Port = DefaultPort`, a Go `int`
variable (9443) that the linker's `-X` (strings only) cannot set, and `Host = ""` (every address). Moving it would mean
patching the operator; a network namespace leaves it as shipped.

How: a worker's Python is started through util-linux's `unshare` (`worker_prefix`): `--net` as root, or
`--user --map-root-user --net` as any user where the kernel allows unprivileged user namespaces. The new namespace has
only a loopback interface, down; the worker brings it up before anything listens (`loopback_up`). Everything the worker
starts (etcd, apiserver, scheduler, kwok, CA, DDS, the operator, the emulators) inherits the namespace and talks over
that loopback; the xdist controller reaches the worker over pipes, which a network namespace does not touch. A worker
has no other network: the binaries must be built before it starts (`make test` and `make test-compat` run
`make setup` first; a lone `pytest -n` on a fresh clone needs `make setup` or DDS_TEST_NETNS=0).

`worker_prefix` tries it once (a throw-away process that brings its loopback up and listens on it) and says why not
when it cannot (no unshare, user namespaces disabled or restricted, as Ubuntu's AppArmor does by default since 24.04):
the plugin then keeps every operator module in one worker, as before. DDS_TEST_NETNS=0 turns it off (then a worker's
components can be reached from the host's shell, e.g. while debugging; with it on, `nsenter --target <worker pid>
--net [--user]` enters a worker's network)."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Optional

DISABLE_ENV = "DDS_TEST_NETNS"
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH14x"  # struct ifreq: the interface's name, then ifr_flags in the union
PROBE_TIMEOUT_S = 30.0
# Run in the throw-away namespace: what a worker does first, then a listen on the loopback it brought up.
_PROBE = ("import socket; from harness.netns import loopback_up; loopback_up(); "
          "socket.create_server(('127.0.0.1', 0)).close()")


def loopback_up() -> None:
    """Bring this network namespace's loopback interface up (a new namespace starts with it down: nothing could listen
    on 127.0.0.1). Needs CAP_NET_ADMIN in the namespace, which its creator has."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def worker_prefix(cwd: Path) -> tuple[Optional[list[str]], str]:
    """The command to put before a worker's Python so that it runs in a network namespace of its own, and how; or
    None and why not. Tried once with this Python (`cwd`: where `harness` imports from)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"{DISABLE_ENV}=0"
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "no unshare (util-linux) on PATH"
    # As root (with CAP_SYS_ADMIN) a network namespace alone; otherwise (or in a container that drops the capability)
    # inside a user namespace whose root is this user.
    prefixes = ([[unshare, "--net"]] if os.geteuid() == 0 else []) + [[unshare, "--user", "--map-root-user", "--net"]]
    failures = []
    for prefix in prefixes:
        why = _try(prefix, cwd)
        if not why:
            return prefix, "unshare " + " ".join(prefix[1:])
        failures.append(f"`{' '.join(prefix)}`: {why}")
    return None, "; ".join(failures)


def _try(prefix: list[str], cwd: Path) -> str:
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", _PROBE], cwd=cwd, capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
    return ""
