"""A discrete-event simulation of a GPU cluster run by one policy, driven by the production planner.

Virtual time only: every component reads `Simulation.now` through the injected clock; nothing sleeps or reads the wall.

What happens, in the order the production pieces do it:

- **Scheduler step** (kube-scheduler's role), whenever something that can make a pod fit has happened (an arrival, a
  job ending, a GPU coming online, a node becoming Ready): the pending pods, oldest first, go to `plan_scale_up` on a
  snapshot of what exists *now* (no attaches in flight, no nodes coming, no pool to draw from, no new nodes allowed);
  every pod the planner says FITS_NOW is bound to the node it chose. One call per step binds the whole batch.
- **Scale step** (the DDS loop / CA scan), every `Timing.loop_interval_s` while there is something to decide:
  idleness is observed (`dds.controller.idle.IdleTracker`, as in production), then `plan_pass` — the control loop's
  own decision pass (dds/planner/passes.py) — plans on the full snapshot (attaches in flight and nodes provisioning
  count as capacity to come), in production's order: reservations (applied, then the pass is planned again on what
  they changed), the fast path for the pods still pending (here also adding the nodes cluster-autoscaler would: the
  simulator plays both), scale-down, room and warm headroom in a pass whose fast path attaches nothing, moves. The
  plan is carried out in the controller's order through the controller's applier, `Actions`
  (dds/controller/apply.py): attaches and detaches through the executor and the operation watcher, new and removed
  nodes through the executor's node provisioner (here the simulated cloud: a node is Ready `Timing.node_provision_s`
  after it is asked for), reservation and claim taints through `SimulatedNodes`. A node the scale-down removes is
  cordoned, releases its GPUs first and goes when they are gone.
- **Gangs**: the scheduler binds a gang's jobs only together (the planner's all-or-nothing verdicts on the binding
  snapshot); the `gang-unaware` policy hides gangs from the scale-up planner only.
- **CXL memory** (docs/cxl-memory.md): a pool's memory chunks are fabric devices too; the fast path's memory attaches
  are carried out with its GPU attaches, a node shows its online chunks as memory at once, its chunks its pods'
  requests do not need are tracked for the cooldown as the controller's observer does, and `plan_scale_down` detaches
  them. Policies that attach nothing take no memory either.
- **Kueue** (a scenario with a `KueueQueue`, dds/sim/kueue.py): a job's pods exist only once Kueue admits it, when
  its ProvisioningRequest is `Provisioned`; the attach-first policies serve the requests with the pass's own
  provisioning plan (dds/planner/provisioning.py), carried out as dds/controller/provisioning.py does, and
  `node-only` with cluster-autoscaler's best-effort-atomic class.
- **Fabric**: the production simulated backend (`dds.fabric.simulated.SimulatedFabric`, the one `dds serve` runs with
  the simulated fabric) on the virtual clock, with fixed latencies and no faults: attaches and detaches complete after
  their latency, and the watcher is asked about an operation once that latency has passed.

What is left here simulates the world around DDS: pods arriving and ending, kube-scheduler binding them, nodes booting,
the fabric's latencies. Events DDS would write go nowhere (nobody watches a simulated cluster).

Steps that cannot change anything are skipped (no pending pods, no idle GPUs, nothing in flight), and the scale step
fast-forwards to the next cooldown expiry, so long quiet stretches of a trace cost nothing.
"""

from __future__ import annotations

from types import MappingProxyType

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Callable, Mapping, Optional, Sequence

from dds.controller.apply import Actions
from dds.controller.devices import devices_by_node
from dds.controller.executor import Executor, OperationWatcher
from dds.controller.idle import IdleTracker, NodeUsage
from dds.config import FaultSpec, LatencySpec, PoolSpec, SimulatedFabricSettings
from dds.fabric.base import (AttachRequest, DeviceState, ErrorCode, FabricDevice, FabricError, Operation,
                             OperationKind, OperationState, PoolState)
from dds.fabric.simulated import SimulatedFabric
from dds.model.cxl import chunk_bytes, cxl_memory_of, is_cxl_model
from dds.model.events import ObjectRef
from dds.model.groups import NodeGroupSpec, Taint
from dds.model.provisioning import BOOKED_EFFECT, BOOKED_TAINT_KEY, ProvisioningView
from dds.model.resources import Resources
from dds.nodes.base import MachineInfo, MachinePhase
from dds.planner import plan_scale_up
from dds.planner.cxl_memory import unneeded_chunks
from dds.model.snapshot import POD_GROUP_LABEL, ContainerRequests, Device, NodeInfo, PodInfo, PoolInfo, Snapshot
from dds.planner.passes import PassInputs, PassPlan, PassSettings, plan_pass
from dds.planner.memos import PlannerMemos
from dds.planner.provisioning import ProvisioningConfig, ProvisioningPlan, booking_toleration
from dds.model.plan import Attach, Case, Detach, PlannerConfig, RemoveNode, Verdict
from dds.planner.reservations import (CLAIM_TAINT_KEY, RESERVATION_EFFECT, RESERVATION_TAINT_KEY, ReservationConfig,
                                      ReservationPlan, claim_taint, earliest_reservation_age, pod_token,
                                      reservation_taint)
from dds.sim.kueue import Kueue, Workload, WorkloadRecord, ca_atomic_scale_up
from dds.sim.policies import Layout, Mode, Policy
from dds.sim.scenario import Scenario, concentrated_layout, without_cxl_memory
from dds.sim.trace import Job, gang_minimums

POD_NAMESPACE = "sim"
STALL_LIMIT_S = 3600.0  # see Simulation._stalled
HOSTNAME_LABEL = "kubernetes.io/hostname"
Progress = Callable[[int, int], None]


class _Kind(IntEnum):
    """Event kinds; at equal times they run in this order (the scale step sees everything that happened at t)."""

    FINISH = 0
    OPERATION_DUE = 1
    NODE_READY = 2
    ARRIVAL = 3
    LOOP = 4


