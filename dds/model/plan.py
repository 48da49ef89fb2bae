"""The planner's output: what to do and why. Events, logs, metrics and `dds plan` are all rendered from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Optional

from dds.model.cxl import cxl_model, is_cxl_model
from dds.model.quantity import human_amount


class Verdict(str, Enum):
    FITS_NOW = "fits-now"  # schedulable on an existing node without any action
    FITS_AFTER_GPUS = "fits-after-gpus"  # fits once the planned GPUs are attached
    FITS_AFTER_MEMORY = "fits-after-memory"  # fits once the planned CXL memory (and GPUs, if any) are attached
    NEEDS_NODE = "needs-node"  # fits only on a new node of some group
    UNSCHEDULABLE = "unschedulable"  # fits nowhere, not even on a new node at max GPUs
    UNSUPPORTED = "unsupported"  # has a constraint the simulation does not model: never promised a fit


class Case(str, Enum):
    """Why an action was taken: the talk's four cases, and what DDS does of its own beyond them (metric label `case`)."""

    SCALE_UP = "case1-scale-up"  # CA asked for a node
    # Case 2 (CA wanted a node but could not: max, backoff) and more: DDS's loop attaches for a pending pod that fits
    # on a live node once GPUs are attached, without waiting for CA, whether CA could add a node or not.
    FAST_PATH = "fast-path-attach"
    WARM_HEADROOM = "warm-headroom"  # idle GPUs attached ahead of demand, up to a group's warm-gpus
    REPAIR = "repair-failed-gpu"  # a GPU that failed while attached is detached, and replaced for the pods that had it
    ORPHAN_RECLAIM = "orphan-reclaim"  # devices held for a node that is gone, or by an attach that never ended
    GANG_ROLLBACK = "gang-rollback"  # GPUs attached for a gang that cannot start, released
    RESERVATION = "reservation"  # a node reserved for a large pod that waited too long, and GPUs gathered on it
    PROVISIONING = "provisioning-request"  # capacity gathered and booked for a ProvisioningRequest of DDS's class
    SCALE_DOWN = "case3-scale-down"  # CA asked to remove a node
    SCALE_DOWN_BLOCKED = "case4-scale-down-blocked"  # CA wanted to remove but could not / DDS-owned scale-down


DEVICE_GPU = "gpu"
DEVICE_CXL_MEMORY = "cxl-memory"


def device_kind(model: str) -> str:
    """What a device of `model` is: DEVICE_CXL_MEMORY for a chunk (`cxl-memory-<size>`), DEVICE_GPU otherwise."""
    return DEVICE_CXL_MEMORY if is_cxl_model(model) else DEVICE_GPU


@dataclass(frozen=True, slots=True)
class Reject:
    """Why one option (a node, a group) was not taken for a pod: the filter and the numbers behind it."""

    target: str  # node name or "group:<id>"
    reason: str  # short code: "Insufficient memory", "node(s) had untolerated taint", "gpu-slots-full", ...
    resource: Optional[str] = None
    requested: Optional[int] = None
    free: Optional[int] = None
    capacity: Optional[int] = None

    def message(self) -> str:
        if self.resource is None:
            return f"{self.target}: {self.reason}"
        def amount(value: Optional[int]) -> str:
            return "?" if value is None else human_amount(self.resource or "", value)

        capacity = "" if self.capacity is None else f", capacity {amount(self.capacity)}"
        return (f"{self.target}: {self.reason} ({self.resource}: requested {amount(self.requested)}, "
                f"free {amount(self.free)}{capacity})")


@dataclass(frozen=True, slots=True)
class PodDecision:
    pod: str  # namespace/name
    verdict: Verdict
    node: Optional[str] = None  # chosen existing node (FITS_NOW / FITS_AFTER_GPUS)
    group: Optional[str] = None  # chosen group (NEEDS_NODE)
    gpus_added: int = 0  # GPUs this pod's placement adds to `node`
    memory_added: int = 0  # bytes of CXL memory this pod's placement adds to `node`
    score: Optional[float] = None
    reason: str = ""  # human sentence: "fits on worker-1 after 1 GPU (best-fit score 0.92)"
    rejected: tuple[Reject, ...] = ()
    # Why DDS cannot help this pod at all, as an Event reason (dds/planner/refusals.py); None when it can, or when the
    # pod waits for something else (a new node is CA's to ask for).
    refusal: Optional[str] = None


@dataclass(frozen=True, slots=True)
class Attach:
    node: str
    pool: str
    model: str
    count: int
    pods: tuple[str, ...]  # the pods it is for
    reason: str
    score: Optional[float] = None


@dataclass(frozen=True, slots=True)
class MemoryAttach:
    """CXL memory attached to a live node: `chunks` chunks of `chunk_bytes` each from `pool`'s memory devices."""

    node: str
    pool: str
    chunks: int
    chunk_bytes: int
    pods: tuple[str, ...]
    reason: str

    @property
    def bytes(self) -> int:
        return self.chunks * self.chunk_bytes


