"""Which Kubernetes profile a test run or the demo uses, and what that profile pins (hack/versions*.env).

A profile is one Kubernetes minor: its control plane (kube-apiserver, kube-scheduler, kube-controller-manager) and the
cluster-autoscaler release of the same minor, pinned in hack/versions-<profile>.env. hack/versions.env names the
default profile (`make demo`, `make test`) and the compatibility one (`make test-compat`); `DDS_K8S_PROFILE=<profile>`
selects another for one process and its children (hack/build-binaries.sh reads the same variable, so the binaries the
harness starts and the pins it checks them against always come from the same profile). docs/versions.md has the matrix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

HACK = Path(__file__).resolve().parents[1] / "hack"
SHARED_PINS = HACK / "versions.env"
ENV_PROFILE = "DDS_K8S_PROFILE"


class VersionsError(RuntimeError):
    """A profile that hack/ does not pin, or a pin file that lacks a value the harness needs."""


@dataclass(frozen=True)
class KubernetesProfile:
    name: str  # "1.36"
    kubernetes_version: str  # "v1.36.3"
    autoscaler_version: str  # "1.36.1"

    @property
    def minor(self) -> tuple[int, int]:
        """(1, 36): what code that differs between Kubernetes minors branches on."""
        return minor_of(self.kubernetes_version)

    def at_least(self, major: int, minor: int) -> bool:
        return self.minor >= (major, minor)


def read_pins(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a hack/versions*.env file (comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            pins[key.strip()] = value.strip()
    return pins


def minor_of(version: str) -> tuple[int, int]:
    """(major, minor) of "v1.36.3", "1.36.1" or "v1.36.0-alpha.1"; a ValueError names what it could not read."""
    parts = version.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a Kubernetes version: {version!r}") from None


def known_profiles() -> list[str]:
    return sorted(p.name[len("versions-"):-len(".env")] for p in HACK.glob("versions-*.env"))


def default_profile_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """$DDS_K8S_PROFILE when set, else hack/versions.env's DDS_DEFAULT_K8S_PROFILE."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV_PROFILE, "").strip()
    if chosen:
        return chosen
    try:
        return read_pins(SHARED_PINS)["DDS_DEFAULT_K8S_PROFILE"]
    except KeyError:
        raise VersionsError(f"{SHARED_PINS} names no DDS_DEFAULT_K8S_PROFILE") from None


def compat_profile_name() -> str:
    try:
        return read_pins(SHARED_PINS)["DDS_COMPAT_K8S_PROFILE"]
    except KeyError:
        raise VersionsError(f"{SHARED_PINS} names no DDS_COMPAT_K8S_PROFILE") from None


def load_profile(name: str) -> KubernetesProfile:
    path = HACK / f"versions-{name}.env"
    if not path.is_file():
        raise VersionsError(f"no Kubernetes profile {name!r} (no {path}; ${ENV_PROFILE} or hack/versions.env names it); "
                            f"known profiles: {', '.join(known_profiles())}")
    pins = read_pins(path)
    missing = [key for key in ("KUBERNETES_VERSION", "CLUSTER_AUTOSCALER_VERSION") if not pins.get(key)]
    if missing:
        raise VersionsError(f"{path} pins no {', '.join(missing)}")
    return KubernetesProfile(name=name, kubernetes_version=pins["KUBERNETES_VERSION"],
                             autoscaler_version=pins["CLUSTER_AUTOSCALER_VERSION"])


def active_profile(environ: Optional[Mapping[str, str]] = None) -> KubernetesProfile:
    """The profile this process runs: $DDS_K8S_PROFILE, else the default one."""
    return load_profile(default_profile_name(environ))
