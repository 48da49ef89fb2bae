"""What a node group's definition says: the annotation keys, and the one parser (`parse_group`) that validates them
into a NodeGroupSpec. A MachineSet's annotations and a YAML file's entries (dds/groups/sources.py) both go through it,
so a key means the same thing wherever it is written:

| key (annotation)                                                 | NodeGroupSpec field              | default          |
|------------------------------------------------------------------|----------------------------------|------------------|
| cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size      | min_size                         | 0                |
| cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size      | max_size                         | required         |
| capacity.cluster-autoscaler.kubernetes.io/cpu, memory            | milli_cpu, memory                | required         |
| capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk         | ephemeral_storage                | 100Gi            |
| capacity.cluster-autoscaler.kubernetes.io/maxPods                | max_pods                         | 110              |
| capacity.cluster-autoscaler.kubernetes.io/gpu-count              | initial_gpus (a new node's GPUs) | 0                |
| capacity.cluster-autoscaler.kubernetes.io/gpu-type               | gpu_resource, if ours is absent  | nvidia.com/gpu   |
| capacity.cluster-autoscaler.kubernetes.io/labels (`k=v,k2=v2`)   | labels                           | none             |
| capacity.cluster-autoscaler.kubernetes.io/taints (`k=v:Effect`)  | taints (after spec.template.spec.taints) | none     |
| dds.cdi.dev/max-gpus-per-node                                    | max_gpus_per_node                | gpu-count        |
| dds.cdi.dev/gpu-resource                                         | gpu_resource                     | see gpu-type     |
| dds.cdi.dev/gpu-models (comma-separated, first = default)        | gpu_models                       | any model        |
| dds.cdi.dev/fabric-pool                                          | fabric_pool                      | default          |
| dds.cdi.dev/template-mode (spec-fixed, observed)                 | template_mode                    | spec-fixed       |
| dds.cdi.dev/gpu-idle-cooldown, node-idle-cooldown (10m, 600)     | *_cooldown_seconds               | 5m, 10m          |
| dds.cdi.dev/force-detach (true, false)                           | force_detach                     | false            |
| dds.cdi.dev/warm-gpus (whole number >= 0)                         | warm_gpus (idle GPUs kept)       | the pool's       |
| dds.cdi.dev/gpu-api (extended-resource, dra-node-local, dra-pool) | gpu_api (how pods get GPUs)      | extended-resource |
| dds.cdi.dev/max-cxl-memory-per-node (a memory quantity, 256Gi)   | max_cxl_memory                   | 0 (no CXL memory) |
| dds.cdi.dev/cxl-memory-chunk (a memory quantity, 16Gi)           | cxl_memory_chunk                 | required with the max |
| dds.cdi.dev/dra-driver (a DRA group's driver, e.g. gpu.nvidia.com) | dra.driver                     | gpu.dds.cdi.dev  |
| dds.cdi.dev/dra-device-class                                     | dra.device_class                 | the driver name  |
| dds.cdi.dev/dra-model-attribute, dra-memory-capacity             | dra.model_attribute, memory_capacity | productName, memory |
| dds.cdi.dev/dra-device-id-attribute (the fabric id, GPU UUID)    | dra.device_id_attribute          | uuid             |
| dds.cdi.dev/dra-models (`A100=NVIDIA A100-SXM4-80GB:80Gi,...`)    | dra.models (shape of unseen models) | none          |
| dds.cdi.dev/dra-device-attributes (`type=gpu,...`)               | dra.device_attributes            | none             |
| cluster.x-k8s.io/autoscaling-options-<option>                    | options (CA's per-group options) | CA's defaults    |

Options as cluster-autoscaler's clusterapi provider names them: scaledownutilizationthreshold,
scaledowngpuutilizationthreshold (0..1), scaledownunneededtime, scaledownunreadytime, maxnodeprovisiontime (Go
durations such as `10m0s`); DDS also reads zeroormaxnodescaling and ignoredaemonsetsutilization (true/false).
maxnodestartuptime is accepted and ignored: no released externalgrpc client has a field for it.

CXL memory (docs/cxl-memory.md) is planned in chunks: the maximum must be a whole number of chunks, and a chunk size
without a maximum (or the other way round) is an error.

A DRA group (gpu-api dra-node-local or dra-pool) has no GPU resource: dds.cdi.dev/gpu-resource is refused on it and
gpu-type is ignored; a dra-pool group's nodes boot with no GPU (gpu-count 0). docs/dra.md says what each API means.
The dra-* keys belong to DRA groups only; all but dra-driver and dra-device-class describe a vendor's driver's devices
and are refused with DDS's own driver (whose shape is fixed); a dra-pool group keeps DDS's driver.

Values beyond what Kubernetes or CA can hold (sizes over int32, quantities over 2^63-1, durations over a Go
time.Duration) and names the apiserver would refuse on a node (label keys and values, taint keys and values, the GPU
resource, GPU models, which become label values) are malformed too.

Every key is checked: a `dds.cdi.dev/` annotation or an autoscaling option DDS does not know (a typo such as
`dds.cdi.dev/max-gpu-per-node`) is an error with a "did you mean" hint, never served on a guess.

A malformed group is reported (log line and Event naming the object and the key, metric
`dds_node_group_config_errors_total{source, reason}`) and skipped; the others keep working. A source that cannot be read at all
(apiserver down, file unreadable) keeps the last good groups (dds/groups/catalog.py).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, TypeVar

from pydantic import ValidationError

from dds.model import groups as g
from dds.model.groups import GpuApi, NodeGroupSpec, OptionOverrides, SourceRef, Taint, TemplateMode
from dds.model.quantity import QuantityError, QuantityTooLarge, to_int, to_milli

CAP_CPU = g.ANN_CAPACITY_PREFIX + "cpu"
CAP_MEMORY = g.ANN_CAPACITY_PREFIX + "memory"
CAP_EPHEMERAL_DISK = g.ANN_CAPACITY_PREFIX + "ephemeral-disk"
CAP_MAX_PODS = g.ANN_CAPACITY_PREFIX + "maxPods"
CAP_GPU_COUNT = g.ANN_CAPACITY_PREFIX + "gpu-count"
CAP_GPU_TYPE = g.ANN_CAPACITY_PREFIX + "gpu-type"
CAP_LABELS = g.ANN_CAPACITY_PREFIX + "labels"
CAP_TAINTS = g.ANN_CAPACITY_PREFIX + "taints"

OPT_SCALE_DOWN_UTILIZATION = g.ANN_OPTIONS_PREFIX + "scaledownutilizationthreshold"
OPT_SCALE_DOWN_GPU_UTILIZATION = g.ANN_OPTIONS_PREFIX + "scaledowngpuutilizationthreshold"
OPT_SCALE_DOWN_UNNEEDED = g.ANN_OPTIONS_PREFIX + "scaledownunneededtime"
OPT_SCALE_DOWN_UNREADY = g.ANN_OPTIONS_PREFIX + "scaledownunreadytime"
OPT_MAX_NODE_PROVISION = g.ANN_OPTIONS_PREFIX + "maxnodeprovisiontime"
OPT_ZERO_OR_MAX = g.ANN_OPTIONS_PREFIX + "zeroormaxnodescaling"
OPT_IGNORE_DAEMONSETS = g.ANN_OPTIONS_PREFIX + "ignoredaemonsetsutilization"
OPT_MAX_NODE_STARTUP = g.ANN_OPTIONS_PREFIX + "maxnodestartuptime"  # accepted and ignored (see above)

# Every key of the two prefixes DDS owns or reads whole; any other key under them is an error (a typo, not a guess).
KNOWN_DDS_KEYS = frozenset({
    g.ANN_ENABLED, g.ANN_MAX_GPUS, g.ANN_GPU_RESOURCE, g.ANN_GPU_MODELS, g.ANN_FABRIC_POOL, g.ANN_TEMPLATE_MODE,
    g.ANN_GPU_IDLE_COOLDOWN, g.ANN_NODE_IDLE_COOLDOWN, g.ANN_FORCE_DETACH, g.ANN_WARM_GPUS, g.ANN_GPU_API,
    g.ANN_DRA_DRIVER, g.ANN_DRA_DEVICE_CLASS, g.ANN_DRA_MODEL_ATTRIBUTE, g.ANN_DRA_MEMORY_CAPACITY,
    g.ANN_DRA_DEVICE_ID_ATTRIBUTE, g.ANN_DRA_MODELS, g.ANN_DRA_DEVICE_ATTRIBUTES, g.ANN_SCALE_REQUESTS,
    g.ANN_MAX_CXL_MEMORY, g.ANN_CXL_MEMORY_CHUNK})
KNOWN_OPTION_KEYS = frozenset({
    OPT_SCALE_DOWN_UTILIZATION, OPT_SCALE_DOWN_GPU_UTILIZATION, OPT_SCALE_DOWN_UNNEEDED, OPT_SCALE_DOWN_UNREADY,
    OPT_MAX_NODE_PROVISION, OPT_ZERO_OR_MAX, OPT_IGNORE_DAEMONSETS, OPT_MAX_NODE_STARTUP})

# Why a definition was refused: the `reason` label of dds_node_group_config_errors_total.
MALFORMED = "malformed"
UNKNOWN_KEY = "unknown-key"

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

T = TypeVar("T")


# --- errors and results ---

@dataclass(frozen=True)
class GroupConfigError:
    """One bad key of one group definition."""

    source: SourceRef
    group_id: str
    key: str  # the annotation (or YAML key) at fault
    message: str
    reason: str = MALFORMED  # MALFORMED, UNKNOWN_KEY or a refusal of dds/groups/access.py

    def describe(self) -> str:
        return f"node group {self.group_id or '?'} ({self.source.describe()}): {self.key}: {self.message}"


# --- parsing ---

def parse_duration(text: str) -> float:
    """A Go duration ("10m0s", "1h30m", "500ms") or a plain number of seconds, as seconds."""
    value = text.strip()
    if not value:
        raise ValueError("empty duration")
    try:
        seconds = float(value)
    except ValueError:
        seconds = _parse_go_duration(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"not a non-negative duration: {text!r}")
    return seconds


def _parse_go_duration(value: str) -> float:
    body = value[1:] if value[0] in "+-" else value
    if value.startswith("-"):
        raise ValueError(f"negative duration: {value!r}")
    position, total = 0, 0.0
    for match in _GO_DURATION.finditer(body):
        if match.start() != position:
            break
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        position = match.end()
    if position != len(body) or position == 0:
        raise ValueError(f"not a duration (e.g. 10m, 1h30m, 90s): {value!r}")
    return total


@dataclass
class GroupInput:
    """A group definition before validation: an id, its annotations and what the MachineSet adds."""

    id: str
    annotations: Mapping[str, str]
    source: SourceRef
    replicas: Optional[int] = None  # None: not set (v1beta2 defaulting pending, or the file omits it)
    template_taints: tuple[Mapping[str, str], ...] = ()


class _Fields:
    """Reads typed values out of an annotation map, collecting every error instead of stopping at the first."""

    def __init__(self, item: GroupInput) -> None:
        self.item = item
        self.errors: list[GroupConfigError] = []

    def error(self, key: str, message: str, reason: str = MALFORMED) -> None:
        self.errors.append(GroupConfigError(self.item.source, self.item.id, key, message, reason))

    def raw(self, key: str) -> Optional[str]:
        value = self.item.annotations.get(key)
        return None if value is None else str(value).strip()

    def get(self, key: str, convert: Callable[[str], T], default: T, expected: str) -> T:
        value = self.raw(key)
        if value is None or value == "":
            return default
        try:
            return convert(value)
        except (ValueError, QuantityError) as exc:
            if isinstance(exc, (OutOfRange, NotAName)):
                detail = str(exc)
            elif isinstance(exc, QuantityError) and value not in str(exc):
                detail = str(exc)
            else:
                detail = ""
            self.error(key, f"{_shown(value)} is not {expected}" + (f" ({detail})" if detail else ""))
            return default

    def required(self, key: str, convert: Callable[[str], T], expected: str) -> Optional[T]:
        if not self.raw(key):
            self.error(key, f"missing; set it to {expected}")
            return None
        return self.get(key, convert, None, expected)  # type: ignore[arg-type]


class OutOfRange(ValueError):
    """A value of the right kind beyond what Kubernetes or cluster-autoscaler can hold; the message says the bound."""


class NotAName(ValueError):
    """A label, taint or resource name Kubernetes would refuse; the message says which part and why."""


INT32_MAX = 2**31 - 1  # CA's NodeGroup sizes are int32 on the wire
INT64_MAX = 2**63 - 1  # the largest Kubernetes quantity
GO_DURATION_MAX_SECONDS = INT64_MAX / 1e9  # a Go time.Duration: about 292 years


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("negative")
    if number > INT32_MAX:
        raise OutOfRange(f"larger than {INT32_MAX}")
    return number


def _shown(value: str, limit: int = 80) -> str:
    """A value quoted for a message, cut short: an annotation can hold a megabyte."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError(value)
    return lowered == "true"