@dataclass(frozen=True, slots=True)
class NewNodes:
    group: str
    count: int
    pods: tuple[str, ...]
    reason: str
    gpus_per_node: tuple[int, ...] = ()  # GPUs to attach to each new node once it is up (beyond initial_gpus)


@dataclass(frozen=True, slots=True)
class ScaleUpPlan:
    attaches: tuple[Attach, ...] = ()
    new_nodes: tuple[NewNodes, ...] = ()
    decisions: tuple[PodDecision, ...] = ()
    policy: str = ""
    solver: str = "greedy"  # "greedy" | "milp" — which produced the plan
    notes: tuple[str, ...] = ()
    memory_attaches: tuple[MemoryAttach, ...] = ()

    @property
    def gpus(self) -> int:
        return sum(a.count for a in self.attaches)

    @property
    def cxl_memory(self) -> int:
        """Bytes of CXL memory the plan attaches."""
        return sum(m.bytes for m in self.memory_attaches)

    @property
    def device_attaches(self) -> tuple[Attach, ...]:
        """Every attach the fabric carries out: the GPUs, then the CXL memory as chunks of a model naming their size
        (dds/model/cxl.py), which the fabric attaches like any device."""
        return self.attaches + tuple(
            Attach(node=m.node, pool=m.pool, model=cxl_model(m.chunk_bytes), count=m.chunks, pods=m.pods,
                   reason=m.reason) for m in self.memory_attaches)

    @property
    def nodes(self) -> int:
        return sum(n.count for n in self.new_nodes)

    @property
    def is_empty(self) -> bool:
        return not self.attaches and not self.new_nodes and not self.memory_attaches


@dataclass(frozen=True, slots=True)
class Detach:
    node: str
    device_ids: tuple[str, ...]
    reason: str
    force: bool = False
    kind: str = "gpu"  # what the devices are: DEVICE_GPU or DEVICE_CXL_MEMORY (chunks of CXL memory)


def by_device_kind(step: Detach, models: Mapping[str, str]) -> tuple[Detach, ...]:
    """`step` as one detach per kind of device it names (GPUs, CXL memory chunks; `models`: device id -> model), each
    with its `kind`, so its Events and counters say which devices go. An id `models` does not know stays with the
    step's own kind."""
    ids: dict[str, list[str]] = {}
    for device_id in step.device_ids:
        model = models.get(device_id)
        ids.setdefault(step.kind if model is None else device_kind(model), []).append(device_id)
    return tuple(Detach(step.node, tuple(group), step.reason, step.force, kind) for kind, group in ids.items())
@dataclass(frozen=True, slots=True)
class RemoveNode:
    node: str
    group: str
    reason: str


@dataclass(frozen=True, slots=True)
class Keep:
    """A node asked about (by CA or by the idle scan) that stays, and why."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class IdlePastCooldown:
    """A node's idle GPUs past its group's GPU cooldown that the plan does not keep as warm headroom: the ones it
    detaches for their idleness (metric dds_gpus_idle_past_cooldown). Nodes being removed or deleted are not counted:
    their GPUs go with the node, cooldown or not."""

    node: str
    group: str
    count: int


@dataclass(frozen=True, slots=True)
class ScaleDownPlan:
    detaches: tuple[Detach, ...] = ()
    removals: tuple[RemoveNode, ...] = ()
    kept: tuple[Keep, ...] = ()
    notes: tuple[str, ...] = ()
    idle_past_cooldown: tuple[IdlePastCooldown, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.detaches and not self.removals


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of a planning pass; plain data so the simulator and `dds plan` pass the same thing as production."""

    policy: str = "best-fit"  # best-fit | least-demand | concentrated | spread
    batch_solver: str = "auto"  # auto | greedy | milp
    solver_time_budget_seconds: float = 2.0
    allow_new_nodes: bool = True
    groups: Optional[tuple[str, ...]] = None  # restrict new nodes / attaches to these groups (None = all)
    node_removal_enabled: bool = True  # False when CA owns node removal (observed mode)
    # Warm headroom per pool: idle GPUs each group of the pool keeps attached unless the group sets its own
    # (NodeGroupSpec.warm_gpus); see dds/planner/headroom.py.
    warm_gpus_by_pool: Mapping[str, int] = field(default_factory=dict)
    # The GPUs are attached by CoHDI's composable-resource-operator (fabric `composability-request`). Its device mode
    # follows from each group's GPU API: an extended-resource group is served by its DEVICE_PLUGIN mode, which
    # detaches a GPU only from a node where no GPU is busy (dds/planner/device_modes.py); a DRA group by its DRA mode,
    # which checks the GPU being detached only.
    cdi_operator: bool = False
    extra: dict = field(default_factory=dict)
