"""Start the real cluster-autoscaler for e2e tests and `make demo`, wired to DDS over externalgrpc.

Which binary: the one the caller names, else `DDS_CLUSTER_AUTOSCALER=/path/to/cluster-autoscaler`, else the one
hack/build-binaries.sh built into the binary cache. There is no fallback: a missing binary, one built without the
externalgrpc provider, or one of another version than the Kubernetes profile pins (hack/versions-<profile>.env, the
profile from harness/versions.py) is an `AutoscalerError` that says so, before anything is started. The running
process's log must then name the pinned version too, of the control plane's Kubernetes minor (`check_same_minor`).

It runs with the flags from shared/reference/control-plane.md, timings short enough for tests (`AutoscalerTimings`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Optional, Sequence

from harness import versions
from harness.controlplane import free_ports

ENV_BINARY = "DDS_CLUSTER_AUTOSCALER"
_VERSION_LINE = re.compile(r"Cluster Autoscaler (\S+)")
_PROVIDERS_IN_HELP = re.compile(r"Cloud provider type\. Available values: \[([^\]]*)\]")
_VERSION_WAIT_SECONDS = 20.0


class AutoscalerError(RuntimeError):
    """The cluster-autoscaler binary is missing, not the pinned version, lacks externalgrpc, or did not start."""


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


def format_go_duration(seconds: float) -> str:
    """Seconds as a Go duration flag value ("90s", "1500ms"); whole seconds avoid float formatting surprises."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{int(round(seconds * 1000))}ms"


def free_port() -> int:
    """A free loopback port (under pytest-xdist from the worker's own block: harness/controlplane.py `free_ports`)."""
    return free_ports(1)[0]


def pinned_version() -> str:
    """CLUSTER_AUTOSCALER_VERSION of the active Kubernetes profile: the one version the tests accept."""
    try:
        return versions.active_profile().autoscaler_version
    except versions.VersionsError as exc:
        raise AutoscalerError(str(exc)) from exc


def find_binary(explicit: Optional[Path] = None, bin_dir: Optional[Path] = None) -> Path:
    """The binary to run: `explicit`, else $DDS_CLUSTER_AUTOSCALER, else `bin_dir`/cluster-autoscaler."""
    if explicit is not None:
        source, path = "the binary named by the caller", Path(explicit)
    elif os.environ.get(ENV_BINARY, "").strip():
        source, path = f"{ENV_BINARY}", Path(os.environ[ENV_BINARY].strip())
    elif bin_dir is not None:
        source, path = "the binary cache", Path(bin_dir) / "cluster-autoscaler"
    else:
        raise AutoscalerError(f"no cluster-autoscaler binary: set {ENV_BINARY} or run `bash hack/build-binaries.sh`")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AutoscalerError(f"{source}: {path} is not an executable cluster-autoscaler "
                              f"(run `bash hack/build-binaries.sh`, which builds it from source)")
    return path


def check_externalgrpc(binary: Path) -> None:
    """Refuse a binary built without the externalgrpc provider: its --help lists the providers it was built with."""
    try:
        done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AutoscalerError(f"{binary} --help did not run: {exc}") from exc
    match = _PROVIDERS_IN_HELP.search(done.stdout + done.stderr)
    if match is None:
        raise AutoscalerError(f"{binary} does not look like cluster-autoscaler: its --help has no --cloud-provider")
    providers = [p.strip() for p in match.group(1).split(",") if p.strip()]
    if "externalgrpc" not in providers:
        raise AutoscalerError(f"{binary} was built without the externalgrpc provider (it has: {', '.join(providers)}); "
                              f"build it with `go build -tags externalgrpc` (hack/build-binaries.sh does)")