@dataclass(frozen=True, slots=True)
class JobRecord:
    name: str
    arrival_s: float
    gpus: int
    start_s: Optional[float]  # None: never started (unschedulable, or the run ended first)
    finish_s: Optional[float]
    node: Optional[str]

    @property
    def wait_s(self) -> Optional[float]:
        return None if self.start_s is None else self.start_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster after everything that happened at `t_s`."""

    t_s: float
    gpus_used: int  # GPUs requested by running jobs
    gpus_present: int  # GPUs held by nodes: fixed ones, and attached ones until their detach completes
    pending: int
    nodes: int
    gpus_stranded: int = 0  # attached for gangs that have not started, unused meanwhile
    cxl_memory: int = 0  # bytes of CXL memory attached to nodes (docs/cxl-memory.md), until their detach completes


@dataclass
class Counters:
    gpus_attached: int = 0
    gpus_detached: int = 0
    gpus_reallocated: int = 0  # attached to a node other than the one they last served
    cxl_chunks_attached: int = 0  # CXL memory chunks, counted apart from the GPUs
    cxl_chunks_detached: int = 0
    attach_failures: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    scheduler_steps: int = 0
    scale_steps: int = 0


@dataclass(frozen=True)
class SimResult:
    scenario: str
    policy: str
    jobs: tuple[JobRecord, ...]
    timeline: tuple[Sample, ...]
    counters: Counters
    end_s: float
    total_pool_gpus: int
    workloads: tuple[WorkloadRecord, ...] = ()  # Kueue jobs (dds/sim/kueue.py), when the scenario has a queue


@dataclass
class _Node:
    name: str
    group: NodeGroupSpec
    created_at: float
    fixed_gpus: int  # GPUs that are part of the server (node-only, static); never detached
    pods: dict[str, "_Pod"] = field(default_factory=dict)
    removing: bool = False
    reserved_for: Optional[str] = None  # the token of the pod the node is reserved for (its reservation taint)
    claimed_by: Optional[str] = None  # the token of a reservation that waits for this node's busy GPUs (claim taint)
    booked_for: Optional[str] = None  # the uid of the ProvisioningRequest the node is booked for (booking taint)
    # Sums of the requests of the pods bound here, kept as pods come and go.
    used_cpu: int = 0
    used_memory: int = 0
    used_gpus: int = 0

    def bind(self, pod: "_Pod") -> None:
        self.pods[pod.job.name] = pod
        self.used_cpu += pod.job.milli_cpu
        self.used_memory += pod.job.memory
        self.used_gpus += pod.job.gpus

    def release(self, pod: "_Pod") -> None:
        if self.pods.pop(pod.job.name, None) is not None:
            self.used_cpu -= pod.job.milli_cpu
            self.used_memory -= pod.job.memory
            self.used_gpus -= pod.job.gpus


@dataclass
class _Pod:
    job: Job
    info: PodInfo
    node: Optional[str] = None
    start_s: Optional[float] = None
    finish_s: Optional[float] = None


class _Unreported:
    """Where a simulation's Events go: nowhere, nobody watches a simulated cluster."""

    def emit(self, involved: ObjectRef, event_type: str, reason: str, message: str) -> None:
        return None


_UNREPORTED = _Unreported()


class SimulatedCloud:
    """The node provisioner (dds.nodes.base.NodeProvisioner) the executor drives in a simulation: a node asked for is
    Ready `Timing.node_provision_s` later, a node removed is gone at once. Keys are not needed: the simulation asks once."""

    def __init__(self, simulation: "Simulation") -> None:
        self._simulation = simulation

    def machines(self, group: NodeGroupSpec) -> tuple[MachineInfo, ...]:
        """The group's nodes that exist (a node on its way has no name until it is Ready)."""
        return tuple(MachineInfo(name=n.name, group_id=group.id, provider_id=f"sim://{n.name}",
                                 phase=MachinePhase.DELETING if n.removing else MachinePhase.RUNNING,
                                 node_name=n.name, created_at=n.created_at)
                     for n in self._simulation.nodes() if n.group.id == group.id)

    def add_nodes(self, group: NodeGroupSpec, count: int, key: str) -> None:
        if count <= 0:
            raise ValueError(f"add_nodes for {group.id}: count must be positive, got {count}")
        self._simulation._request_nodes(group.id, count)

    def remove_node(self, group: NodeGroupSpec, node_name: str, key: str) -> None:
        if not any(n.name == node_name and n.group.id == group.id for n in self._simulation.nodes()):
            raise ValueError(f"remove_node for {group.id}: no node {node_name} in the group")
        self._simulation._remove_node(node_name)


