"""Node group configuration: what a DDS node group is, wherever it was read from (MachineSet or YAML file)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dds.model.resources import Resources

# Our annotations (on a Cluster API MachineSet, or the same keys in examples/node-groups.yaml).
ANNOTATION_PREFIX = "dds.cdi.dev/"
ANN_ENABLED = ANNOTATION_PREFIX + "enabled"  # "true" opts a MachineSet in
ANN_MAX_GPUS = ANNOTATION_PREFIX + "max-gpus-per-node"  # what the template advertises
ANN_GPU_RESOURCE = ANNOTATION_PREFIX + "gpu-resource"  # default nvidia.com/gpu
ANN_GPU_MODELS = ANNOTATION_PREFIX + "gpu-models"  # comma-separated, first is the default model
ANN_FABRIC_POOL = ANNOTATION_PREFIX + "fabric-pool"
ANN_TEMPLATE_MODE = ANNOTATION_PREFIX + "template-mode"  # spec-fixed (default) | observed
ANN_GPU_IDLE_COOLDOWN = ANNOTATION_PREFIX + "gpu-idle-cooldown"  # duration, default 5m (below)
ANN_NODE_IDLE_COOLDOWN = ANNOTATION_PREFIX + "node-idle-cooldown"  # duration, default 10m
# How long a GPU stays idle on its node before it goes back to the pool, unless the group says otherwise. Measured
# against the ideal pool on KubeComp W1-W4, elastic and multi-pool (docs/simulation.md, "The ideal bound"): 5 minutes
# waits least on every one of them; 10 minutes strands GPUs on the wrong node, 1 minute sends each next pod to an attach.
DEFAULT_GPU_IDLE_COOLDOWN_SECONDS = 300.0
ANN_FORCE_DETACH = ANNOTATION_PREFIX + "force-detach"  # "true": detach GPUs even while in use
ANN_WARM_GPUS = ANNOTATION_PREFIX + "warm-gpus"  # idle GPUs kept attached across the group's nodes (headroom)
ANN_GPU_API = ANNOTATION_PREFIX + "gpu-api"  # how pods get the group's GPUs: GpuApi (docs/dra.md)
# CXL memory a node of the group can have attached from its fabric pool, on top of its own (docs/cxl-memory.md): up to
# the maximum, in chunks of the chunk size (what the pool's memory devices hand out at a time).
ANN_MAX_CXL_MEMORY = ANNOTATION_PREFIX + "max-cxl-memory-per-node"
ANN_CXL_MEMORY_CHUNK = ANNOTATION_PREFIX + "cxl-memory-chunk"
# A DRA group's devices (DraDriverConfig; docs/dra.md "A GPU vendor's DRA driver"): which driver publishes them, the
# DeviceClass claims name, where the model and the memory are in a device, and how DDS describes a model no device of
# the cluster shows yet.
ANN_DRA_DRIVER = ANNOTATION_PREFIX + "dra-driver"
ANN_DRA_DEVICE_CLASS = ANNOTATION_PREFIX + "dra-device-class"
ANN_DRA_MODEL_ATTRIBUTE = ANNOTATION_PREFIX + "dra-model-attribute"
ANN_DRA_MEMORY_CAPACITY = ANNOTATION_PREFIX + "dra-memory-capacity"
ANN_DRA_DEVICE_ID_ATTRIBUTE = ANNOTATION_PREFIX + "dra-device-id-attribute"
ANN_DRA_MODELS = ANNOTATION_PREFIX + "dra-models"  # A100=NVIDIA A100-SXM4-80GB:80Gi,...
ANN_DRA_DEVICE_ATTRIBUTES = ANNOTATION_PREFIX + "dra-device-attributes"  # type=gpu,...
# Written by DDS itself on a MachineSet it scales: the requests applied (dds/nodes/machineset.py).
ANN_SCALE_REQUESTS = ANNOTATION_PREFIX + "scale-requests"

# Labels DDS puts on nodes it manages.
LABEL_NODE_GROUP = ANNOTATION_PREFIX + "node-group"
LABEL_GPU_MODEL = ANNOTATION_PREFIX + "gpu-model"
# cluster-autoscaler's GPULabel: the GPU model, present exactly while the node has GPUs it can use (see
# docs/gpu-label.md: CA treats a node with its GPU label and 0 GPUs as unready and, outside an autoscaled group, as an
# error that stops every scale-up; a DDS node at 0 GPUs must look to CA like the CPU node it is).
LABEL_ATTACHED_GPU = ANNOTATION_PREFIX + "attached-gpu"

# cluster-autoscaler's Cluster API conventions that DDS reads as they are.
ANN_CAPI_MIN = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
ANN_CAPI_MAX = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
ANN_CAPACITY_PREFIX = "capacity.cluster-autoscaler.kubernetes.io/"
ANN_CAPI_DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
# Per-group autoscaling options, as CA's clusterapi provider names them.
ANN_OPTIONS_PREFIX = "cluster.x-k8s.io/autoscaling-options-"

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# The resource the planner counts a DRA group's GPUs in, and that pods' ResourceClaims are lowered to
# (dds/planner/dra.py). Planning only: it is never on a Node nor on cluster-autoscaler's template. A name of its own
# keeps extended-resource pods off DRA groups' nodes and claims off the others, through the ordinary resource checks.
DRA_GPU_RESOURCE = "dra.dds.cdi.dev/gpu"
# The DRA driver DDS publishes attached GPUs under itself (simulated fabric, pool mode); the default of every DRA group.
DDS_DRA_DRIVER = "gpu.dds.cdi.dev"


def dra_gpu_resource(driver: str) -> str:
    """The planner's resource for the GPUs of DRA groups whose devices come under `driver`: DRA_GPU_RESOURCE for DDS's
    own driver (as before), `dra.dds.cdi.dev/<driver>` for a vendor's. One per driver, so a claim the vendor's devices
    satisfy is never planned onto a node whose GPUs another driver publishes (and the other way round)."""
    return DRA_GPU_RESOURCE if driver == DDS_DRA_DRIVER else f"{DRA_GPU_RESOURCE.partition('/')[0]}/{driver}"


def is_dra_gpu_resource(resource: str) -> bool:
    return resource.startswith(DRA_GPU_RESOURCE.partition("/")[0] + "/")


class GpuApi(str, Enum):
    """How pods get a group's GPUs: exactly one API per group, so kube-scheduler never hands one GPU out twice.

    extended-resource: the node's `gpu_resource` capacity (a device plugin's, or DDS's with the simulated fabric).
    dra-node-local: devices of the node's ResourceSlice (hot-plug); the node shows no GPU capacity.
    dra-pool: slots of the fabric pool's ResourceSlice, attached when kube-scheduler allocates one (binding
    conditions); the node shows no GPU capacity and boots with no GPU.
    """

    EXTENDED_RESOURCE = "extended-resource"
    DRA_NODE_LOCAL = "dra-node-local"
    DRA_POOL = "dra-pool"

    @property
    def dra(self) -> bool:
        return self is not GpuApi.EXTENDED_RESOURCE


class TemplateMode(str, Enum):
    """How CA sees a group (README: "Spec-fixed node groups").

    spec-fixed: CA always simulates with the template (max GPUs); live nodes are not mapped to the group, and DDS
    owns their scale-down. observed: the usual mapping; CA may cache a live node's shape as the template.
    """

    SPEC_FIXED = "spec-fixed"
    OBSERVED = "observed"


class Taint(BaseModel):
    model_config = ConfigDict(frozen=True)
    key: str
    value: str = ""
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


class OptionOverrides(BaseModel):
    """Per-group overrides of CA's NodeGroupAutoscalingOptions; None = echo CA's default."""

    model_config = ConfigDict(frozen=True)
    scale_down_utilization_threshold: Optional[float] = None
    scale_down_gpu_utilization_threshold: Optional[float] = None
    scale_down_unneeded_seconds: Optional[float] = None
    scale_down_unready_seconds: Optional[float] = None
    max_node_provision_seconds: Optional[float] = None
    zero_or_max_node_scaling: Optional[bool] = None
    ignore_daemonsets_utilization: Optional[bool] = None


class SourceRef(BaseModel):
    """Where a group was read from, for messages and Events."""

    model_config = ConfigDict(frozen=True)
    kind: str  # "MachineSet" | "MachineDeployment" | "File"
    name: str
    namespace: str = ""
    api_version: str = ""
    uid: str = ""

    def describe(self) -> str:
        if self.kind == "File":
            return f"file {self.name}"
        return f"{self.kind} {self.namespace}/{self.name}"


class DraModelDescription(BaseModel):
    """How a vendor's driver shows one GPU model, when no device of that model is in the cluster to learn it from:
    the model attribute's value (e.g. "NVIDIA A100-SXM4-80GB") and the memory capacity in bytes (None: not known, a
    selector reading it then fails, as kube-scheduler's would on a device without it)."""

    model_config = ConfigDict(frozen=True)
    value: str
    memory: Optional[int] = Field(default=None, ge=0)


