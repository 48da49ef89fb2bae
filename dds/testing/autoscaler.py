"""Start "the autoscaler" for e2e tests and `make demo`: the real cluster-autoscaler when one is available, else the
stand-in.

`DDS_CLUSTER_AUTOSCALER=/path/to/cluster-autoscaler` selects the real binary (built with the externalgrpc provider);
it runs as a process with the flags from shared/reference/control-plane.md. Without it, `AutoscalerStandIn` runs in a
thread of the test process. Either way the handle says which one runs (`kind`) and where its log is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional

from dds.testing.ca_standin import AutoscalerStandIn, StandInOptions

ENV_BINARY = "DDS_CLUSTER_AUTOSCALER"
STANDIN_KIND = "stand-in"
_VERSION_LINE = re.compile(r"Cluster Autoscaler (\S+)")
_VERSION_WAIT_SECONDS = 15.0


@dataclass(frozen=True)
class AutoscalerTimings:
    """Timing flags in seconds, short for tests. None leaves cluster-autoscaler's own default."""

    scan_interval: float = 2.0
    max_node_provision_time: float = 120.0
    scale_down_unneeded_time: float = 30.0
    scale_down_delay_after_add: float = 30.0
    node_info_cache_expire_time: float = 60.0
    scale_down_delay_after_delete: Optional[float] = None
    scale_down_delay_after_failure: Optional[float] = None
    scale_down_unready_time: Optional[float] = None
    new_pod_scale_up_delay: Optional[float] = None
    # How long CA leaves a group alone after a failed scale-up (a provider crash during IncreaseSize is one): short in
    # the crash campaign, which fails scale-ups on purpose.
    initial_node_group_backoff_duration: Optional[float] = None
    max_node_group_backoff_duration: Optional[float] = None

    @classmethod
    def from_kwargs(cls, **timings: float) -> "AutoscalerTimings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(timings) - known)
        if unknown:
            raise TypeError(f"unknown autoscaler timing(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for name, value in timings.items():
            if value is not None and value < 0:
                raise ValueError(f"autoscaler timing {name} must not be negative, got {value}")
        return cls(**timings)

    def flags(self) -> list[str]:
        return [f"--{name.replace('_', '-')}={format_go_duration(value)}"
                for name, value in asdict(self).items() if value is not None]

    def standin_options(self, base: StandInOptions) -> StandInOptions:
        given = {_STANDIN_NAMES.get(name, name): value for name, value in asdict(self).items() if value is not None}
        return replace(base, **given)


# Flag names whose StandInOptions field is spelled differently.
_STANDIN_NAMES = {"initial_node_group_backoff_duration": "initial_node_group_backoff",
                  "max_node_group_backoff_duration": "max_node_group_backoff"}


def format_go_duration(seconds: float) -> str:
    """Seconds as a Go duration flag value ("90s", "1500ms"); whole seconds avoid float formatting surprises."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{int(round(seconds * 1000))}ms"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class AutoscalerHandle:
    kind: str  # "cluster-autoscaler <version>" or "stand-in"
    log_path: Path
    standin: Optional[AutoscalerStandIn] = None
    process: Optional[subprocess.Popen[bytes]] = None
    _log_handler: Optional[logging.Handler] = None
    _stopped: bool = False

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.standin is not None and self.standin.crashed is None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop it; a second call does nothing (a test that restarts CA stops it before the stack's teardown does)."""
        if self._stopped:
            return
        self._stopped = True
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout)
            return
        if self.standin is not None:
            self.standin.stop(timeout)
            calls_path = self.log_path.with_name("ca-standin-calls.jsonl")
            with calls_path.open("w") as out:
                for call in self.standin.calls:
                    out.write(json.dumps(asdict(call)) + "\n")
        if self._log_handler is not None:
            logging.getLogger("dds.testing.ca_standin").removeHandler(self._log_handler)
            self._log_handler.close()


def _read_version(log_path: Path, process: subprocess.Popen[bytes]) -> str:
    """CA prints "Cluster Autoscaler <version>" at -v=1 when it starts; wait briefly for it."""
    deadline = time.monotonic() + _VERSION_WAIT_SECONDS
    while time.monotonic() < deadline:
        match = _VERSION_LINE.search(log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"cluster-autoscaler exited with {process.returncode} at start; see {log_path}")
        time.sleep(0.2)
    return "(version not logged)"


def _start_binary(binary: Path, kubeconfig: Path, cloud_config: Path, workdir: Path,
                  timings: AutoscalerTimings) -> AutoscalerHandle:
    log_path = workdir / "cluster-autoscaler.log"
    command = [str(binary), "--cloud-provider=externalgrpc", f"--cloud-config={cloud_config}",
               f"--kubeconfig={kubeconfig}", "--leader-elect=false", f"--address=127.0.0.1:{free_port()}",
               "--skip-nodes-with-system-pods=false", "--v=4", *timings.flags()]
    (workdir / "cluster-autoscaler.cmdline").write_text(" ".join(command) + "\n")
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir,
                                   start_new_session=True)
    try:
        version = _read_version(log_path, process)
    except Exception:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
    return AutoscalerHandle(kind=f"cluster-autoscaler {version}", log_path=log_path, process=process)


def _start_standin(kubeconfig: Path, cloud_config: Path, workdir: Path, timings: AutoscalerTimings,
                   standin_options: StandInOptions) -> AutoscalerHandle:
    log_path = workdir / "ca-standin.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("dds.testing.ca_standin")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # Same behaviour as the flags the real binary gets.
    options = timings.standin_options(replace(standin_options, skip_nodes_with_system_pods=False))
    standin = AutoscalerStandIn(kubeconfig, cloud_config, scan_interval=options.scan_interval,
                                max_node_provision_time=options.max_node_provision_time, options=options)
    standin.run_in_thread()
    return AutoscalerHandle(kind=STANDIN_KIND, log_path=log_path, standin=standin, _log_handler=handler)


def start_autoscaler(kubeconfig: Path, cloud_config: Path, workdir: Path,
                     standin_options: Optional[StandInOptions] = None, **timings: Any) -> AutoscalerHandle:
    """Start the real cluster-autoscaler ($DDS_CLUSTER_AUTOSCALER) or else the stand-in; `timings` are
    AutoscalerTimings fields in seconds. `standin_options` tunes what only the stand-in has (backoff, buffers)."""
    parsed = AutoscalerTimings.from_kwargs(**timings)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    binary = os.environ.get(ENV_BINARY, "").strip()
    if binary:
        path = Path(binary)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{ENV_BINARY}={binary!r} is not an executable file")
        return _start_binary(path, Path(kubeconfig), Path(cloud_config), workdir, parsed)
    return _start_standin(Path(kubeconfig), Path(cloud_config), workdir, parsed, standin_options or StandInOptions())