class SimulatedNodes:
    """The applier's node writes (dds.controller.apply.NodeWriter) on the simulation's own nodes. A reservation's taint,
    a claim's and a ProvisioningRequest's booking are the node's `reserved_for`, `claimed_by` and `booked_for` (what
    the snapshot shows as taints); no other taint or label is part of the simulated world, so asking for one is an
    error, not a write that goes nowhere."""

    def __init__(self, simulation: "Simulation") -> None:
        self._simulation = simulation

    def taint(self, node: str, key: str, value: str, effect: str) -> None:
        self._set(node, key, value)

    def untaint(self, node: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None:
        self._set(node, key, None)

    def label(self, node: str, labels: Mapping[str, str]) -> None:
        raise ValueError(f"label {dict(labels)} on {node}: the simulation does not model node labels")

    def work_on(self, node: str) -> list[str]:
        return list(self._simulation._node(node).pods)

    def _set(self, node: str, key: str, token: Optional[str]) -> None:
        target = self._simulation._node(node)
        if key == RESERVATION_TAINT_KEY:
            target.reserved_for = token
        elif key == CLAIM_TAINT_KEY:
            target.claimed_by = token
        elif key == BOOKED_TAINT_KEY:
            target.booked_for = token
        else:
            raise ValueError(f"taint {key} on {node}: the simulation models only {RESERVATION_TAINT_KEY}, "
                             f"{CLAIM_TAINT_KEY} and {BOOKED_TAINT_KEY}")


class Simulation:
    def __init__(self, scenario: Scenario, policy: Policy, *, progress: Optional[Progress] = None,
                 batch_solver: str = "greedy", exhaustive: bool = False,
                 reservations: ReservationConfig = ReservationConfig(enabled=False), moves: bool = False,
                 warm_gpus: int = 0, release_idle: bool = False) -> None:
        """`warm_gpus`: idle GPUs each group keeps attached past the cooldown and refills after pods take them (the
        warm headroom of dds/planner/headroom.py, as the controller applies it; attach-first policies only).
        `reservations`: when a large pod that waited too long gets a node reserved (attach-first policies only).
        `moves`: release idle GPUs at once when pending pods elsewhere would get them, and keep idle GPUs for one more
        pod on every node with room (dds/planner/moves.py; off by default, and meant for a long idle cooldown: see
        "Placement" in docs/simulation.md).
        `release_idle`: the first half of `moves` alone (the controller's release_idle_gpus).
        `exhaustive`: ask the planner at every step about every pending pod on the whole cluster, without the
        shortcuts that skip questions whose answer cannot change (slow; the reference the shortcuts are tested
        against)."""
        if scenario.kueue is not None and policy.mode == Mode.STATIC:
            raise ValueError(f"policy {policy.name} adds no capacity: nothing would serve the ProvisioningRequests of "
                             f"scenario {scenario.name}'s Kueue jobs (use node-only or an attach-first policy)")
        self.scenario = scenario
        self._exhaustive = exhaustive
        self.policy = policy
        self.now = 0.0
        self._clock = lambda: self.now
        self._timing = scenario.timing
        self._cluster = scenario.cluster
        self._groups = self._planner_groups()
        self._progress = progress
        self._batch_solver = batch_solver
        self._reservations = reservations
        self._warm = (MappingProxyType({p.name: warm_gpus for p in self._cluster.pools}) if policy.moves_gpus and warm_gpus
                      else MappingProxyType({}))
        self._moves = policy.moves_gpus and moves
        self._releases_idle = policy.moves_gpus and (moves or release_idle)  # idle GPUs may move to pending pods
        # The pass the control loop runs (dds/planner/passes.py), set as this policy would set the controller; the
        # simulator stands in for cluster-autoscaler too, so its fast path adds nodes.
        self._memos = PlannerMemos()  # what planning keeps from one decision of this simulation to the next
        self._pass_settings = PassSettings(
            planner=PlannerConfig(policy=policy.planner_policy, batch_solver=batch_solver,
                                  warm_gpus_by_pool=self._warm),
            move_idle_gpus=self._moves, release_idle_gpus=policy.moves_gpus and release_idle,
            reservations=reservations if policy.moves_gpus else ReservationConfig(enabled=False),
            fast_path_adds_nodes=True, gang_aware=policy.gang_aware,
            provisioning=ProvisioningConfig() if scenario.kueue and policy.moves_gpus else ProvisioningConfig(""))
        # Jobs admitted by Kueue through ProvisioningRequests (dds/sim/kueue.py): served by DDS's class under the
        # attach-first policies, by cluster-autoscaler's best-effort-atomic class under node-only.
        self._kueue = Kueue(scenario.kueue) if scenario.kueue is not None else None
        self._gpu_resource = self._groups[0].gpu_resource if self._groups else "nvidia.com/gpu"
        self.fabric = sim_fabric(self._cluster.pools, self._clock, self._timing.attach_s, self._timing.detach_s)
        self._watcher = OperationWatcher(self.fabric, _UNREPORTED, self._clock)
        self._executor = Executor(self.fabric, SimulatedCloud(self), _UNREPORTED)
        self._actions = Actions(self._executor, self._watcher, SimulatedNodes(self))  # the controller's applier
        self.counters = Counters()
        self._idle = IdleTracker()
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._nodes: dict[str, _Node] = {}
        self._node_names = itertools.count()
        self._provisioning: dict[str, int] = {}  # group id -> nodes on their way
        self._pods: dict[str, _Pod] = {}
        self._pending: dict[str, _Pod] = {}  # insertion order = arrival order
        self._ops_in_flight: dict[str, str] = {}  # operation key -> node
        self._ops_due: dict[str, float] = {}  # operation key -> when its latency has passed
        self._op_ids = itertools.count()
        self._node_requests = itertools.count()
        self._last_node_of_device: dict[str, str] = {}
        self._loop_at: Optional[float] = None
        # Binding is incremental: when no capacity appeared since the last scheduler step, every pod that did not fit
        # then still does not, so only the pods that arrived since are offered to the planner.
        self._capacity_changed = False
        self._arrived: list[_Pod] = []
        # The planner is deterministic and scale-up does not read the clock: when nothing moved since the last pass
        # (no arrival, no job end, no operation done, no node come or gone, no action of ours) it would plan the same.
        self._changed_since_scale_up = True
        self._node_infos: dict[str, tuple[tuple, NodeInfo]] = {}
        self._allocatable: dict[tuple[str, int, int], Resources] = {}  # (group, GPUs, CXL chunks) -> allocatable
        self._group_versions: dict[tuple[str, int], NodeGroupSpec] = {}
        self._slot_limits = {p.name: p.max_slots_per_node for p in self._cluster.pools}
        # Changes to the fabric's state that we know of: our calls and our operations seen finished. With faults off
        # nothing else changes it, so listings are read again only when this moves.
        self._fabric_changes = 0
        self._device_listing: Optional[tuple[int, tuple[FabricDevice, ...]]] = None
        self._pool_listing: Optional[tuple[int, tuple[PoolState, ...]]] = None
        self._gpus_held = 0  # attached GPUs not yet released (fixed GPUs are counted from the nodes)
        self._cxl_chunks_held: dict[str, int] = {}  # CXL memory chunks attached, not yet released: device id -> bytes
        self._timeline: list[Sample] = []
        self._finished = 0
        self._gang_members: dict[str, list[_Pod]] = {}
        # Devices attached for gangs that have not started, by device id: GPUs held for pods that cannot run yet.
        self._held_for_gang: dict[str, str] = {}
        self._attach_gangs: dict[str, tuple[str, ...]] = {}  # attach operation key -> the gangs it was for

    @property
    def pass_settings(self) -> PassSettings:
        """The settings of this simulation's decision pass: what a control loop set as this policy would plan with
        (tests hand a snapshot the loop recorded to both)."""
        return self._pass_settings

    # --- setup ---
    def _planner_groups(self) -> tuple[NodeGroupSpec, ...]:
        groups = self._cluster.groups
        if not self.policy.moves_gpus:
            # Without composability nothing is attached: no CXL memory either, and a node is its own memory.
            groups = tuple(without_cxl_memory(g) for g in groups)
        if self.policy.mode == Mode.NODE_ONLY:
            # Without composability a new server is a fixed box: CA's template is the group at its full GPU count.
            return tuple(g.model_copy(update={"initial_gpus": g.max_gpus_per_node}) for g in groups)
        return groups

    def _start_cluster(self) -> None:
        for group in self._groups:
            layout = (concentrated_layout(self._cluster, group.id) if self.policy.layout == Layout.CONCENTRATED
                      else self._cluster.layout(group.id))
            for gpus in layout:
                node = self._add_node(group, fixed_gpus=0 if self.policy.moves_gpus else gpus)
                if self.policy.moves_gpus and gpus:
                    self._preattach(node, gpus)
        self.fabric.tick()
        for device in self.fabric.devices():
            if device.node is not None:
                self._last_node_of_device[device.id] = device.node
                self._gpus_held += 1
        minimums = gang_minimums(self.scenario.jobs)
        for job in self.scenario.jobs:
            pod = _Pod(job, pod_info(job, self._gpu_resource, self._cluster.gpu_model_label,
                                     minimums.get(job.group or "", 0)))
            self._pods[job.name] = pod
            if job.group:
                self._gang_members.setdefault(job.group, []).append(pod)
            self._push(job.arrival_s, _Kind.ARRIVAL, job.name)

    def _preattach(self, node: _Node, gpus: int) -> None:
        """The composable policies start from the same layout as the static one: attached before time 0."""
        group = node.group
        model = group.default_gpu_model or _first_model(self._cluster.pool(group.fabric_pool).devices)
        saved, self.now = self.now, -self._timing.attach_s
        self.fabric.attach(AttachRequest(key=f"preconfigured/{node.name}", node=node.name, pool=group.fabric_pool,
                                         model=model, count=gpus, reason="preconfigured layout"))
        self.now = saved

    def _add_node(self, group: NodeGroupSpec, fixed_gpus: int) -> _Node:
        name = f"{group.id.rsplit('/', 1)[-1]}-{next(self._node_names)}"
        node = _Node(name=name, group=group, created_at=self.now, fixed_gpus=fixed_gpus)
        self._nodes[name] = node
        return node

    def _node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise ValueError(f"the simulation has no node {name} (t={self.now:g}s)")
        return node

    def nodes(self) -> tuple[_Node, ...]:
        """The nodes that exist now."""
        return tuple(self._nodes.values())

    # --- the event loop ---
    def run(self) -> SimResult:
        self._start_cluster()
        total = len(self.scenario.jobs)
        while self._events and not self._stalled():
            t = self._events[0][0]
            self.now = max(self.now, t)
            loop_due = False
            while self._events and self._events[0][0] <= t:
                _, kind, _, payload = heapq.heappop(self._events)
                if kind == _Kind.LOOP:
                    loop_due = loop_due or payload == self._loop_at
                else:
                    self._handle(_Kind(kind), payload)
            self._collect_operations()
            self._kueue_quota()
            if self._capacity_changed or self._arrived:
                self._schedule_pending()
            if loop_due:
                self._loop_at = None
                self._scale()
                self._collect_operations()
                self._kueue_quota()
                if self._capacity_changed or self._arrived:
                    self._schedule_pending()
                self._arm_after_scale()
            self._sample()
            if self._progress is not None:
                self._progress(self._finished, total)
        return self._result()

    def _stalled(self) -> bool:
        """Every job has arrived, none runs, and none has started for STALL_LIMIT_S: what still waits cannot start
        (e.g. a gang larger than the pool) and only idle churn is left, which would go on for ever."""
        # Pods of Kueue jobs not admitted wait too: for quota, or on a request nobody can serve (CA's class never
        # fails one; it gives up after 7 days, processors/provreq/processor.go).
        waiting = len(self._pending) + (self._kueue.unadmitted_pods if self._kueue is not None else 0)
        if not waiting or waiting + self._finished < len(self._pods):
            return False
        if any(p.start_s is not None and p.finish_s is None for p in self._pods.values()):
            return False
        last = max((p.finish_s or 0.0 for p in self._pods.values()), default=0.0)
        last = max(last, max((p.job.arrival_s for p in self._pods.values()), default=0.0))
        return self.now - last > STALL_LIMIT_S

    def _push(self, t: float, kind: _Kind, payload: object) -> None:
        heapq.heappush(self._events, (t, int(kind), next(self._seq), payload))

    def _arm_loop(self, at: float) -> None:
        """Schedule a scale step at the first loop tick at or after `at` (ticks sit on a fixed grid, like a loop's)."""
        if self.policy.mode not in (Mode.DDS, Mode.NODE_ONLY):
            return
        interval = self._timing.loop_interval_s
        tick = math.ceil(round(at / interval, 9)) * interval
        if self._loop_at is not None and self._loop_at <= tick:
            return
        self._loop_at = tick
        self._push(tick, _Kind.LOOP, tick)

    def _handle(self, kind: _Kind, payload: object) -> None:
        self._changed_since_scale_up = True
        if kind == _Kind.ARRIVAL:
            pod = self._pods[str(payload)]
            if self._kueue is not None:
                self._kueue.arrive(pod.job, self.now)  # no pod until Kueue admits the job
            else:
                self._pending[pod.job.name] = pod
                self._arrived.append(pod)
        elif kind == _Kind.FINISH:
            self._finish(self._pods[str(payload)])
        elif kind == _Kind.NODE_READY:
            self._node_ready(str(payload))
        # OPERATION_DUE needs nothing here: `_collect_operations` runs after every batch of events.
        self._arm_loop(self.now)

    def _finish(self, pod: _Pod) -> None:
        node = self._nodes[pod.node] if pod.node else None
        if node is not None:
            node.release(pod)
        pod.finish_s = self.now
        self._finished += 1
        self._capacity_changed = True
        if self._kueue is not None:
            self._kueue.pod_ended(pod.job)

    def _node_ready(self, group_id: str) -> None:
        self._provisioning[group_id] -= 1
        group = next(g for g in self._groups if g.id == group_id)
        fixed = group.max_gpus_per_node if self.policy.mode == Mode.NODE_ONLY else 0
        node = self._add_node(group, fixed_gpus=fixed)
        if self.policy.moves_gpus and group.initial_gpus and group.default_gpu_model:
            # The controller composes a group's initial GPUs into each new node as soon as it is up.
            self._attach(Attach(node=node.name, pool=group.fabric_pool, model=group.default_gpu_model,
                                count=group.initial_gpus, pods=(), reason="initial GPUs"), Case.SCALE_UP)
        self._capacity_changed = True

    # --- scheduler step: bind what fits now, using the planner's own fit logic ---
    def _schedule_pending(self) -> None:
        candidates = (list(self._pending.values()) if self._capacity_changed
                      else self._with_gang_mates([p for p in self._arrived if p.job.name in self._pending]))
        self._capacity_changed = False
        self._arrived.clear()
        if self._exhaustive:
            candidates, roomy = list(self._pending.values()), set(self._nodes)
        else:
            candidates, roomy = self._with_room_somewhere(candidates)
        if not candidates:
            return
        self.counters.scheduler_steps += 1
        # Only nodes with room for at least one candidate can take one (sim pods carry no affinity to other pods), so
        # the planner is shown just those: a busy cluster costs it a few nodes, not all of them.
        snapshot = self._snapshot(capacity_to_come=False, only=roomy)
        # groups=(): no attach and no new node is considered, so pods that do not fit now are rejected cheaply.
        config = PlannerConfig(policy=self.policy.planner_policy, batch_solver="greedy", allow_new_nodes=False,
                               groups=())
        plan = plan_scale_up(snapshot, config, [p.info for p in candidates], memos=self._memos)
        for decision in plan.decisions:
            if decision.verdict == Verdict.FITS_NOW and decision.node is not None:
                self._bind(self._pods[decision.pod.partition("/")[2]], decision.node)

    def _with_gang_mates(self, pods: list[_Pod]) -> list[_Pod]:
        """A gang is judged whole: a member arriving brings its pending mates back to the scheduler."""
        groups = {p.job.group for p in pods if p.job.group}
        if not groups:
            return pods
        chosen = {p.job.name: p for p in pods}
        for group in sorted(groups):
            for mate in self._gang_members[group]:
                if mate.job.name in self._pending:
                    chosen.setdefault(mate.job.name, mate)
        return sorted(chosen.values(), key=lambda p: (p.job.arrival_s, p.job.name))

    def _with_room_somewhere(self, pods: list[_Pod]) -> tuple[list[_Pod], set[str]]:
        """The pods whose raw cpu/memory/GPU request some node has free, and those nodes. Only a necessary condition
        (taints, selectors and the rest stay the planner's to judge): it spares the planner work that cannot bind."""
        online: dict[str, int] = {}
        memory_attached: dict[str, int] = {}
        for device in self._devices():
            if device.node is not None and device.state == DeviceState.ONLINE:
                if is_cxl_model(device.model):
                    memory_attached[device.node] = memory_attached.get(device.node, 0) + (chunk_bytes(device.model)
                                                                                          or 0)
                else:
                    online[device.node] = online.get(device.node, 0) + 1
        room = []
        for node in self._nodes.values():
            if node.removing:
                continue
            cpu = node.group.milli_cpu - node.used_cpu
            memory = node.group.memory + memory_attached.get(node.name, 0) - node.used_memory
            gpus = node.fixed_gpus + online.get(node.name, 0) - node.used_gpus
            if len(node.pods) < node.group.max_pods:
                room.append((node.name, cpu, memory, gpus))
        hosts: dict[tuple[int, int, int], list[str]] = {}  # jobs come in few shapes: judge each shape once
        kept = []
        for pod in pods:
            shape = (pod.job.milli_cpu, pod.job.memory, pod.job.gpus)
            if shape not in hosts:
                hosts[shape] = [n for n, c, m, g in room if shape[0] <= c and shape[1] <= m and shape[2] <= g]
            if hosts[shape]:
                kept.append(pod)
        return kept, {name for names in hosts.values() for name in names}

    def _bind(self, pod: _Pod, node_name: str) -> None:
        node = self._nodes[node_name]
        del self._pending[pod.job.name]
        pod.node, pod.start_s = node_name, self.now
        pod.info = replace(pod.info, node_name=node_name)
        node.bind(pod)
        if pod.job.group:
            self._held_for_gang = {d: g for d, g in self._held_for_gang.items() if g != pod.job.group}
        for other in self._nodes.values():
            token = pod_token(pod.info)
            if token in (other.reserved_for, other.claimed_by):
                # The edge lifts the reservation's taints as soon as it sees the pod bound.
                other.reserved_for = None if other.reserved_for == token else other.reserved_for
                other.claimed_by = None if other.claimed_by == token else other.claimed_by
                self._capacity_changed = True
        self._push(self.now + pod.job.duration_s, _Kind.FINISH, pod.job.name)
        self._arm_loop(self.now)  # idleness changed

    # --- scale step: the production planner decides, the fabric and provisioner act ---
    def _scale(self) -> None:
        """One pass of the control loop: `plan_pass` decides (the function `dds serve` runs), this carries the plan
        out in the order the controller does (dds/controller/loop.py), then finishes the removals under way."""
        self.counters.scale_steps += 1
        self._observe_idleness()
        self._ca_provision()
        plan = self._plan_pass(self._snapshot(capacity_to_come=True))
        if self._provision(plan.provisioning):
            # As the controller: what the requests took is seen before anything else is decided.
            plan = self._plan_pass(self._snapshot(capacity_to_come=True), provisioning=plan.provisioning)
        if self._reserve(plan.reservations):
            # As the controller: what the reservations changed is seen before anything else is decided.
            plan = self._plan_pass(self._snapshot(capacity_to_come=True), plan.reservations, plan.provisioning)
        if not self._serve_pending(plan):
            for step in plan.room_headroom + plan.warm_refill:
                self._attach(step, Case.WARM_HEADROOM)
        for step in plan.moves:
            if self._detach(step, Case.FAST_PATH):
                self._changed_since_scale_up = True
        self._scale_down(plan)
        self._finish_removals()

    def _plan_pass(self, snapshot: Snapshot, reservations: Optional[ReservationPlan] = None,
                   provisioning: Optional[ProvisioningPlan] = None) -> PassPlan:
        pending = tuple(p.info for p in self._pending.values())
        # The scale-up is skipped when it cannot change anything (see "Shortcuts" in docs/simulation.md).
        scale_up = bool(pending) and (self._exhaustive or (self._changed_since_scale_up
                                                           and self._scale_up_could_act()))
        if scale_up:
            self._changed_since_scale_up = False
        waiting = pending if scale_up else ()
        if self._kueue is not None and not self.policy.moves_gpus:
            # cluster-autoscaler's scale-up leaves the pods that consume a ProvisioningRequest to the request
            # (processors/provreq/pods_filter.go).
            waiting = tuple(p for p in waiting if p.consumes_provisioning_request is None)
        inputs = PassInputs(pending=pending, waiting=waiting, reservations=reservations,
                            scale_down_due=self._exhaustive or self._cooldown_over_somewhere(),
                            provisioning=self._kueue.view() if self._kueue is not None else ProvisioningView(),
                            provisioning_done=provisioning)
        return plan_pass(snapshot, inputs, self._pass_settings, memos=self._memos)

    # --- Kueue: jobs admitted through ProvisioningRequests (dds/sim/kueue.py) ---
    def _kueue_quota(self) -> None:
        """Kueue gives quota to the Workloads that fit it now, each with a new request for the next scale step."""
        if self._kueue is None:
            return
        if self._kueue.take_quota(self.now, lambda name: self._pods[name].info):
            self._arm_loop(self.now)
        retry = self._kueue.next_retry(self.now)
        if retry is not None:
            self._arm_loop(retry)

    def _provision(self, plan: ProvisioningPlan) -> bool:
        """DDS's plan for the requests of its class, carried out as dds/controller/provisioning.py does: bookings
        released and made, tolerations, attaches, new nodes, then the conditions (Kueue admits the jobs provisioned).
        True when the cluster changed (the pass is planned again on it)."""
        if self._kueue is None or not self.policy.moves_gpus:
            return False
        for node in plan.release:
            if node in self._nodes:
                self._actions.untaint(node, BOOKED_TAINT_KEY)
        for node, uid in plan.book:
            self._actions.taint(node, BOOKED_TAINT_KEY, uid, BOOKED_EFFECT)
        for key, uid in plan.tolerate:
            pod = self._pods[key.partition("/")[2]]
            pod.info = replace(pod.info, tolerations=pod.info.tolerations + (booking_toleration(uid),))
        for step in plan.attaches:
            self._attach(step, Case.PROVISIONING)
        for new in plan.new_nodes.new_nodes if plan.new_nodes is not None else ():
            group = next(g for g in self._groups if g.id == new.group)
            self._actions.add_nodes(new, group, f"nodes/{next(self._node_requests)}", Case.PROVISIONING)
        for workload in self._kueue.apply(plan.decisions, self.now):
            self._admit(workload)
        if plan.changes_cluster or plan.tolerate:
            self._capacity_changed = self._changed_since_scale_up = True
        return plan.changes_cluster

    def _ca_provision(self) -> None:
        """Under node-only, cluster-autoscaler's best-effort-atomic class: one request per loop (dds/sim/kueue.py)."""
        if self._kueue is None or self.policy.moves_gpus:
            return
        workload = self._kueue.pending_ca(self.now)
        if workload is None or workload.request is None:
            return
        plan = ca_atomic_scale_up(self._snapshot(capacity_to_come=True), self._pass_settings.planner,
                                  self._kueue.ca_booked(self.now), workload.request, self._memos)
        for new in plan.new_nodes if plan is not None else ():
            group = next(g for g in self._groups if g.id == new.group)
            self._actions.add_nodes(new, group, f"nodes/{next(self._node_requests)}", Case.SCALE_UP)
        if self._kueue.ca_outcome(workload, plan, self.now):
            self._admit(workload)
        elif workload.ca_retry_at is not None:
            self._arm_loop(workload.ca_retry_at)

    def _admit(self, workload: Workload) -> None:
        """Kueue admits the job: all of its pods are created at once, consuming the request."""
        request = workload.request.name if workload.request is not None else None
        for job in workload.jobs:
            pod = self._pods[job.name]
            pod.info = replace(pod.info, created_at=self.now, consumes_provisioning_request=request)
            self._pending[job.name] = pod
            self._arrived.append(pod)
        self._changed_since_scale_up = True
        self._arm_loop(self.now + self._timing.loop_interval_s)  # the next pass tolerates them onto the booking

    def _reserve(self, plan: ReservationPlan) -> bool:
        """The planner's reservations, carried out as the controller would: taint the reserved node and give its pod
        the toleration, release taints of pods no longer waiting, and move GPUs towards the reserved nodes (before
        the scale-up, so they get first claim on the pool). True when anything changed."""
        if plan.is_empty:
            return False
        for reservation in plan.new:  # toleration first, then the taint, then claims and releases, as the controller
            pod = self._pods[reservation.pod.partition("/")[2]]
            if reservation.toleration not in pod.info.tolerations:  # a moved reservation's pod has it
                pod.info = replace(pod.info, tolerations=pod.info.tolerations + (reservation.toleration,))
            self._actions.taint(reservation.node, RESERVATION_TAINT_KEY, reservation.token, RESERVATION_EFFECT)
        claims = dict(plan.claimed)
        for node in self._nodes.values():
            wanted = claims.get(node.name)
            if node.claimed_by is not None and node.claimed_by != wanted:
                self._actions.untaint(node.name, CLAIM_TAINT_KEY)
            if wanted is not None and node.claimed_by != wanted:
                self._actions.taint(node.name, CLAIM_TAINT_KEY, wanted, RESERVATION_EFFECT)
        for name in plan.released:
            if name in self._nodes:
                self._actions.untaint(name, RESERVATION_TAINT_KEY)
        for step in plan.attaches:
            self._attach(step, Case.RESERVATION)
        busy = set(self._ops_in_flight.values())
        for step in plan.detaches:
            if step.node not in busy and self._detach(step, Case.RESERVATION):
                self._idle.reset(step.node)
                busy.add(step.node)
        self._capacity_changed = self._changed_since_scale_up = True  # taints and tolerations changed
        return True

    def _scale_up_could_act(self) -> bool:
        """A scale-up can only attach from a pool with free devices or add a node to a group below its max size.
        When neither exists the planner cannot act, however long the queue: spare it the pass."""
        if self.policy.moves_gpus and any(sum(p.free.values()) for p in self._pools()):
            return True
        if self._releases_idle and any(self._idle.gpus_idle_since(n) is not None for n in self._nodes):
            return True  # an idle GPU may move straight to a pending pod
        live: dict[str, int] = {}
        for node in self._nodes.values():
            live[node.group.id] = live.get(node.group.id, 0) + 1
        return any(live.get(g.id, 0) + self._provisioning.get(g.id, 0) < g.max_size for g in self._groups)

    def _serve_pending(self, plan: PassPlan) -> bool:
        """The fast path's attaches and — the simulator standing in for cluster-autoscaler — its new nodes. Returns
        whether anything was attached (the controller's `_serve_pending_by_attach`: headroom waits for a pass
        without)."""
        fast_path = plan.fast_path
        if fast_path is None:
            return False
        if not fast_path.is_empty:
            self._changed_since_scale_up = True
        for step in fast_path.device_attaches:  # GPUs and CXL memory chunks alike, as the controller's fast path
            gangs = tuple(sorted({g for g in (self._pods[k.partition("/")[2]].job.group for k in step.pods) if g}))
            self._attach(step, Case.FAST_PATH, gangs if not is_cxl_model(step.model) else ())
        for new in fast_path.new_nodes:
            group = next(g for g in self._groups if g.id == new.group)
            self._actions.add_nodes(new, group, f"nodes/{next(self._node_requests)}", Case.SCALE_UP)
        return bool(fast_path.device_attaches)

    def _request_nodes(self, group_id: str, count: int) -> None:
        """The simulated cloud takes the order: each node is Ready after the provisioning time."""
        self._provisioning[group_id] = self._provisioning.get(group_id, 0) + count
        self.counters.nodes_added += count
        for _ in range(count):
            self._push(self.now + self._timing.node_provision_s, _Kind.NODE_READY, group_id)

    def _remove_node(self, name: str) -> None:
        """The simulated cloud deletes the machine: the node is gone at once."""
        del self._nodes[name]
        self.counters.nodes_removed += 1
        self._changed_since_scale_up = True

    def _attach(self, step: Attach, case: Case, gangs: tuple[str, ...] = ()) -> None:
        key = f"attach/{next(self._op_ids)}"
        self._fabric_changes += 1
        try:
            operation = self._actions.attach(step, key, case, on_done=self._operation_done)
        except FabricError:
            # A malformed request (unknown pool or model): the planner and the scenario disagree. Count it, replan.
            self.counters.attach_failures += 1
            return
        if operation.state == OperationState.FAILED:
            # Refused on acceptance (too few free devices, no slot): the fabric records it as failed at once. The
            # planner only plans what the pool holds, so this too means the two disagree: count it, replan later.
            # The watcher records the refusal now, as the controller's does on its next poll; nothing is in flight.
            self.counters.attach_failures += 1
            self._watcher.poll((key,))
            return
        self._track(key, step.node, self._timing.attach_s)
        if gangs:
            self._attach_gangs[key] = gangs

    def _cooldown_over_somewhere(self) -> bool:
        """Whether some node's GPUs or the node itself have been idle past their cooldown: the planner releases nothing
        before that (a necessary condition only; what goes is the planner's decision)."""
        for node in self._nodes.values():
            for since in (self._idle.gpus_idle_since(node.name), self._idle.cxl_idle_since(node.name)):
                if since is not None and since + node.group.gpu_idle_cooldown_seconds <= self.now:
                    return True
            empty = self._idle.empty_since(node.name)
            if empty is not None and empty + node.group.node_idle_cooldown_seconds <= self.now:
                return True
        return False

    def _scale_down(self, plan: PassPlan) -> None:
        busy = set(self._ops_in_flight.values())
        for step in plan.scale_down.detaches:
            if step.node in busy:
                continue  # one operation per node at a time, as the controller does
            if self._detach(step, Case.SCALE_DOWN_BLOCKED):
                self._idle.reset(step.node)
                busy.add(step.node)
        for removal in plan.scale_down.removals:
            node = self._nodes.get(removal.node)
            if node is not None and not node.pods:
                node.removing = True  # cordoned: nothing new lands; removed once its GPUs are released

    def _detach(self, step: Detach, case: Case) -> bool:
        key = f"detach/{next(self._op_ids)}"
        self._fabric_changes += 1
        if self._actions.detach(step, key, case, on_done=self._operation_done) is None:
            return False  # refused, e.g. a device went away meanwhile; the next scale step looks again
        self._track(key, step.node, self._timing.detach_s)
        return True

    def _finish_removals(self) -> None:
        """A node being removed releases its GPUs first; it goes once none is left on it."""
        busy = set(self._ops_in_flight.values())
        for node in [n for n in self._nodes.values() if n.removing]:
            if node.name in busy:
                continue
            devices = [d for d in self._devices() if d.node == node.name]
            online = tuple(d.id for d in devices if d.state == DeviceState.ONLINE)
            if online:
                self._detach(Detach(node=node.name, device_ids=online, reason="the node is being removed"),
                             Case.SCALE_DOWN_BLOCKED)
            elif not devices:
                removal = RemoveNode(node=node.name, group=node.group.id, reason="its GPUs are released and it holds "
                                                                                 "no work")
                self._actions.remove_node(removal, node.group, f"remove/{node.name}", Case.SCALE_DOWN_BLOCKED)

    def _track(self, key: str, node: str, latency_s: float) -> None:
        """Follow an operation; look at it again when its latency has passed (the scale step polls it after that)."""
        self._ops_in_flight[key] = node
        self._ops_due[key] = self.now + latency_s
        self._push(self.now + latency_s, _Kind.OPERATION_DUE, key)

    def _collect_operations(self) -> None:
        due = [key for key, at in self._ops_due.items() if at <= self.now]  # not due yet: cannot be done
        if due:
            self._watcher.poll(frozenset(due))  # calls `_operation_done` for each that ended

    def _operation_done(self, operation: Operation) -> None:
        key = operation.key
        node = self._ops_in_flight.get(key)
        if node is None:
            return  # refused when asked: counted then, never in flight
        if operation.error is not None and operation.error.code == ErrorCode.NOT_FOUND:
            # The watcher's word for an operation the fabric forgot. The fabric keeps finished operations for an hour
            # (and the last 1,000) and this one is read the instant it is due, so the two clocks disagree: stop.
            raise RuntimeError(f"simulation at t={self.now:g}s: the fabric no longer knows operation {key} on {node}")
        del self._ops_in_flight[key]
        del self._ops_due[key]
        self._fabric_changes += 1
        self._changed_since_scale_up = True
        if operation.kind == OperationKind.ATTACH and is_cxl_model(operation.model):
            self.counters.cxl_chunks_attached += len(operation.devices)
            size = chunk_bytes(operation.model) or 0
            self._cxl_chunks_held.update((device_id, size) for device_id in operation.devices)
            if operation.state == OperationState.FAILED:
                self.counters.attach_failures += 1
            self._capacity_changed = True
        elif operation.kind == OperationKind.ATTACH:
            self.counters.gpus_attached += len(operation.devices)
            for device_id in operation.devices:
                previous = self._last_node_of_device.get(device_id)
                if previous is not None and previous != node:
                    self.counters.gpus_reallocated += 1
                self._last_node_of_device[device_id] = node
            if operation.state == OperationState.FAILED:
                self.counters.attach_failures += 1
            self._gpus_held += len(operation.devices)
            self._hold_for_gangs(key, operation.devices)
            self._capacity_changed = True
        else:
            chunks = [d for d in operation.devices if d in self._cxl_chunks_held]
            for device_id in chunks:
                del self._cxl_chunks_held[device_id]
            self.counters.cxl_chunks_detached += len(chunks)
            self.counters.gpus_detached += len(operation.devices) - len(chunks)
            self._gpus_held -= len(operation.devices) - len(chunks)
            for device_id in operation.devices:
                self._held_for_gang.pop(device_id, None)
        self._arm_loop(self.now)

    def _hold_for_gangs(self, key: str, devices: Sequence[str]) -> None:
        """Devices attached for a gang that has not started yet are held for it (stranded while it cannot start)."""
        waiting = [g for g in self._attach_gangs.pop(key, ()) if self._gang_waiting(g)]
        if waiting:
            for device_id in devices:
                self._held_for_gang[device_id] = waiting[0]

    def _gang_waiting(self, group: str) -> bool:
        return any(p.start_s is None for p in self._gang_members.get(group, ()))

    def _stranded_gpus(self) -> int:
        """GPUs attached for gangs that have not started and that no running pod uses (per node: at most its idle)."""
        if not self._held_for_gang:
            return 0
        held: dict[str, int] = {}
        for device in self._devices():
            if device.node is not None and device.id in self._held_for_gang:
                held[device.node] = held.get(device.node, 0) + 1
        online = self._online_devices()
        total = 0
        for name, count in held.items():
            node = self._nodes.get(name)
            if node is not None:
                idle = node.fixed_gpus + len(online.get(name, ())) - node.used_gpus
                total += max(0, min(count, idle))
        return total

    def _arm_after_scale(self) -> None:
        """Keep stepping while something is on its way; otherwise sleep until a cooldown can expire."""
        busy = (self._ops_in_flight or any(self._provisioning.values())
                or any(n.removing for n in self._nodes.values()))
        if busy:
            self._arm_loop(self.now + self._timing.loop_interval_s)
            return
        expiry = self._next_cooldown_expiry()
        if expiry is not None:
            self._arm_loop(max(expiry, self.now + self._timing.loop_interval_s))

    def _next_cooldown_expiry(self) -> Optional[float]:
        times = []
        for node in self._nodes.values():
            for since in (self._idle.gpus_idle_since(node.name), self._idle.cxl_idle_since(node.name)):
                if since is not None:  # idle GPUs and spare CXL memory share the group's cooldown
                    times.append(since + node.group.gpu_idle_cooldown_seconds)
            empty = self._idle.empty_since(node.name)
            if empty is not None and self._above_min(node.group):
                times.append(empty + node.group.node_idle_cooldown_seconds)
        if self.policy.moves_gpus and self._reservations.enabled:
            # A large pod may become old enough for a reservation: the planner is asked again then.
            times += [p.info.created_at + age for p in self._pending.values() if p.job.gpus
                      for age in {earliest_reservation_age(self._reservations), self._reservations.min_age_seconds}]
        # An expiry already past that the planner did not act on will not be acted on until something changes (and
        # every change arms the loop again): waiting for it would tick for ever.
        future = [t for t in times if t > self.now]
        return min(future) if future else None

    def _above_min(self, group: NodeGroupSpec) -> bool:
        return sum(1 for n in self._nodes.values() if n.group.id == group.id and not n.removing) > group.min_size

    # --- the planner's view ---
    def _observe_idleness(self) -> None:
        grouped = devices_by_node(self._devices())
        online, memory = grouped.online, grouped.cxl_online
        self._idle.observe([NodeUsage(name=n.name, fabric_gpus=len(online.get(n.name, ())), used_gpus=n.used_gpus,
                                      has_work=bool(n.pods), spare_cxl_chunks=_spare_chunks(n, memory.get(n.name, ())))
                            for n in self._nodes.values()], self.now)

    def _devices(self) -> tuple[FabricDevice, ...]:
        """The fabric's devices, listed again only when the fabric changed."""
        key = self._fabric_changes
        if self._device_listing is None or self._device_listing[0] != key:
            self._device_listing = (key, self.fabric.devices())
        return self._device_listing[1]

    def _pools(self) -> tuple[PoolState, ...]:
        """The fabric's pools, read again only when the fabric changed."""
        key = self._fabric_changes
        if self._pool_listing is None or self._pool_listing[0] != key:
            self._pool_listing = (key, self.fabric.pools())
        return self._pool_listing[1]

    def _online_devices(self) -> dict[str, list[Device]]:
        return devices_by_node(self._devices()).online

    def _snapshot(self, capacity_to_come: bool, only: Optional[set[str]] = None) -> Snapshot:
        """Now as the cluster would show it. Without capacity to come: what a pod could be bound to this instant.
        `only`: just these nodes (and their pods)."""
        grouped = devices_by_node(self._devices())
        online, detaching = grouped.online, grouped.detaching
        attaching: dict[str, int] = {}
        cxl_attaching: dict[str, int] = {}
        if capacity_to_come:
            for key, node in self._ops_in_flight.items():
                operation = self.fabric.operation(key)
                if operation is not None and operation.kind == OperationKind.ATTACH and not operation.state.done:
                    into = cxl_attaching if is_cxl_model(operation.model) else attaching
                    into[node] = into.get(node, 0) + operation.requested
        shown = [n for n in self._nodes.values() if only is None or n.name in only]
        nodes = tuple(self._node_info(n, online.get(n.name, []), detaching.get(n.name, []), attaching.get(n.name, 0),
                                      grouped.cxl_online.get(n.name, []), cxl_attaching.get(n.name, 0))
                      for n in shown)
        pods = tuple(p.info for n in shown for p in n.pods.values()) + tuple(p.info for p in self._pending.values())
        # The pools are always shown; when nothing may be drawn from them (binding, fixed-GPU policies) as empty. CXL
        # memory is counted apart from the GPUs, in bytes, as the controller's observer shows it.
        drawable = capacity_to_come and self.policy.moves_gpus
        pools = []
        for pool in self._pools():
            free = pool.free if drawable else {m: 0 for m in pool.total}
            pools.append(PoolInfo(pool.name, {m: c for m, c in free.items() if not is_cxl_model(m)},
                                  max_slots_per_node=self._slot_limits.get(pool.name),
                                  free_cxl_memory=cxl_memory_of(free)))
        upcoming = {g: c for g, c in self._provisioning.items() if c > 0} if capacity_to_come else {}
        return Snapshot(now=self.now, nodes=nodes, pods=pods, groups=self._groups_as_now(), pools=tuple(pools),
                        upcoming_nodes=upcoming, gpu_model_label=self._cluster.gpu_model_label)

    def _groups_as_now(self) -> tuple[NodeGroupSpec, ...]:
        """The groups with `replicas` = their live nodes (nodes on their way are `upcoming_nodes`, counted apart)."""
        live: dict[str, int] = {}
        for node in self._nodes.values():
            live[node.group.id] = live.get(node.group.id, 0) + 1
        out = []
        for group in self._groups:
            key = (group.id, live.get(group.id, 0))
            cached = self._group_versions.get(key)
            if cached is None:
                cached = self._group_versions[key] = group.model_copy(update={"replicas": key[1]})
            out.append(cached)
        return tuple(out)

    def _node_info(self, node: _Node, devices: list[Device], detaching: list[str], attaching: int,
                   chunks: list[Device], chunks_attaching: int) -> NodeInfo:
        # Most nodes do not change between two steps: reuse the NodeInfo built last time when nothing it holds moved.
        key = (tuple(d.id for d in devices), tuple(detaching), attaching, node.removing, node.reserved_for,
               node.claimed_by, node.booked_for, self._idle.gpus_idle_since(node.name),
               self._idle.empty_since(node.name),
               tuple(d.id for d in chunks), chunks_attaching, self._idle.cxl_idle_since(node.name))
        cached = self._node_infos.get(node.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        info = self._build_node_info(node, devices, detaching, attaching, chunks, chunks_attaching)
        self._node_infos[node.name] = (key, info)
        return info

    def _build_node_info(self, node: _Node, devices: list[Device], detaching: list[str], attaching: int,
                         chunks: list[Device], chunks_attaching: int) -> NodeInfo:
        group = node.group
        gpus = node.fixed_gpus + len(devices)
        # The node shows its CXL memory as soon as the chunks are online (the kwok node side DDS writes does the same).
        allocatable = self._allocatable.get((group.id, gpus, len(chunks)))
        if allocatable is None:
            allocatable = self._allocatable[(group.id, gpus, len(chunks))] = group.node_allocatable(gpus, len(chunks))
        labels = dict(group.labels)
        labels[HOSTNAME_LABEL] = node.name
        model = devices[0].model if devices else (group.default_gpu_model if node.fixed_gpus else None)
        if model and gpus:
            labels[self._cluster.gpu_model_label] = model  # what GPU feature discovery would label
        return NodeInfo(
            name=node.name, provider_id=f"sim://{node.name}", group_id=group.id, labels=labels,
            taints=_reservation_taints(node),
            unschedulable=node.removing, allocatable=allocatable, gpu_resource=group.gpu_resource,
            devices=tuple(sorted(devices, key=lambda d: (d.attached_at, d.id))), attaching=attaching,
            detaching=tuple(detaching), created_at=node.created_at,
            gpus_idle_since=self._idle.gpus_idle_since(node.name), empty_since=self._idle.empty_since(node.name),
            being_deleted=node.removing, cxl_chunks=tuple(sorted(chunks, key=lambda d: (d.attached_at, d.id))),
            cxl_attaching=chunks_attaching, cxl_idle_since=self._idle.cxl_idle_since(node.name))

    # --- results ---
    def _sample(self) -> None:
        sample = Sample(t_s=self.now, gpus_used=sum(n.used_gpus for n in self._nodes.values()),
                        gpus_present=self._gpus_held + sum(n.fixed_gpus for n in self._nodes.values()),
                        pending=len(self._pending), nodes=len(self._nodes), gpus_stranded=self._stranded_gpus(),
                        cxl_memory=sum(self._cxl_chunks_held.values()))
        if self._timeline and self._timeline[-1].t_s == sample.t_s:
            self._timeline[-1] = sample
        elif not self._timeline or replace(self._timeline[-1], t_s=sample.t_s) != sample:
            self._timeline.append(sample)

    def _result(self) -> SimResult:
        jobs = tuple(JobRecord(name=p.job.name, arrival_s=p.job.arrival_s, gpus=p.job.gpus, start_s=p.start_s,
                               finish_s=p.finish_s, node=p.node) for p in self._pods.values())
        workloads = () if self._kueue is None else self._kueue.records({p.job.name: p.start_s
                                                                         for p in self._pods.values()})
        return SimResult(scenario=self.scenario.name, policy=self.policy.name, jobs=jobs,
                         timeline=tuple(self._timeline), counters=self.counters, end_s=self.now,
                         total_pool_gpus=self._cluster.total_gpus(), workloads=workloads)


def sim_fabric(pools: Sequence[PoolSpec], clock: Callable[[], float], attach_s: float, detach_s: float
               ) -> SimulatedFabric:
    """The production simulated fabric on the simulator's virtual clock, so a simulation runs the fabric code DDS ships.

    Latencies are fixed (a distribution whose min is its max) and faults off: the engine does not model an operator
    retrying failed or hung operations, and policy comparisons should not depend on fault draws. The seed only fixes
    the state's salt (nothing random is drawn that can change an outcome without faults)."""
    settings = SimulatedFabricSettings(pools=list(pools), attach_latency=LatencySpec(min=attach_s, max=attach_s),
                                       detach_latency=LatencySpec(min=detach_s, max=detach_s), faults=FaultSpec(seed=0))
    return SimulatedFabric(settings, clock=clock, name="sim", persist=False)


def pod_info(job: Job, gpu_resource: str, gpu_model_label: str, group_min: int = 0) -> PodInfo:
    """A job as the pod the planner sees: one container, a Job owner, created when it arrives; a gang's jobs carry
    the coscheduling label and their PodGroup's minMember (`group_min`)."""
    scalar = {gpu_resource: job.gpus} if job.gpus else {}
    selector = {gpu_model_label: job.gpu_model} if job.gpu_model else {}
    labels = {POD_GROUP_LABEL: job.group} if job.group else {}
    return PodInfo(namespace=POD_NAMESPACE, name=job.name, uid=f"sim-{job.name}", labels=labels,
                   containers=(ContainerRequests(Resources(milli_cpu=job.milli_cpu, memory=job.memory,
                                                           scalar=scalar)),),
                   owner_kind="Job", created_at=job.arrival_s, node_selector=selector, pod_group=job.group,
                   pod_group_min_member=group_min if job.group else 0)


def _reservation_taints(node: _Node) -> tuple[Taint, ...]:
    taints = []
    if node.reserved_for is not None:
        taints.append(reservation_taint(node.reserved_for))
    if node.claimed_by is not None:
        taints.append(claim_taint(node.claimed_by))
    if node.booked_for is not None:
        taints.append(Taint(key=BOOKED_TAINT_KEY, value=node.booked_for, effect=BOOKED_EFFECT))
    return tuple(taints)


def _first_model(devices: dict[str, int]) -> str:
    return sorted(m for m in devices if not is_cxl_model(m))[0]


def _spare_chunks(node: _Node, chunks: Sequence[Device]) -> int:
    """How many of the node's CXL memory chunks its pods' requests do not need (what the controller's observer counts
    as spare: dds/controller/observe.py)."""
    size = node.group.cxl_memory_chunk
    if not chunks or not size:
        return 0
    return unneeded_chunks(len(chunks), size, node.group.memory + len(chunks) * size, node.used_memory)


def simulate(scenario: Scenario, policy: Policy, progress: Optional[Progress] = None, batch_solver: str = "greedy",
             exhaustive: bool = False, reservations: ReservationConfig = ReservationConfig(enabled=False),
             moves: bool = False, warm_gpus: int = 0, release_idle: bool = False) -> SimResult:
    return Simulation(scenario, policy, progress=progress, batch_solver=batch_solver, exhaustive=exhaustive,
                      reservations=reservations, moves=moves, warm_gpus=warm_gpus, release_idle=release_idle).run()
