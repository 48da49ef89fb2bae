"""Dynamic Resource Allocation (resource.k8s.io/v1) as the planner reads it: plain frozen records, decoded at the edge
(dds/kube/decode.py) and carried in the Snapshot. Field names follow the API; only what a fit decision needs is kept.

Attribute and capacity names are kept fully qualified ("gpu.dds.cdi.dev/model"): a name without a domain in the API
belongs to the driver's domain, and the decoder adds it, so the CEL environment can group them by domain as
kube-scheduler does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Union

ALL = "All"
EXACT_COUNT = "ExactCount"

# An attribute value: int, bool, string, or a semantic version (kept as its string).
AttributeValue = Union[int, bool, str]


def _empty() -> Mapping[str, AttributeValue]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DeviceTaintInfo:
    """One `devices[].taints[]` entry (or `tolerations[]` of a request, where `operator` applies)."""

    key: str
    value: str = ""
    effect: str = ""
    operator: str = ""  # tolerations only: Equal (default) | Exists


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a ResourceSlice. `capacity` is in base units (bytes for memory), parsed from the Quantity."""

    name: str
    driver: str
    pool: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=_empty)
    capacity: Mapping[str, int] = field(default_factory=_empty)  # type: ignore[assignment]
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    # Consumable capacity (KEP-5075): the device may be shared by several allocations, each taking part of a capacity.
    allow_multiple_allocations: bool = False
    # Partitionable devices (KEP-4815): the counter sets (spec.sharedCounters of the slice) this device draws from.
    consumes_counters: tuple[str, ...] = ()
    # Device taints (KEP-5055): the taints the driver published on the device.
    taints: tuple[DeviceTaintInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ResourceSliceInfo:
    name: str
    driver: str
    pool: str
    pool_generation: int = 0
    node_name: Optional[str] = None
    devices: tuple[DraDevice, ...] = ()
    shared_counters: tuple[str, ...] = ()  # names of spec.sharedCounters[] (partitionable devices)


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    name: str
    selectors: tuple[str, ...] = ()  # CEL expressions
    # spec.extendedResourceName (KEP-5004): pods asking for this extended resource are served by the class's devices
    # on nodes that do not have the resource in their allocatable.
    extended_resource_name: Optional[str] = None
    created_at: float = 0.0  # of two classes naming one extended resource, kube-scheduler takes the later


@dataclass(frozen=True, slots=True)
class DeviceRequestInfo:
    """One `spec.devices.requests[]` entry. Only `exactly` is planned; `first_available` is kept to be reported."""

    name: str
    device_class: str = ""
    selectors: tuple[str, ...] = ()  # CEL expressions
    allocation_mode: str = EXACT_COUNT
    count: int = 1
    first_available: bool = False  # a prioritized list (spec.devices.requests[].firstAvailable): not planned
    admin_access: bool = False  # exactly.adminAccess: access to devices already in use (monitoring): not planned
    tolerations: tuple[DeviceTaintInfo, ...] = ()  # exactly.tolerations: which device taints the request accepts
    # exactly.capacity.requests: capacity name (as written: unqualified names belong to the device's driver) -> the
    # amount in base units; a device serves the request only with at least that much of each.
    capacity: Mapping[str, int] = field(default_factory=_empty)  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class AllocatedDeviceInfo:
    """One `status.allocation.devices.results[]` entry."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class ResourceClaimInfo:
    namespace: str
    name: str
    requests: tuple[DeviceRequestInfo, ...] = ()
    allocated: Optional[tuple[AllocatedDeviceInfo, ...]] = None  # None = not allocated
    reserved_for: tuple[str, ...] = ()  # names of the pods (same namespace) the claim is reserved for
    constraints: int = 0  # spec.devices.constraints entries (matchAttribute): not planned
    uid: str = ""
    # The node an allocation is tied to (status.allocation.nodeSelector: metadata.name In [node]), if any.
    allocated_node: Optional[str] = None
    # status.devices[]: per allocated device name, the condition types that are True (binding conditions).
    true_conditions: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # Fabric devices DDS attached for this claim in pool mode (its annotation dds.cdi.dev/fabric-devices).
    fabric_devices: tuple[str, ...] = ()
    allocated_at: str = ""  # status.allocation.allocationTimestamp: tells one allocation of a claim from the next

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplateInfo:
    namespace: str
    name: str
    requests: tuple[DeviceRequestInfo, ...] = ()
    constraints: int = 0


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One `spec.resourceClaims[]` entry of a pod, with the claim generated for a template
    (`status.resourceClaimStatuses`) once the resourceclaim controller has created it."""

    name: str
    claim_name: Optional[str] = None  # spec: resourceClaimName
    template_name: Optional[str] = None  # spec: resourceClaimTemplateName
    generated_name: Optional[str] = None  # status: the claim made from the template
    # The claim kube-scheduler made for the pod's extended resources served by DRA (KEP-5004;
    # status.extendedResourceClaimStatus): the resources it covers, which the pod's containers still list.
    extended_resources: tuple[str, ...] = ()

    @property
    def resolved_name(self) -> Optional[str]:
        return self.claim_name or self.generated_name


@dataclass(frozen=True, slots=True)
class DraState:
    """Every DRA object DDS plans with, as the watch cache saw them at one instant."""

    claims: tuple[ResourceClaimInfo, ...] = ()
    templates: tuple[ResourceClaimTemplateInfo, ...] = ()
    slices: tuple[ResourceSliceInfo, ...] = ()
    classes: tuple[DeviceClassInfo, ...] = ()