class DraDriverConfig(BaseModel):
    """Which DRA driver a DRA group's GPUs come under and where a device of it says its model and its memory.

    DDS's own driver (the default) is published by DDS itself in one shape (dds/model/dra_devices.py `gpu_device`). A
    vendor's driver (e.g. NVIDIA's `gpu.nvidia.com`) publishes the node's GPUs itself; DDS learns the shape of a model
    from a device of it already published in the cluster, else from `models` (docs/dra.md)."""

    model_config = ConfigDict(frozen=True)
    driver: str = DDS_DRA_DRIVER
    device_class: str = ""  # empty: the driver's name (both DDS's and NVIDIA's DeviceClass are named after the driver)
    model_attribute: str = ""  # empty: "model" for DDS's driver, "productName" for a vendor's (NVIDIA's name)
    memory_capacity: str = "memory"
    device_id_attribute: str = ""  # the fabric device id (the GPU UUID): "deviceID" for DDS's driver, else "uuid"
    models: dict[str, DraModelDescription] = Field(default_factory=dict)  # fabric model -> the vendor's shape
    # What every whole GPU of the driver shows (e.g. type=gpu): given to described devices, required of the published
    # devices DDS learns from and counts (NVIDIA's MIG devices say type=mig).
    device_attributes: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        driver = data.get("driver") or DDS_DRA_DRIVER
        own = driver == DDS_DRA_DRIVER
        defaults = {"device_class": driver, "model_attribute": "model" if own else "productName",
                    "device_id_attribute": "deviceID" if own else "uuid"}
        return {**data, **{name: value for name, value in defaults.items() if not data.get(name)}}

    @property
    def own(self) -> bool:
        """DDS publishes the devices itself (its own driver)."""
        return self.driver == DDS_DRA_DRIVER


