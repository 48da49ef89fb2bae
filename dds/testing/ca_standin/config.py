"""What the stand-in reads and how it is tuned: the externalgrpc cloud-config file and cluster-autoscaler's timing flags.

The cloud-config is the same YAML file a real cluster-autoscaler gets with `--cloud-config`: `address`, and for mutual
TLS `cert`, `key` and `cacert`; `grpc_timeout` is a Go duration string ("5s", "1m30s"), 5 s when absent. As in
cluster-autoscaler, unknown keys are ignored, TLS is used only when `cert` is set, and then `key` and `cacert` are required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

DEFAULT_GRPC_TIMEOUT = 5.0

_GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class CloudConfigError(ValueError):
    """A cloud-config file cluster-autoscaler would refuse to start with."""


def parse_go_duration(text: str) -> float:
    """Seconds in a Go `time.ParseDuration` string: "300ms", "1h2m3.5s", "-5s", "0"."""
    value = text.strip()
    sign = -1.0 if value.startswith("-") else 1.0
    value = value.lstrip("+-")
    if value == "0":
        return 0.0
    if not value:
        raise ValueError(f"not a Go duration: {text!r}")
    position, total = 0, 0.0
    for match in _GO_DURATION_PART.finditer(value):
        if match.start() != position:
            break
        total += float(match.group(1)) * _GO_DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(value):
        raise ValueError(f"not a Go duration: {text!r} (expected e.g. 5s, 1m30s, 250ms)")
    return sign * total


@dataclass(frozen=True)
class CloudConfig:
    address: str
    grpc_timeout: float = DEFAULT_GRPC_TIMEOUT
    cert: Optional[Path] = None
    key: Optional[Path] = None
    cacert: Optional[Path] = None

    @property
    def host(self) -> str:
        """The host part of `address`, checked against the server certificate as cluster-autoscaler does."""
        return split_host_port(self.address)[0]

    @property
    def uses_tls(self) -> bool:
        return self.cert is not None


def split_host_port(address: str) -> tuple[str, str]:
    """Go's net.SplitHostPort for the forms CA documents: host:port, [host]:port, [host%zone]:port."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or not address[end + 1:].startswith(":"):
            raise ValueError(f"address {address!r}: missing ']' or port")
        return address[1:end], address[end + 2:]
    host, sep, port = address.rpartition(":")
    if not sep or ":" in host:
        raise ValueError(f"address {address!r}: expected host:port")
    return host, port


def _optional_path(data: dict[str, Any], key: str, source: Path) -> Optional[Path]:
    value = data.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise CloudConfigError(f"{source}: field {key!r} must be a file path string, got {value!r}")
    return Path(value)


def parse_cloud_config(text: str, source: Path = Path("<cloud-config>")) -> CloudConfig:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise CloudConfigError(f"{source}: can't parse YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CloudConfigError(f"{source}: the top level must be a mapping with an 'address' field")
    address = data.get("address")
    if not isinstance(address, str) or not address:
        raise CloudConfigError(f"{source}: field 'address' is required (host:port of the externalgrpc provider)")
    try:
        split_host_port(address)
    except ValueError as exc:
        raise CloudConfigError(f"{source}: field 'address': {exc}") from exc
    timeout = DEFAULT_GRPC_TIMEOUT
    if data.get("grpc_timeout") is not None:
        raw = data["grpc_timeout"]
        # metav1.Duration only unmarshals from a string: a bare number is an error in cluster-autoscaler too.
        if not isinstance(raw, str):
            raise CloudConfigError(f"{source}: field 'grpc_timeout' must be a duration string such as \"5s\", "
                                   f"got {raw!r}")
        try:
            timeout = parse_go_duration(raw)
        except ValueError as exc:
            raise CloudConfigError(f"{source}: field 'grpc_timeout': {exc}") from exc
    cert, key, cacert = (_optional_path(data, name, source) for name in ("cert", "key", "cacert"))
    if cert is not None:
        missing = [name for name, value in (("key", key), ("cacert", cacert)) if value is None]
        if missing:
            raise CloudConfigError(f"{source}: 'cert' is set, so {' and '.join(repr(m) for m in missing)} "
                                   f"must be set too (cluster-autoscaler uses mutual TLS)")
    return CloudConfig(address=address, grpc_timeout=timeout, cert=cert, key=key, cacert=cacert)


def load_cloud_config(path: Path) -> CloudConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CloudConfigError(f"could not open cloud provider configuration file {str(path)!r}: {exc}") from exc
    return parse_cloud_config(text, Path(path))


MINUTE = 60.0
HOUR = 3600.0


@dataclass(frozen=True)
class StandInOptions:
    """cluster-autoscaler's flags that the stand-in honours, with CA's defaults (seconds).

    `scale_down_delay_after_delete` None means "the scan interval", as in CA.
    """

    scan_interval: float = 10.0
    max_node_provision_time: float = 15 * MINUTE
    max_node_startup_time: float = 15 * MINUTE
    scale_down_enabled: bool = True
    scale_down_unneeded_time: float = 10 * MINUTE
    scale_down_unready_time: float = 20 * MINUTE
    scale_down_delay_after_add: float = 10 * MINUTE
    scale_down_delay_after_delete: Optional[float] = None
    scale_down_delay_after_failure: float = 3 * MINUTE
    scale_down_utilization_threshold: float = 0.5
    scale_down_gpu_utilization_threshold: float = 0.5
    ignore_daemonsets_utilization: bool = False
    zero_or_max_node_scaling: bool = False
    skip_nodes_with_system_pods: bool = True
    skip_nodes_with_local_storage: bool = True
    node_info_cache_expire_time: float = 87600 * HOUR
    new_pod_scale_up_delay: float = 0.0
    initial_node_group_backoff: float = 5 * MINUTE
    max_node_group_backoff: float = 30 * MINUTE
    node_group_backoff_reset_timeout: float = 3 * HOUR
    # CA refreshes NodeGroupNodes in the background this often (and every loop for a group that is scaling up).
    instances_refresh_interval: float = 2 * MINUTE
    # How long a template from a Ready node must have been stable before CA trusts it (stabilizationDelay).
    template_stabilization_delay: float = 1 * MINUTE
    # A pod newer than this is not acted on yet ("pods are very new, waiting one iteration"); GPU pods wait longer.
    unschedulable_pod_time_buffer: float = 2.0
    unschedulable_gpu_pod_time_buffer: float = 30.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"StandInOptions.{name} must not be negative, got {value}")
        if self.scan_interval <= 0:
            raise ValueError(f"StandInOptions.scan_interval must be positive, got {self.scan_interval}")

    @property
    def delay_after_delete(self) -> float:
        return self.scan_interval if self.scale_down_delay_after_delete is None else self.scale_down_delay_after_delete
