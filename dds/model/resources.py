"""Resource vectors: the unit of every fit check."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

from dds.model.quantity import QuantityTooLarge, format_milli, to_int, to_milli

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
STANDARD = (CPU, MEMORY, EPHEMERAL_STORAGE, PODS)


def _frozen(mapping: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType({k: v for k, v in sorted((mapping or {}).items()) if v})


@dataclass(frozen=True, slots=True)
class Resources:
    """cpu in millicores, memory and ephemeral storage in bytes, pods as a count, extended resources as counts."""

    milli_cpu: int = 0
    memory: int = 0
    ephemeral_storage: int = 0
    pods: int = 0
    scalar: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.scalar, MappingProxyType):
            object.__setattr__(self, "scalar", _frozen(self.scalar))

    @classmethod
    def parse(cls, values: Mapping[str, str | int | float] | None) -> "Resources":
        """From a Kubernetes resource list (`{"cpu": "500m", "nvidia.com/gpu": "1"}`)."""
        values = values or {}
        scalar = {k: to_int(v) for k, v in values.items() if k not in STANDARD}
        return cls(
            milli_cpu=to_milli(values[CPU]) if CPU in values else 0,
            memory=to_int(values[MEMORY]) if MEMORY in values else 0,
            ephemeral_storage=to_int(values[EPHEMERAL_STORAGE]) if EPHEMERAL_STORAGE in values else 0,
            pods=to_int(values[PODS]) if PODS in values else 0,
            scalar=scalar,
        )

    def get(self, name: str) -> int:
        if name == CPU:
            return self.milli_cpu
        if name == MEMORY:
            return self.memory
        if name == EPHEMERAL_STORAGE:
            return self.ephemeral_storage
        if name == PODS:
            return self.pods
        return self.scalar.get(name, 0)

    def names(self) -> tuple[str, ...]:
        return STANDARD + tuple(self.scalar)

    def __add__(self, other: "Resources") -> "Resources":
        scalar = dict(self.scalar)
        for k, v in other.scalar.items():
            scalar[k] = scalar.get(k, 0) + v
        return Resources(self.milli_cpu + other.milli_cpu, self.memory + other.memory,
                         self.ephemeral_storage + other.ephemeral_storage, self.pods + other.pods, scalar)

    def __sub__(self, other: "Resources") -> "Resources":
        scalar = dict(self.scalar)
        for k, v in other.scalar.items():
            scalar[k] = scalar.get(k, 0) - v
        return Resources(self.milli_cpu - other.milli_cpu, self.memory - other.memory,
                         self.ephemeral_storage - other.ephemeral_storage, self.pods - other.pods, scalar)

    def max(self, other: "Resources") -> "Resources":
        """Element-wise maximum (how kube-scheduler combines init containers with the app containers)."""
        keys = set(self.scalar) | set(other.scalar)
        return Resources(max(self.milli_cpu, other.milli_cpu), max(self.memory, other.memory),
                         max(self.ephemeral_storage, other.ephemeral_storage), max(self.pods, other.pods),
                         {k: max(self.scalar.get(k, 0), other.scalar.get(k, 0)) for k in keys})

    def with_scalar(self, name: str, value: int) -> "Resources":
        scalar = dict(self.scalar)
        scalar[name] = value
        return Resources(self.milli_cpu, self.memory, self.ephemeral_storage, self.pods, scalar)

    def to_kubernetes(self) -> dict[str, str]:
        """As a Kubernetes resource list of canonical strings."""
        out = {CPU: format_milli(self.milli_cpu), MEMORY: str(self.memory),
               EPHEMERAL_STORAGE: str(self.ephemeral_storage), PODS: str(self.pods)}
        out.update({k: str(v) for k, v in self.scalar.items()})
        return out


INT64_MAX = 2**63 - 1  # the planner counts resources in signed 64-bit arrays (numpy int64)


def over_int64(parts: Iterable[Resources]) -> Optional[str]:
    """The first resource whose amounts summed over `parts` (a pod's containers, init containers and overhead) exceed
    a signed 64-bit count, else None. A tenant can write quantities that large; the planner cannot hold them."""
    totals: dict[str, int] = {}
    for part in parts:
        for name, amount in ((CPU, part.milli_cpu), (MEMORY, part.memory), (EPHEMERAL_STORAGE, part.ephemeral_storage),
                             (PODS, part.pods), *part.scalar.items()):
            totals[name] = totals.get(name, 0) + abs(amount)
            if totals[name] > INT64_MAX:
                return name
    return None


def check_pod_totals(parts: Iterable[Resources]) -> None:
    """Raises QuantityTooLarge when a pod asks for more of a resource in all (`parts`: its containers', init
    containers' and overhead's requests) than the planner can count: the decoders refuse such a pod."""
    name = over_int64(parts)
    if name is not None:
        raise QuantityTooLarge(f"the pod asks for more {name} in all than {INT64_MAX}")