@dataclass
class AutoscalerHandle:
    kind: str  # "cluster-autoscaler <version>"
    log_path: Path
    process: subprocess.Popen[bytes]
    _stopped: bool = False

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as when CA's pod is OOM-killed or its node dies."""
        if self.running():
            self.process.kill()
            self.process.wait(30)
        self._stopped = True

    def stop(self, timeout: float = 30.0) -> None:
        """Stop it; a second call does nothing (a test that restarts CA stops it before the stack's teardown does)."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)


def _logged_version(log_path: Path, process: subprocess.Popen[bytes]) -> str:
    """CA prints "Cluster Autoscaler <version>" at -v=1 when it starts."""
    deadline = time.monotonic() + _VERSION_WAIT_SECONDS
    while time.monotonic() < deadline:
        match = _VERSION_LINE.search(log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if process.poll() is not None:
            raise AutoscalerError(f"cluster-autoscaler exited with {process.returncode} at start; see {log_path}")
        time.sleep(0.2)
    raise AutoscalerError(f"cluster-autoscaler logged no version within {_VERSION_WAIT_SECONDS:.0f}s; see {log_path}")


def check_same_minor(autoscaler_version: str, control_plane_version: str) -> None:
    """Refuse a cluster-autoscaler of another Kubernetes minor than the control plane's: CA releases follow Kubernetes
    minors, vendor that minor's scheduler framework and API types, and upstream supports only the matching pair."""
    ca_minor, plane_minor = versions.minor_of(autoscaler_version), versions.minor_of(control_plane_version)
    if ca_minor != plane_minor:
        raise AutoscalerError(
            f"cluster-autoscaler {autoscaler_version} is for Kubernetes {ca_minor[0]}.{ca_minor[1]}, but the control "
            f"plane is Kubernetes {control_plane_version}: run the cluster-autoscaler release of the control plane's "
            f"minor (one Kubernetes profile, hack/versions-<profile>.env, pins both; DDS_K8S_PROFILE selects it)")


def start_autoscaler(kubeconfig: Path, cloud_config: Path, workdir: Path, *, binary: Optional[Path] = None,
                     bin_dir: Optional[Path] = None, namespace: str = "dds-system",
                     control_plane_version: Optional[str] = None, extra_flags: Sequence[str] = (),
                     **timings: Any) -> AutoscalerHandle:
    """Start the real cluster-autoscaler (see the module docstring for which binary); `timings` are AutoscalerTimings
    fields in seconds. Raises AutoscalerError, with nothing left running, when it is not the pinned version with the
    externalgrpc provider, or (given `control_plane_version`, the apiserver's gitVersion) not of the control plane's
    Kubernetes minor. `kubeconfig` should be CA's ServiceAccount's (harness/rbac.py), not the admin's."""
    parsed = AutoscalerTimings.from_kwargs(**timings)
    path = find_binary(binary, bin_dir)
    check_externalgrpc(path)
    want = pinned_version()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "cluster-autoscaler.log"
    command = [str(path), "--cloud-provider=externalgrpc", f"--cloud-config={cloud_config}",
               f"--kubeconfig={kubeconfig}", "--leader-elect=false", f"--address=127.0.0.1:{free_port()}",
               # As manifests/cluster-autoscaler/deployment.yaml: its Role grants the status ConfigMap only there.
               f"--namespace={namespace}",
               "--skip-nodes-with-system-pods=false", "--v=4", *parsed.flags(), *extra_flags]
    (workdir / "cluster-autoscaler.cmdline").write_text(" ".join(command) + "\n")
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir,
                                   start_new_session=True)
    handle = AutoscalerHandle(kind="cluster-autoscaler", log_path=log_path, process=process)
    try:
        version = _logged_version(log_path, process)
        if control_plane_version is not None:
            check_same_minor(version, control_plane_version)
        if version != want:
            raise AutoscalerError(f"{path} is cluster-autoscaler {version}; the tests pin {want} "
                                  f"(Kubernetes profile {versions.default_profile_name()}, hack/versions-"
                                  f"{versions.default_profile_name()}.env): rebuild with `bash hack/build-binaries.sh`")
    except BaseException:
        handle.stop()
        raise
    handle.kind = f"cluster-autoscaler {version}"
    return handle
