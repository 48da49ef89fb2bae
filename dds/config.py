"""The one settings object: defaults < YAML file (`--config`) < environment (`DDS_*`) < command-line flags."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


CLUSTER_API_GROUP = "cluster.x-k8s.io"
OPENSHIFT_MACHINE_API_GROUP = "machine.openshift.io"
# Why OpenShift's Machine API is no node-group source (docs/install.md, "OpenShift's Machine API"): said where a user
# meets it, the capi_group setting and `dds serve`'s start on a cluster serving only that API (dds/kube/preflight.py).
MACHINE_API_REFUSAL = (
    f"{OPENSHIFT_MACHINE_API_GROUP} (OpenShift's Machine API) is not supported: DDS scales Cluster API "
    f"({CLUSTER_API_GROUP}) MachineSets and MachineDeployments only. A deleting Machine's GPUs go back to the pool "
    f"through Cluster API's pre-terminate hook annotation, which the Machine API does not have (it holds a deletion "
    f"with spec.lifecycleHooks), and the Machine API's controllers need a cloud actuator, so DDS cannot be tested "
    f"against them (docs/install.md, \"OpenShift's Machine API\")")
MACHINE_API_FIX = (f"run Cluster API ({CLUSTER_API_GROUP}) with an infrastructure provider for the GPU hosts and opt its "
                   f"MachineSets or MachineDeployments in")


class FabricBackend(str, Enum):
    SIMULATED = "simulated"
    COMPOSABILITY_REQUEST = "composability-request"
    REDFISH = "redfish"


class NodeBackend(str, Enum):
    MACHINESET = "machineset"  # Cluster API: scale MachineSets (an infrastructure provider makes the machines)
    MEMORY = "memory"  # no cluster: remember the wanted nodes only (dds serve with a YAML file)


# Settings of earlier releases that no longer mean anything, and what to do instead: refused with that advice rather
# than as an unknown value.
REMOVED_SETTINGS = {
    "node_backend kwok": "DDS no longer makes Machines and Nodes itself: run Cluster API's own controllers (its core "
                         "manager, `clusterctl init`) with an infrastructure provider, and node_backend machineset "
                         "(docs/install.md)",
    "kwok": "it configured node_backend kwok, which is gone: Cluster API's infrastructure provider makes the machines "
            "(docs/install.md); remove the section",
}


class _Section(BaseModel):
    """A nested settings section: an unknown key is an error (a typo such as `pasword_file` must not be ignored)."""

    model_config = ConfigDict(extra="forbid")


class LatencySpec(_Section):
    """A latency distribution in seconds: uniform in [min, max] (min == max: fixed)."""

    min: float = Field(default=20.0, ge=0)
    max: float = Field(default=40.0, ge=0)


class FaultSpec(_Section):
    """Fault injection for the simulated fabric: probabilities per operation (0..1)."""

    attach_error: float = Field(default=0.0, ge=0, le=1)
    attach_hang: float = Field(default=0.0, ge=0, le=1)
    partial_attach: float = Field(default=0.0, ge=0, le=1)
    device_failure_after_attach: float = Field(default=0.0, ge=0, le=1)
    detach_error: float = Field(default=0.0, ge=0, le=1)
    seed: Optional[int] = None
    # At most this many faults of each kind (counted in the fabric's persisted state, so a restart does not renew
    # the budget); None = no limit. A fault that strikes, then a repaired fabric: what recovery tests need.
    max_faults: Optional[int] = Field(default=None, ge=0)


class PoolSpec(_Section):
    # The json_schema_extra constraints repeat what the simulated fabric checks at start (_validate_pools), so the
    # chart's schema (hack/gen-chart-schema.py) refuses the same pools.
    name: str = Field(json_schema_extra={"pattern": "^[^/]+$"})
    devices: dict[str, int] = Field(json_schema_extra={"propertyNames": {"minLength": 1},
                                                       "additionalProperties": {"type": "integer", "minimum": 0}})
    # a fabric-side limit on top of each group's max GPUs
    max_slots_per_node: Optional[int] = Field(default=None, json_schema_extra={"minimum": 0})
    # Idle GPUs each group drawing from this pool keeps attached for the next pods (warm headroom), unless the group's
    # dds.cdi.dev/warm-gpus says otherwise. Never held while a pending pod waits for a device of this pool.
    warm_gpus: int = Field(default=0, ge=0)


class SimulatedFabricSettings(_Section):
    pools: list[PoolSpec] = Field(default_factory=lambda: [PoolSpec(name="default", devices={"A30": 8})])
    attach_latency: LatencySpec = Field(default_factory=LatencySpec)
    detach_latency: LatencySpec = Field(default_factory=lambda: LatencySpec(min=5.0, max=10.0))
    faults: FaultSpec = Field(default_factory=FaultSpec)
    # Where the simulated manager keeps its state in a cluster, so it outlives a DDS restart (as a real CDI manager does).
    state_configmap: str = "dds-simulated-fabric"
    # The simulated fabric writes GPU capacity into Nodes, which is right only for kwok nodes (no kubelet, no devices).
    # On any other node `dds serve` refuses, naming this setting; true lets it fake GPUs on real nodes too.
    allow_non_kwok_nodes: bool = False

    @model_validator(mode="before")
    @classmethod
    def _replaced_dra_switches(cls, data: Any) -> Any:
        # The fabric-wide DRA switches became a choice per node group; say so instead of "extra inputs not permitted".
        for key, api in REPLACED_DRA_SETTINGS.items():
            if isinstance(data, dict) and key in data:
                raise ValueError(f"simulated_fabric.{key} was replaced by a choice per node group: annotate each "
                                 f"MachineSet whose GPUs pods ask for through ResourceClaims with "
                                 f"dds.cdi.dev/gpu-api: \"{api}\" and remove this setting (docs/dra.md)")
        return data


# Settings of earlier releases, now the node group annotation dds.cdi.dev/gpu-api (dds/model/groups.py GpuApi).
REPLACED_DRA_SETTINGS = {"dra_resource_slices": "dra-node-local", "dra_pool_slices": "dra-pool"}


class RedfishSettings(_Section):
    endpoint: str = "https://127.0.0.1:8000"
    username: str = ""
    password_file: Optional[Path] = None
    verify_tls: bool = True
    ca_file: Optional[Path] = None
    # The whole of one HTTP request (connecting, the headers and the body): a service that drips its answer is cut off.
    timeout_seconds: float = Field(default=10.0, gt=0)
    # An answer larger than this is refused unread (a Redfish resource is a few KiB; a collection of thousands, ~1 MiB).
    max_response_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # A CXL memory Connection the service accepted (POST) must be listed and Enabled, or gone after its DELETE, within
    # this long; else the chunk's attach or detach fails naming what is missing.
    connection_wait_seconds: float = Field(default=120.0, gt=0)


class ComposabilitySettings(_Section):
    resource_type: str = "gpu"
    request_name_prefix: str = "dds-"
    # The operator writes every reconcile error into status.error and retries it with backoff, clearing it on success:
    # an error is final for DDS only once an operation has lasted this long with the error still there.
    operator_error_bound_seconds: float = Field(default=120.0, gt=0)
    # The operator also waits without an error: for an attached GPU to show on the node, for a detached one to leave it
    # (its ResourceSlice or nvidia-smi), every 3-30 s for ever. An operation still running this long with no error
    # ends FAILED (Timeout) naming the operator's state; a failed attach gives back what it did not get. Below the
    # orphan timeout, so the backend ends a hung attach before the orphan reclaim would try to cancel it. A failed
    # attach's give-back owed while the operator has not taken up a resource (state "") waits this long after the
    # attach ended, then is written or its device reported stranded (GiveBackOverdue Event).
    operator_wait_bound_seconds: float = Field(default=480.0, gt=0)
    # A node of an extended-resource group showing more GPUs than the operator's ComposableResources on it for this
    # long holds a device no resource does (the operator lost it): reported (UnheldDevice Event, dds_unheld_devices).
    unheld_device_grace_seconds: float = Field(default=120.0, gt=0)


class NamespaceGrant(_Section):
    """What the administrator lets the MachineSets of one namespace ask for (docs/configuration.md "Who may have node
    groups"). A MachineSet asking for more is refused, with an InvalidNodeGroup Event saying which setting allows it:
    annotations are written by whoever may edit a MachineSet, these settings only by who deploys DDS."""

    # The fabric pools the namespace's groups may draw GPUs from (dds.cdi.dev/fabric-pool); "*": every pool.
    pools: list[str] = Field(min_length=1, json_schema_extra={"items": {"type": "string", "pattern": "\\S"}})
    # Whether its groups may set dds.cdi.dev/force-detach: "true" (detach GPUs while pods use them).
    force_detach: bool = False
    # The shortest dds.cdi.dev/gpu-idle-cooldown and node-idle-cooldown its groups may set: a cooldown of 0 turns
    # every idle moment into a detach (or a node removal), churning the fabric other namespaces share.
    min_idle_cooldown_seconds: float = Field(default=60.0, ge=0)

    @field_validator("pools")
    @classmethod
    def _named_pools(cls, value: list[str]) -> list[str]:
        if not all(name.strip() for name in value):
            raise ValueError("a pool name must not be empty (\"*\" allows every pool)")
        return value


POLICIES = ("best-fit", "least-demand", "concentrated", "spread")
BATCH_SOLVERS = ("auto", "greedy", "milp")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTSET")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DDS_", env_nested_delimiter="__", extra="forbid")

    config_file: Optional[Path] = Field(default=None, exclude=True)

    # gRPC endpoint that cluster-autoscaler's cloud-config points at.
    listen: str = "0.0.0.0:8086"
    tls_cert: Optional[Path] = None
    tls_key: Optional[Path] = None
    tls_ca: Optional[Path] = None  # client CA: client certificates are required and verified
    insecure: bool = False  # plaintext, only when asked for explicitly
    # Who may call (mutual TLS): a client certificate (with the clientAuth usage) must name one of these as a SAN DNS
    # name or a SAN URI, never its CommonName, else the call is PERMISSION_DENIED (dds/provider/callers.py). The default is the client identity
    # `dds certs` issues to cluster-autoscaler (dds/certs.py CLIENT_COMMON_NAME): any other holder of a certificate of
    # the same CA is refused.
    grpc_allowed_clients: list[str] = Field(default_factory=lambda: ["cluster-autoscaler"],
                                            json_schema_extra={"minItems": 1,
                                                               "items": {"type": "string", "pattern": "\\S"}})
    # Every gRPC connection is closed after this long (calls in progress get GRPC_MAX_CONNECTION_AGE_GRACE_SECONDS more)
    # and the client reconnects through a new handshake: a client whose certificate a rotated tls_ca no longer trusts
    # is out within this bound.
    grpc_max_connection_age_seconds: float = Field(default=300.0, gt=0)

    # Where node groups come from: a YAML file, or MachineSets in the cluster (kubeconfig / in-cluster).
    node_groups_file: Optional[Path] = None
    kubeconfig: Optional[Path] = None
    in_cluster: bool = False
    namespace: str = "dds-system"  # where DDS keeps its own state (Lease, state ConfigMaps)
    machineset_namespaces: list[str] = Field(default_factory=list)  # empty = all namespaces
    # The API group of the MachineSets and MachineDeployments DDS scales (cluster-autoscaler's clusterapi provider takes
    # it from CAPI_GROUP). Cluster API's only: OpenShift's Machine API is refused with why (MACHINE_API_REFUSAL).
    capi_group: str = Field(default=CLUSTER_API_GROUP, json_schema_extra={"enum": [CLUSTER_API_GROUP]})
    # Which namespaces may have node groups, and what each may ask for (NamespaceGrant). Empty: none may; an opted-in
    # MachineSet elsewhere is refused with an InvalidNodeGroup Event (node groups from node_groups_file, written by the
    # administrator, are not limited by it).
    node_group_namespaces: dict[str, NamespaceGrant] = Field(default_factory=dict)

    # The label pods select a GPU model with (on nodes and templates). CA's GPULabel is DDS's own
    # dds.cdi.dev/attached-gpu, present only while a node has GPUs: docs/gpu-label.md.
    gpu_label: str = "nvidia.com/gpu.product"
    # No default: in a cluster the fabric is a choice (`dds serve` refuses to start without one), so settings made for
    # a real cluster never fall back to simulated GPUs. The demo, harness/ and the tests choose `simulated`.
    fabric: Optional[FabricBackend] = None
    # The GPU pools a real fabric holds (composability-request, redfish: neither API lists them). Unset, they are
    # simulated_fabric.pools as in earlier releases, which must then be set: its 8 x A30 default is the simulation's.
    pools: Optional[list[PoolSpec]] = None
    simulated_fabric: SimulatedFabricSettings = Field(default_factory=SimulatedFabricSettings)
    redfish: RedfishSettings = Field(default_factory=RedfishSettings)
    composability: ComposabilitySettings = Field(default_factory=ComposabilitySettings)
    node_backend: NodeBackend = NodeBackend.MACHINESET

    # Planning.
    policy: str = Field(default="best-fit", json_schema_extra={"enum": list(POLICIES)})
    batch_solver: str = Field(default="auto", json_schema_extra={"enum": list(BATCH_SOLVERS)})
    solver_time_budget_seconds: float = Field(default=2.0, gt=0)
    # A pending pod unschedulable this long without CA starting a scale-up is DDS's to serve (case 2).
    # Case 2 starts only after CA had its chance: CA waits 30 s before scaling up for a GPU pod (its
    # unschedulablePodWithGpuTimeBuffer) and scans every 10 s, so 60 s leaves CA's case 1 the first word.
    # The fast path: DDS's loop attaches GPUs for a pending pod that fits on a live node once they are attached, as
    # soon as the pod has been unschedulable this long (a short debounce batches a burst). Pods that need a new node
    # are left to cluster-autoscaler. A large value gives CA the first word on GPU pods too.
    pending_debounce_seconds: float = Field(default=2.0, ge=0)
    # A gang whose GPUs are attached but that has not reached its minimum of running pods this long after (or one of
    # whose attaches failed) gets them detached: dds/controller/gang_attaches.py.
    gang_start_timeout_seconds: float = Field(default=300.0, gt=0)
    # DRA pool mode: kube-scheduler's binding timeout (its DynamicResources plugin's bindingTimeout; 600 s unless the
    # scheduler configuration sets another). An attach for a pool slot still running shortly before it gets the
    # failure condition, so the scheduler allocates again at once (dds/controller/dra_binding.py, docs/dra.md).
    dra_binding_timeout_seconds: float = Field(default=600.0, ge=1)
    # How long a node may take to report CXL memory the fabric has online before DDS says so (docs/cxl-memory.md).
    cxl_memory_visible_timeout_seconds: float = Field(default=600.0, gt=0)
    # Tenants' CEL selectors (ResourceClaims, DeviceClasses): a longer selector is refused unevaluated (the default is
    # the apiserver's own limit, CELSelectorExpressionMaxLength); past this many distinct evaluations, or seconds of
    # them, in one pass the claims not judged yet are refused and judged next pass (dds/planner/dra.py CelBudget).
    cel_max_expression_length: int = Field(default=10 * 1024, ge=1)
    cel_evaluations_per_pass: int = Field(default=5_000, ge=1)
    cel_seconds_per_pass: float = Field(default=1.0, gt=0)
    # Reservations (dds/controller/reservations.py, docs/reservations.md): a pending pod asking for more than
    # `reservation_large_fraction` of a node's GPU slots, unschedulable for `reservation_min_age_seconds`, gets a
    # node reserved (tainted, the pod tolerating it) and its GPUs gathered there. On by default: without it kubecomp-w4's
    # 8-GPU jobs wait over an hour at p95 (docs/simulation.md, "The ideal bound"). 300 s: a reserved node drains for
    # up to a pod's run time, so at 600 s the 8-GPU jobs of a long kubecomp-w4 queue waited 972 s at p95; from 300 s,
    # 597 s, and the others no longer (docs/simulation.md has the ages measured).
    reservations: bool = True
    reservation_min_age_seconds: float = Field(default=300.0, ge=0)
    reservation_large_fraction: float = Field(default=0.5, gt=0, lt=1)
    # Reserve sooner, from this age on, while at most one other pending GPU pod could use the node's GPUs (the queue
    # is short, so draining a node costs little); unset: only `reservation_min_age_seconds` applies. 0 by default: of
    # the ages measured (0, 120 s, unset) it serves the 8-GPU jobs soonest and delays the other jobs least.
    reservation_quiet_age_seconds: Optional[float] = Field(default=0.0, ge=0)
    # ProvisioningRequests (autoscaling.x-k8s.io/v1) of this class are DDS's to serve (docs/kueue.md,
    # dds/planner/provisioning.py): their pod sets planned as one gang, the capacity booked for their pods, the
    # conditions Kueue reads written. A DNS subdomain, as Kueue's ProvisioningRequestConfig requires; "" serves none.
    provisioning_class: str = Field(default="attach-or-provision.dds.cdi.dev", max_length=253,
                                    pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$")
    # How long capacity provisioned for a request stays booked for its pods (Kueue creates them once it sees
    # Provisioned=True); then BookingExpired=True and the capacity is released to every pod.
    provisioning_booking_seconds: float = Field(default=600.0, gt=0)
    # Move idle GPUs: when pods the fast path cannot serve would get GPUs idle on other nodes, those GPUs are detached
    # now instead of after their idle cooldown, and the next pass attaches them where the pods fit
    # (dds/planner/moves.py; docs/simulation.md has what it does to waits). Off by default.
    move_idle_gpus: bool = False
    # The moves of move_idle_gpus alone, without its room headroom: idle GPUs that pending pods elsewhere would get are
    # released at once, the rest wait out their cooldown. On by default: with the 5-minute cooldown it costs no GPUs
    # held and cuts kubecomp-w4's waits under reservations by a quarter (docs/simulation.md, "The ideal bound").
    release_idle_gpus: bool = True
    loop_interval_seconds: float = Field(default=5.0, gt=0)
    orphan_attach_timeout_seconds: float = Field(default=600.0, gt=0)
    # node_backend machineset: how long a deleting Machine's pre-terminate hook waits for its GPUs' detach (then an
    # Event, the devices counted stranded, the hook released: dds/controller/machine_hooks.py).
    pre_terminate_detach_timeout_seconds: float = Field(default=300.0, gt=0)
    max_node_provision_seconds: float = Field(default=900.0, gt=0)
    watch_cache: bool = True  # read the cluster through LIST+WATCH (dds/kube/cache.py); false: a LIST per decision

    # Operations.
    # /metrics, /decisions and the probes. Plain HTTP without authentication on a loopback address only (the default);
    # anywhere else needs metrics_secure: TLS, and /metrics and /decisions only for bearer tokens the apiserver
    # authenticates (TokenReview) and authorizes for `get` on the path (SubjectAccessReview): dds/ops/http.py.
    metrics_listen: str = "127.0.0.1:8087"
    metrics_secure: bool = False
    # The serving pair of metrics_secure; unset: the gRPC server's tls_cert and tls_key (one Secret, one name).
    metrics_tls_cert: Optional[Path] = None
    metrics_tls_key: Optional[Path] = None
    leader_election: bool = False
    lease_name: str = "dds-leader"
    lease_duration_seconds: float = Field(default=15.0, gt=0)
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    retry_period_seconds: float = Field(default=2.0, gt=0)
    identity: Optional[str] = None
    # Any of logging's level names, in any case (dds/logs.py configure).
    log_level: str = Field(default="INFO", json_schema_extra={"pattern": f"(?i)^({'|'.join(LOG_LEVELS)})$"})
    log_format: str = Field(default="text", json_schema_extra={"enum": list(LOG_FORMATS)})

    @property
    def fabric_pools(self) -> list[PoolSpec]:
        """The pools the fabric holds: `pools`, else (earlier releases, the simulated fabric) simulated_fabric.pools."""
        return self.pools if self.pools is not None else self.simulated_fabric.pools

    @property
    def pools_declared(self) -> bool:
        """Whether the pools were given, rather than the simulated fabric's default."""
        return self.pools is not None or "pools" in self.simulated_fabric.model_fields_set

    @model_validator(mode="after")
    def _pools_of_the_simulated_fabric(self) -> "Settings":
        if self.fabric == FabricBackend.SIMULATED and self.pools is not None:
            raise ValueError("pools is for a real fabric (composability-request, redfish); the simulated fabric's "
                             "pools are simulated_fabric.pools")
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_removed_settings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if str(data.get("node_backend", "")).lower() == "kwok":
                raise ValueError(f"node_backend kwok was removed: {REMOVED_SETTINGS['node_backend kwok']}")
            if "kwok" in data:
                raise ValueError(f"the kwok section was removed: {REMOVED_SETTINGS['kwok']}")
        return data

    @field_validator("capi_group")
    @classmethod
    def _cluster_api_group(cls, value: str) -> str:
        if value.strip().lower() == OPENSHIFT_MACHINE_API_GROUP:
            raise ValueError(f"{MACHINE_API_REFUSAL}; {MACHINE_API_FIX}")
        if value != CLUSTER_API_GROUP:
            raise ValueError(f"{value!r} is not an API group DDS reads MachineSets from; the one it reads is "
                             f"{CLUSTER_API_GROUP} (Cluster API), and that is the default: remove the setting")
        return value

    @field_validator("grpc_allowed_clients")
    @classmethod
    def _some_caller_allowed(cls, value: list[str]) -> list[str]:
        if not value or not all(name.strip() for name in value):
            raise ValueError("needs at least one non-empty identity, else no client could call DDS: list a SAN DNS "
                             "name or a SAN URI of cluster-autoscaler's client certificate "
                             "(`dds certs` issues cluster-autoscaler)")
        return value

    @model_validator(mode="after")
    def _granted_namespaces_are_read(self) -> "Settings":
        unread = sorted(set(self.node_group_namespaces) - set(self.machineset_namespaces))
        if self.machineset_namespaces and unread:
            raise ValueError(f"node_group_namespaces names {', '.join(unread)}, which machineset_namespaces leaves "
                             f"unread: add it there too, or remove it here")
        return self

    @field_validator("batch_solver")
    @classmethod
    def _known_solver(cls, value: str) -> str:
        if value not in BATCH_SOLVERS:
            raise ValueError(f"unknown batch solver {value!r}; one of {', '.join(BATCH_SOLVERS)}")
        return value

    @field_validator("log_format")
    @classmethod
    def _known_log_format(cls, value: str) -> str:
        if value not in LOG_FORMATS:
            raise ValueError(f"unknown log format {value!r}; one of text, json")
        return value

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown policy {value!r}; one of {', '.join(POLICIES)}")
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init kwargs) beat the environment, which beats the file (merged in `load`).
        return init_settings, env_settings

    @classmethod
    def load(cls, config_file: Optional[Path] = None, *, config_text: Optional[tuple[str, str]] = None,
             **flags: Any) -> "Settings":
        """Build settings from a YAML file (or `config_text`: where it was read, and the YAML), the environment and
        flags (None-valued flags are ignored)."""
        data: dict[str, Any] = {}
        if config_text is not None:  # e.g. the cluster's dds-settings ConfigMap (`dds plan --kubeconfig`)
            config_file, text = Path(config_text[0]), config_text[1]
        else:
            text = None
        if config_file is not None:
            try:
                loaded = yaml.safe_load(text if text is not None else Path(config_file).read_text()) or {}
            except yaml.YAMLError as exc:  # not a ValueError: callers would see a traceback instead of the file
                raise ValueError(f"{config_file}: not valid YAML: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ValueError(f"{config_file}: the top level must be a mapping of settings")
            data.update({k.replace("-", "_"): v for k, v in loaded.items()})
            if "config_file" in data:  # the file's own path is not a setting (it would collide with the argument)
                raise ValueError(f"{config_file}: config_file is not a setting of the file (use --config)")
        from_env = cls()  # raises on a malformed DDS_* variable, naming it
        # Deep: DDS_REDFISH__USERNAME changes redfish.username and keeps the file's redfish.endpoint.
        data = _deep_merge(data, from_env.model_dump(exclude_unset=True, exclude={"config_file"}))
        data.update({k: v for k, v in flags.items() if v is not None})
        if flags.get("kubeconfig") is not None and flags.get("in_cluster") is None:
            data["in_cluster"] = False  # an explicit --kubeconfig beats the shipped settings' `in_cluster: true`
        return cls(config_file=config_file, **data)


def _deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