class NodeGroupSpec(BaseModel):
    """A DDS node group. Its template advertises `max_gpus_per_node` GPUs (spec-fixed)."""

    model_config = ConfigDict(frozen=True)

    id: str
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=0)
    replicas: int = Field(default=0, ge=0)  # MachineSet spec.replicas as last read (nodes wanted)
    milli_cpu: int = Field(gt=0)
    memory: int = Field(gt=0)  # bytes
    ephemeral_storage: int = Field(default=100 * 2**30, ge=0)
    max_pods: int = Field(default=110, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    gpu_models: tuple[str, ...] = ()  # empty = any model of the pool
    initial_gpus: int = Field(default=0, ge=0)  # GPUs a new node boots with (capacity.../gpu-count)
    max_gpus_per_node: int = Field(ge=0)
    fabric_pool: str = "default"
    template_mode: TemplateMode = TemplateMode.SPEC_FIXED
    gpu_idle_cooldown_seconds: float = Field(default=DEFAULT_GPU_IDLE_COOLDOWN_SECONDS, ge=0)
    node_idle_cooldown_seconds: float = Field(default=600.0, ge=0)
    force_detach: bool = False
    # Idle GPUs kept attached across the group's nodes, ready for the next pods (None: the pool's default,
    # PlannerConfig.warm_gpus_by_pool): dds/planner/headroom.py.
    warm_gpus: Optional[int] = Field(default=None, ge=0)
    gpu_api: GpuApi = GpuApi.EXTENDED_RESOURCE
    # CXL memory attachable to a node from its fabric pool, beyond `memory` (its own): at most `max_cxl_memory`
    # bytes, in chunks of `cxl_memory_chunk` bytes (0 and 0: the group takes no CXL memory).
    max_cxl_memory: int = Field(default=0, ge=0)
    cxl_memory_chunk: int = Field(default=0, ge=0)
    dra: DraDriverConfig = Field(default_factory=DraDriverConfig)  # a DRA group's driver and device shape
    options: OptionOverrides = Field(default_factory=OptionOverrides)
    source: SourceRef

    @model_validator(mode="before")
    @classmethod
    def _dra_resource(cls, data: Any) -> Any:
        # A DRA group counts its GPUs in its driver's planner resource unless told otherwise (and `_consistent` refuses
        # otherwise).
        api = data.get("gpu_api", GpuApi.EXTENDED_RESOURCE) if isinstance(data, dict) else None
        if api in {a.value for a in GpuApi} and GpuApi(api).dra and "gpu_resource" not in data:
            dra = data.get("dra")
            driver = dra.driver if isinstance(dra, DraDriverConfig) else (dra or {}).get("driver") or DDS_DRA_DRIVER
            return {**data, "gpu_resource": dra_gpu_resource(driver)}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "NodeGroupSpec":
        if self.min_size > self.max_size:
            raise ValueError(f"min size {self.min_size} is above max size {self.max_size}")
        if self.initial_gpus > self.max_gpus_per_node:
            raise ValueError(f"initial GPUs {self.initial_gpus} exceed max GPUs per node {self.max_gpus_per_node}")
        if self.gpu_api.dra != is_dra_gpu_resource(self.gpu_resource) or (
                self.gpu_api.dra and self.gpu_resource != dra_gpu_resource(self.dra.driver)):
            raise ValueError(f"GPU resource {self.gpu_resource} does not go with GPU API {self.gpu_api.value}: "
                             f"{DRA_GPU_RESOURCE} (dra.dds.cdi.dev/<driver> for a vendor's DRA driver) is the "
                             f"planner's name for DRA groups' GPUs, and theirs only")
        if self.max_cxl_memory and (not self.cxl_memory_chunk or self.max_cxl_memory % self.cxl_memory_chunk):
            raise ValueError(f"max CXL memory per node {self.max_cxl_memory} is not a whole number of chunks of "
                             f"{self.cxl_memory_chunk} bytes")
        if self.gpu_api is GpuApi.DRA_POOL and not self.dra.own:
            raise ValueError(f"a {GpuApi.DRA_POOL.value} group's GPUs are slots DDS publishes under its own driver "
                             f"{DDS_DRA_DRIVER}, not {self.dra.driver}")
        if self.gpu_api is GpuApi.DRA_POOL and self.initial_gpus:
            raise ValueError(f"a {GpuApi.DRA_POOL.value} group's nodes boot with no GPU (its GPUs are pool slots "
                             f"kube-scheduler allocates), not {self.initial_gpus}")
        return self

    @property
    def publishes_own_slices(self) -> bool:
        """DDS writes each node's ResourceSlice (dds/kube/resourceslices.py): node-local mode under DDS's own driver.
        A vendor's driver publishes its nodes' devices itself; DDS only reads them."""
        return self.gpu_api is GpuApi.DRA_NODE_LOCAL and self.dra.own

    @property
    def default_gpu_model(self) -> Optional[str]:
        return self.gpu_models[0] if self.gpu_models else None

    @property
    def max_cxl_chunks(self) -> int:
        """The CXL memory chunks a node of the group can hold (0: it takes none)."""
        return self.max_cxl_memory // self.cxl_memory_chunk if self.cxl_memory_chunk else 0

    def template_allocatable(self) -> Resources:
        """What the template node advertises: the node's capacity with every GPU slot filled and its CXL memory at the
        maximum, so CA's simulation says a node of the group would fit a GPU- or memory-bound pod. A DRA group's GPUs
        are ResourceSlice devices, which cluster-autoscaler's externalgrpc templates cannot carry: none are
        advertised."""
        advertised = self.max_gpus_per_node if not self.gpu_api.dra else 0
        scalar = {self.gpu_resource: advertised} if advertised else {}
        return Resources(self.milli_cpu, self.memory + self.max_cxl_memory, self.ephemeral_storage, self.max_pods,
                         scalar)

    def node_allocatable(self, gpus: int, cxl_chunks: int = 0) -> Resources:
        """A node of this group with `gpus` GPUs and `cxl_chunks` chunks of CXL memory attached."""
        base = self.template_allocatable().with_scalar(self.gpu_resource, gpus)
        return Resources(base.milli_cpu, self.memory + cxl_chunks * self.cxl_memory_chunk, base.ephemeral_storage,
                         base.pods, base.scalar)