def _fraction(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(value)
    return number


def _quantity(convert: Callable[[str], int]) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = convert(value)
        except QuantityTooLarge:
            number = INT64_MAX + 1
        if number < 0:
            raise ValueError(value)
        if number > INT64_MAX:
            raise OutOfRange(f"larger than the largest Kubernetes quantity, {INT64_MAX}")
        return number
    return parse


def _positive_quantity(convert: Callable[[str], int]) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = _quantity(convert)(value)
        if number <= 0:
            raise ValueError(value)
        return number
    return parse


# Kubernetes' rules for names in labels, taints and resources (apimachinery validation).
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _check_qualified_name(text: str, what: str, prefix_required: bool = False) -> str:
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise NotAName(f"{what} {_shown(text)}: the prefix before '/' must be a DNS subdomain such as example.com")
    if prefix_required and not slash:
        raise NotAName(f"{what} {_shown(text)} needs a domain prefix, as in nvidia.com/gpu")
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        raise NotAName(f"{what} {_shown(text)}: the name must be 1-63 characters of [A-Za-z0-9-_.], "
                       "starting and ending with a letter or digit")
    return text


def _check_label_value(text: str, what: str) -> str:
    if text and (len(text) > 63 or not _NAME_PART.match(text)):
        raise NotAName(f"{what} {_shown(text)} is not a label value: at most 63 characters of [A-Za-z0-9-_.], "
                       "starting and ending with a letter or digit")
    return text


def _resource_name(value: str) -> str:
    return _check_qualified_name(value, "resource", prefix_required=True)


def _labels(value: str) -> dict[str, str]:
    labels = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        key, sep, label_value = entry.partition("=")
        if not sep or not key:
            raise ValueError(f"label {entry!r} is not key=value")
        labels[_check_qualified_name(key, "label key")] = _check_label_value(label_value, f"value of label {_shown(key)}")
    return labels


def _taint(entry: str) -> Taint:
    key_value, sep, effect = entry.rpartition(":")
    if not sep or effect not in TAINT_EFFECTS:
        raise ValueError(f"taint {entry!r} is not key=value:Effect with Effect one of {', '.join(TAINT_EFFECTS)}")
    key, _, value = key_value.partition("=")
    if not key:
        raise ValueError(f"taint {entry!r} has no key")
    return Taint(key=_check_qualified_name(key, "taint key"), value=_check_label_value(value, f"value of taint {_shown(key)}"),
                 effect=effect)


def _taints(value: str) -> tuple[Taint, ...]:
    return tuple(_taint(entry) for entry in filter(None, (part.strip() for part in value.split(","))))


def _models(value: str) -> tuple[str, ...]:
    # A model becomes the value of the GPU label on nodes and templates, which pods select on.
    return tuple(_check_label_value(model, "GPU model")
                 for model in filter(None, (part.strip() for part in value.split(","))))


def _duration(value: str) -> float:
    seconds = parse_duration(value)
    if seconds > GO_DURATION_MAX_SECONDS:
        raise OutOfRange("longer than a Go time.Duration holds (about 292 years)")
    return seconds


def _template_mode(value: str) -> TemplateMode:
    return TemplateMode(value)


def _gpu_api(value: str) -> GpuApi:
    return GpuApi(value)


def _parse_gpu_api(f: "_Fields", initial_gpus: int) -> tuple[GpuApi, Optional[str]]:
    """The group's GPU API and, for an extended-resource group, its GPU resource (None: a DRA group has none; the
    model gives it the planner's DRA resource). The keys that contradict the API are errors, naming the fix."""
    api = f.get(g.ANN_GPU_API, _gpu_api, GpuApi.EXTENDED_RESOURCE,
                "a GPU API (" + ", ".join(a.value for a in GpuApi) + ")")
    if not api.dra:
        resource_key = g.ANN_GPU_RESOURCE if f.raw(g.ANN_GPU_RESOURCE) else CAP_GPU_TYPE
        return api, f.get(resource_key, _resource_name, g.DEFAULT_GPU_RESOURCE,
                          "an extended resource name such as nvidia.com/gpu")
    # gpu-type is CA's Cluster API annotation and may be there for other tools: only our own key is refused.
    if f.raw(g.ANN_GPU_RESOURCE):
        f.error(g.ANN_GPU_RESOURCE, f"a {api.value} group has no GPU resource: its GPUs are ResourceSlice devices, "
                                    f"never node capacity; remove it or set {g.ANN_GPU_API} to "
                                    f"{GpuApi.EXTENDED_RESOURCE.value}")
    if api is GpuApi.DRA_POOL and initial_gpus:
        f.error(CAP_GPU_COUNT, f"a {api.value} group's nodes boot with no GPU: its GPUs are pool slots kube-scheduler "
                               f"allocates and DDS attaches then (a boot GPU would be neither a slot nor node "
                               f"capacity); set it to 0")
    return api, None


_DRA_KEYS = (g.ANN_DRA_DRIVER, g.ANN_DRA_DEVICE_CLASS, g.ANN_DRA_MODEL_ATTRIBUTE, g.ANN_DRA_MEMORY_CAPACITY,
             g.ANN_DRA_DEVICE_ID_ATTRIBUTE, g.ANN_DRA_MODELS, g.ANN_DRA_DEVICE_ATTRIBUTES)
# What only a vendor's driver needs said: DDS's own driver publishes one shape (dds/planner/dra.py `gpu_device`).
_VENDOR_ONLY_KEYS = _DRA_KEYS[2:]
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def _dra_driver(value: str) -> str:
    # resource.k8s.io/v1: a driver name is a DNS subdomain of at most 63 characters, lowercase.
    if len(value) > 63 or not _DNS_SUBDOMAIN.match(value):
        raise NotAName(f"DRA driver {_shown(value)} must be a DNS subdomain of at most 63 characters such as "
                       f"gpu.nvidia.com")
    return value


def _device_class(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise NotAName(f"DeviceClass name {_shown(value)} must be a DNS subdomain such as gpu.nvidia.com")
    return value


def _device_attribute(value: str) -> str:
    # A device attribute or capacity name: a C identifier of at most 32 characters, optionally "<domain>/" first.
    domain, slash, name = value.rpartition("/")
    if (slash and not _DNS_SUBDOMAIN.match(domain)) or not _C_IDENTIFIER.match(name):
        raise NotAName(f"device attribute {_shown(value)} must be a C identifier of at most 32 characters, "
                       f"optionally after a domain and '/', such as productName")
    return value


def _dra_models(value: str) -> dict[str, g.DraModelDescription]:
    """`A100=NVIDIA A100-SXM4-80GB:80Gi,A30=NVIDIA A30:24Gi`: per fabric model, the value of the model attribute and
    (after the last ':', optional) the memory capacity."""
    out = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        model, sep, shown = (part.strip() for part in entry.partition("="))
        if not sep or not model or not shown:
            raise ValueError(f"entry {entry!r} is not MODEL=VALUE or MODEL=VALUE:MEMORY")
        name, colon, memory = shown.rpartition(":")
        if not colon:
            name, memory = shown, ""
        try:
            size = to_int(memory.strip()) if memory.strip() else None
        except QuantityError:
            raise ValueError(f"entry {entry!r}: memory {memory.strip()!r} is not a quantity such as 80Gi") from None
        if not name.strip():
            raise ValueError(f"entry {entry!r} has no value before the memory")
        out[_check_label_value(model, "GPU model")] = g.DraModelDescription(value=name.strip(), memory=size)
    return out


def _device_attributes(value: str) -> dict[str, str]:
    out = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        name, sep, shown = (part.strip() for part in entry.partition("="))
        if not sep or not name:
            raise ValueError(f"entry {entry!r} is not NAME=VALUE")
        out[_device_attribute(name)] = shown
    return out


def _parse_dra_driver(f: "_Fields", api: GpuApi) -> Optional[g.DraDriverConfig]:
    """A DRA group's driver and device shape (None: the default, DDS's own driver). The dra-* keys are errors on an
    extended-resource group, and the shape keys on a group of DDS's own driver, naming the fix."""
    given = [key for key in _DRA_KEYS if f.raw(key)]
    if not given:
        return None
    if not api.dra:
        for key in given:
            f.error(key, f"an {api.value} group's GPUs are node capacity, not DRA devices; remove it or set "
                         f"{g.ANN_GPU_API} to dra-node-local")
        return None
    driver = f.get(g.ANN_DRA_DRIVER, _dra_driver, g.DDS_DRA_DRIVER, "a DRA driver name")
    if driver == g.DDS_DRA_DRIVER:
        for key in (k for k in _VENDOR_ONLY_KEYS if k in given):
            f.error(key, f"DDS publishes the devices of its own driver {g.DDS_DRA_DRIVER} in one shape (attributes "
                         f"model, productName, deviceID; capacity memory); set {g.ANN_DRA_DRIVER} to the vendor's "
                         f"driver (e.g. gpu.nvidia.com) whose devices this describes")
    elif api is GpuApi.DRA_POOL:
        f.error(g.ANN_DRA_DRIVER, f"a {api.value} group's GPUs are slots DDS publishes under its own driver "
                                  f"{g.DDS_DRA_DRIVER}; a vendor's driver ({driver}) needs {g.ANN_GPU_API}: "
                                  f"dra-node-local")
    attribute = "a device attribute name such as productName"
    return g.DraDriverConfig(
        driver=driver,
        device_class=f.get(g.ANN_DRA_DEVICE_CLASS, _device_class, "", "a DeviceClass name"),
        model_attribute=f.get(g.ANN_DRA_MODEL_ATTRIBUTE, _device_attribute, "", attribute),
        memory_capacity=f.get(g.ANN_DRA_MEMORY_CAPACITY, _device_attribute, "memory", "a device capacity name"),
        device_id_attribute=f.get(g.ANN_DRA_DEVICE_ID_ATTRIBUTE, _device_attribute, "", attribute),
        models=f.get(g.ANN_DRA_MODELS, _dra_models, {}, "a list of MODEL=VALUE[:MEMORY] separated by commas"),
        device_attributes=f.get(g.ANN_DRA_DEVICE_ATTRIBUTES, _device_attributes, {},
                                "a list of NAME=VALUE separated by commas"))


def _parse_cxl_memory(f: "_Fields") -> tuple[int, int]:
    """The group's CXL memory: (maximum per node, chunk size) in bytes; (0, 0) when it takes none. The two keys go
    together and the maximum is a whole number of chunks; each mistake is an error naming the fix."""
    maximum = f.get(g.ANN_MAX_CXL_MEMORY, _quantity(to_int), 0, "a memory quantity such as 256Gi")
    chunk = f.get(g.ANN_CXL_MEMORY_CHUNK, _positive_quantity(to_int), 0, "a positive memory quantity such as 16Gi")
    if f.raw(g.ANN_CXL_MEMORY_CHUNK) and not f.raw(g.ANN_MAX_CXL_MEMORY):
        f.error(g.ANN_CXL_MEMORY_CHUNK, f"a chunk size attaches nothing without {g.ANN_MAX_CXL_MEMORY}; set the "
                                        f"maximum CXL memory a node may hold, or remove it")
        return 0, 0
    if not maximum:
        return 0, 0
    if not f.raw(g.ANN_CXL_MEMORY_CHUNK):
        f.error(g.ANN_CXL_MEMORY_CHUNK, f"missing; {g.ANN_MAX_CXL_MEMORY} needs the size memory is attached in, "
                                        f"a memory quantity such as 16Gi")
        return 0, 0
    if chunk and maximum % chunk:
        f.error(g.ANN_MAX_CXL_MEMORY, f"{_shown(f.raw(g.ANN_MAX_CXL_MEMORY) or '')} is not a whole number of "
                                      f"{_shown(f.raw(g.ANN_CXL_MEMORY_CHUNK) or '')} chunks "
                                      f"({g.ANN_CXL_MEMORY_CHUNK}); make it a multiple of the chunk size")
        return 0, 0
    return maximum, chunk


def unknown_key_message(key: str) -> Optional[str]:
    """Why `key` is refused, with the nearest known key as a hint; None for a key DDS knows or does not own."""
    for prefix, known in ((g.ANNOTATION_PREFIX, KNOWN_DDS_KEYS), (g.ANN_OPTIONS_PREFIX, KNOWN_OPTION_KEYS)):
        if key.startswith(prefix):
            if key in known:
                return None
            # Compared without the prefix: every key shares it, which would make any two keys look alike.
            names = sorted(k[len(prefix):] for k in known)
            nearest = difflib.get_close_matches(key[len(prefix):], names, n=1, cutoff=0.6)
            hint = f"did you mean {prefix}{nearest[0]}?" if nearest else \
                "docs/configuration.md lists the keys DDS reads"
            return f"unknown key, not served on a guess ({hint})"
    return None


def _check_unknown_keys(f: "_Fields") -> None:
    for key in sorted(f.item.annotations):
        message = unknown_key_message(str(key))
        if message is not None:
            shown = str(key) if len(str(key)) <= 120 else f"{str(key)[:120]}..."  # a YAML file's key is unbounded
            f.error(shown, message, UNKNOWN_KEY)


def _merge_taints(from_spec: Sequence[Mapping[str, str]], from_annotation: Sequence[Taint],
                  fields: _Fields) -> tuple[Taint, ...]:
    """spec.template.spec.taints first, an annotation taint replaces one with the same key and effect (CA's rule)."""
    merged: list[Taint] = []
    for raw in from_spec:
        try:
            merged.append(Taint(key=str(raw.get("key", "")), value=str(raw.get("value", "") or ""),
                                effect=str(raw.get("effect", ""))))
        except ValidationError as exc:
            fields.error("spec.template.spec.taints", f"unreadable taint {dict(raw)}: {exc.errors()[0]['msg']}")
    for taint in from_annotation:
        merged = [t for t in merged if (t.key, t.effect) != (taint.key, taint.effect)] + [taint]
    return tuple(merged)


def parse_group(item: GroupInput) -> tuple[Optional[NodeGroupSpec], tuple[GroupConfigError, ...]]:
    """Validate one definition: the spec, or None and every error found (each naming the key at fault)."""
    f = _Fields(item)
    if not item.id.strip():
        f.error("id", "missing")
    elif "#" in item.id:
        # `<id>#live` names a spec-fixed group's live nodes to cluster-autoscaler (dds/provider/membership.py).
        f.error("id", "must not contain '#': DDS reserves it for the node group `<id>#live` of a spec-fixed "
                      "group's live nodes")
    _check_unknown_keys(f)
    max_size = f.required(g.ANN_CAPI_MAX, _count, "a whole number >= 0")
    min_size = f.get(g.ANN_CAPI_MIN, _count, 0, "a whole number >= 0")
    milli_cpu = f.required(CAP_CPU, _positive_quantity(to_milli), "a positive CPU quantity such as 16 or 15500m")
    memory = f.required(CAP_MEMORY, _positive_quantity(to_int), "a positive memory quantity such as 64Gi")
    ephemeral = f.get(CAP_EPHEMERAL_DISK, _quantity(to_int), 100 * 2**30, "a storage quantity such as 100Gi")
    max_pods = f.get(CAP_MAX_PODS, _positive_quantity(_count), 110, "a whole number > 0")
    initial_gpus = f.get(CAP_GPU_COUNT, _count, 0, "a whole number >= 0")
    max_gpus = f.get(g.ANN_MAX_GPUS, _count, initial_gpus, "a whole number >= 0")
    gpu_api, gpu_resource = _parse_gpu_api(f, initial_gpus)
    dra = _parse_dra_driver(f, gpu_api)
    max_cxl_memory, cxl_memory_chunk = _parse_cxl_memory(f)
    labels = f.get(CAP_LABELS, _labels, {}, "a list of key=value separated by commas")
    annotation_taints = f.get(CAP_TAINTS, _taints, (), "a list of key=value:Effect separated by commas")
    taints = _merge_taints(item.template_taints, annotation_taints, f)
    mode = f.get(g.ANN_TEMPLATE_MODE, _template_mode, TemplateMode.SPEC_FIXED,
                 "a template mode (" + ", ".join(m.value for m in TemplateMode) + ")")
    options = OptionOverrides(
        scale_down_utilization_threshold=f.get(OPT_SCALE_DOWN_UTILIZATION, _fraction, None, "a number in 0..1"),
        scale_down_gpu_utilization_threshold=f.get(OPT_SCALE_DOWN_GPU_UTILIZATION, _fraction, None, "a number in 0..1"),
        scale_down_unneeded_seconds=f.get(OPT_SCALE_DOWN_UNNEEDED, _duration, None, "a duration such as 10m0s"),
        scale_down_unready_seconds=f.get(OPT_SCALE_DOWN_UNREADY, _duration, None, "a duration such as 20m0s"),
        max_node_provision_seconds=f.get(OPT_MAX_NODE_PROVISION, _duration, None, "a duration such as 15m0s"),
        zero_or_max_node_scaling=f.get(OPT_ZERO_OR_MAX, _bool, None, "true or false"),
        ignore_daemonsets_utilization=f.get(OPT_IGNORE_DAEMONSETS, _bool, None, "true or false"))
    if max_size is not None and min_size > max_size:
        f.error(g.ANN_CAPI_MIN, f"min size {min_size} is above max size {max_size}")
    if initial_gpus > max_gpus:
        f.error(g.ANN_MAX_GPUS, f"max GPUs per node {max_gpus} is below the GPUs a new node boots with "
                                f"({CAP_GPU_COUNT} = {initial_gpus})")
    if f.errors or max_size is None or milli_cpu is None or memory is None:
        return None, tuple(f.errors)
    replicas = item.replicas if item.replicas is not None else min_size
    resource = {"gpu_resource": gpu_resource} if gpu_resource is not None else {}
    if dra is not None:
        resource["dra"] = dra
    try:
        spec = NodeGroupSpec(
            id=item.id, min_size=min_size, max_size=max_size, replicas=replicas, milli_cpu=milli_cpu, memory=memory,
            ephemeral_storage=ephemeral, max_pods=max_pods, labels=labels, taints=taints, gpu_api=gpu_api, **resource,
            gpu_models=f.get(g.ANN_GPU_MODELS, _models, (), "a list of GPU models separated by commas"),
            initial_gpus=initial_gpus, max_gpus_per_node=max_gpus,
            fabric_pool=f.raw(g.ANN_FABRIC_POOL) or "default", template_mode=mode,
            gpu_idle_cooldown_seconds=f.get(g.ANN_GPU_IDLE_COOLDOWN, _duration, g.DEFAULT_GPU_IDLE_COOLDOWN_SECONDS,
                                            "a duration such as 10m"),
            node_idle_cooldown_seconds=f.get(g.ANN_NODE_IDLE_COOLDOWN, _duration, 600.0, "a duration such as 10m"),
            force_detach=f.get(g.ANN_FORCE_DETACH, _bool, False, "true or false"),
            warm_gpus=f.get(g.ANN_WARM_GPUS, _count, None, "a whole number >= 0"),
            max_cxl_memory=max_cxl_memory, cxl_memory_chunk=cxl_memory_chunk,
            options=options, source=item.source)
    except ValidationError as exc:
        for problem in exc.errors():
            where = ".".join(str(part) for part in problem["loc"]) or "definition"
            f.error(where, problem["msg"])
        return None, tuple(f.errors)
    if f.errors:
        return None, tuple(f.errors)
    return spec, ()
