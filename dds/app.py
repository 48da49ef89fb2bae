"""DDS in a cluster: every part built from one Settings object and wired together (what `dds serve --kubeconfig` runs).

    cluster-autoscaler --gRPC--> provider (registry, LeaderGate) --> PlannerScaleUp / PlannerScaleDown --+
                                                                                                        v
    Controller loop (cases 2 and 4) --> ClusterObserver (snapshot) --> planner --> Executor --> fabric / MachineSets

Only the leader acts: the controller loop checks `is_leader` every pass, the gRPC gate answers UNAVAILABLE on a standby,
and losing the lease ends the process (exit code 1, client-go's convention) so it restarts as a clean standby. Every
replica is Ready once it can serve; the leader labels its own Pod (dds/kube/leader_label.py) and the Service selects
that label, so cluster-autoscaler reaches the leader.
A standby becoming the leader first re-reads the state the previous leader kept outside the process (in-flight instances,
the fabric backend's operations): what it read when it started is as old as the standby itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence

from dds.config import FabricBackend, Settings
from dds.controller.apply import Actions
from dds.controller.ca_requests import PlannerScaleDown, PlannerScaleUp
from dds.controller.dra_binding import PoolModeBinder
from dds.controller.executor import Executor, OperationWatcher
from dds.controller.gpu_label import GpuLabelKeeper
from dds.controller.repair import DeviceRepair
from dds.controller.idle import IdleTracker
from dds.controller.loop import ClusterPorts, Controller, LoopConfig
from dds.controller.node_claims import NodeClaimReporter
from dds.controller.machine_hooks import PreTerminateHooks
from dds.controller.observe import ClusterObserver
from dds.controller.pod_groups import watched_gangs
from dds.fabric.base import Fabric, ResumableFabric
from dds.fabric.factory import (ALLOW_NON_KWOK_NODES_ADVICE, build_fabric, refuse_simulation_on_real_nodes,
                                 require_fabric_choice)
from dds.kube.authn import ApiserverAuthorizer
from dds.kube.cache import CachedMachineSetLister, ClusterCache, cluster_cache, provisioning_served
from dds.kube.composability import WATCHED as COMPOSABILITY_OBJECTS
from dds.kube.controller_ports import KubeClusterReader, KubePoolBindingWriter
from dds.kube import ApiClient
from dds.kube.events import KubeEventRecorder
from dds.kube.leader import LeaderElector, default_identity
from dds.kube.leader_label import LeaderPodLabel
from dds.kube.machinesets import MachineSetLister
from dds.kube.nodes import KubeNodeWriter, gpu_capacity_hook, read_node_labels
from dds.kube.podgroups import PodGroupReader
from dds.kube.pods import ReservationWrites
from dds.kube.provisioning import ProvisioningRequestReader, ProvisioningRequestWriter
from dds.kube.requests import instrument
from dds.kube.resourceslices import ResourceSlicePublisher, online_gpus, with_resource_slices
from dds.kube.configmap import INSTANCES_CONFIGMAP
from dds.kube.state import ConfigMapStateStore
from dds.planner.reservations import ReservationConfig
from dds.planner.provisioning import ProvisioningConfig
from dds.model.groups import DEFAULT_GPU_RESOURCE, LABEL_NODE_GROUP, NodeGroupSpec
from dds.nodes.factory import build_node_backend
from dds.nodes.machineset import MachineSetProvisioner
from dds.ops.http import OpsServer, build_ops_server, check_metrics_settings
from dds.planner import plan_scale_up
from dds.planner.dra import CelLimits
from dds.model.plan import Detach, PlannerConfig
from dds.scaling.instances import InstanceFactory, InstanceTracker
from dds.provider.leadership import LeaderGate
from dds.scaling.requests import LiveNode
from dds.provider.registry import Registry
from dds.provider.server import ProviderServer, build_server
from dds.groups.sources import MachineSetSource
from dds.groups.catalog import NodeGroupCatalog
from dds.groups.labels import node_group_label_value
from dds.heap import HeapKeeper

log = logging.getLogger(__name__)



def planner_config(settings: Settings) -> PlannerConfig:
    return PlannerConfig(policy=settings.policy, batch_solver=settings.batch_solver,
                         solver_time_budget_seconds=settings.solver_time_budget_seconds,
                         warm_gpus_by_pool={p.name: p.warm_gpus for p in settings.fabric_pools},
                         cdi_operator=settings.fabric == FabricBackend.COMPOSABILITY_REQUEST)


def cel_limits(settings: Settings) -> CelLimits:
    return CelLimits(max_expression_length=settings.cel_max_expression_length,
                     evaluations_per_pass=settings.cel_evaluations_per_pass,
                     seconds_per_pass=settings.cel_seconds_per_pass)


class ObservedClusterView:
    """The registry's view of live nodes and their groups (through Cluster API Machines), cached for `max_age`.

    CA calls NodeGroupForNode once per node per loop; one list of Nodes and Machines per `max_age` serves them all.
    """

    def __init__(self, observer: ClusterObserver, api: ApiClient, clock: Callable[[], float],
                 max_age_seconds: float = 1.0) -> None:
        self._observer = observer
        self._clock = clock
        self._max_age = max_age_seconds
        self._lock = threading.Lock()
        # (read at, nodes), one attribute: CA's thousands of calls a scan read it whole, without the lock, while fresh.
        self._view: Optional[tuple[float, tuple[LiveNode, ...]]] = None
        # node name -> (the record it was built from, its group, the LiveNode): the watch cache hands over the same
        # record until the node changes, so a view over thousands of nodes builds again only the changed ones.
        self._built: dict[str, tuple[object, Optional[str], LiveNode]] = {}

    def nodes(self) -> Sequence[LiveNode]:
        view = self._view
        if view is not None and self._clock() - view[0] < self._max_age:
            return view[1]
        with self._lock:
            view, now = self._view, self._clock()
            if view is None or now - view[0] >= self._max_age:
                last = view[1] if view is not None else ()
                try:
                    view = self._view = (now, self._read(last))
                except Exception as exc:  # keep the last good view: an apiserver blip must not fail CA's loop
                    log.warning("cannot list nodes and machines, serving the view from %s: %s",
                                "never" if view is None else f"{now - view[0]:.0f}s ago", exc)
            return view[1] if view is not None else ()

    def _read(self, last_nodes: tuple[LiveNode, ...]) -> tuple[LiveNode, ...]:
        machines = self._observer.machines()
        # A node's group through its Machine's status.nodeRef (dds/controller/observe.py machine_refs): never the
        # Machine's spec.providerID, which whoever creates a Machine writes.
        group_of_node = {m.node_name: m.group_id for m in machines if m.node_name}
        out = []
        built, last = {}, self._built
        for node in self._observer.node_records():  # the watch cache once synced: no LIST per CA loop
            group_id = group_of_node.get(node.name)
            found = last.get(node.name)
            if found is not None and found[0] is node and found[1] == group_id:
                live = found[2]
            else:
                live = LiveNode(name=node.name, provider_id=node.provider_id, group_id=group_id, ready=node.ready,
                                labels=dict(node.labels))
            built[node.name] = (node, group_id, live)
            out.append(live)
        self._built = built
        if len(out) == len(last_nodes) and all(new is old for new, old in zip(out, last_nodes)):
            # Nothing changed: the same tuple, so the registry's membership index built from it stays valid.
            return last_nodes
        return tuple(out)


def gpu_resource_of(api: ApiClient, groups: Callable[[], Sequence[NodeGroupSpec]],
                    cache: Optional[ClusterCache] = None) -> Callable[[str], Optional[str]]:
    """A node's GPU resource name: its group's (through the node-group label); None for a node DDS does not manage
    and for a DRA group's node, whose GPUs are ResourceSlice devices and never node capacity."""

    def resource_of(node_name: str) -> Optional[str]:
        found = _node_group(api, groups, cache, node_name)
        if found is _GONE:
            return DEFAULT_GPU_RESOURCE  # gone: publishing finds it missing and says so
        return found.gpu_resource if isinstance(found, NodeGroupSpec) and not found.gpu_api.dra else None

    return resource_of


def own_memory_of(api: ApiClient, groups: Callable[[], Sequence[NodeGroupSpec]],
                  cache: Optional[ClusterCache] = None) -> Callable[[str], Optional[int]]:
    """A node's own memory (its group's, without CXL memory); None for a node whose group takes no CXL memory, or that
    DDS does not manage, or that is gone."""

    def memory_of(node_name: str) -> Optional[int]:
        found = _node_group(api, groups, cache, node_name)
        return found.memory if isinstance(found, NodeGroupSpec) and found.max_cxl_chunks else None

    return memory_of


def lists_node_local_devices(api: ApiClient, groups: Callable[[], Sequence[NodeGroupSpec]],
                             cache: Optional[ClusterCache] = None) -> Callable[[str], bool]:
    """Whether a node's GPUs are devices of its own ResourceSlice: its group's gpu-api is dra-node-local."""

    def lists(node_name: str) -> bool:
        found = _node_group(api, groups, cache, node_name)
        return isinstance(found, NodeGroupSpec) and found.publishes_own_slices

    return lists


_GONE = object()  # the node no longer exists


def _node_group(api: ApiClient, groups: Callable[[], Sequence[NodeGroupSpec]], cache: Optional[ClusterCache],
                node_name: str) -> object:
    """The node's group (through the node-group label), None for a node DDS does not manage, or _GONE."""
    cached = cache.nodes.reflectors[0].get(node_name) if cache is not None and cache.nodes.synced else None
    labels = cached.labels if cached is not None else read_node_labels(api, node_name)
    if labels is None:
        return _GONE
    label = labels.get(LABEL_NODE_GROUP)
    return next((g for g in groups() if node_group_label_value(g.id) == label), None)


def taint_then(before_detach: Optional[Callable[[Detach], None]], slices: ResourceSlicePublisher
               ) -> Callable[[Detach], None]:
    """The executor's before-detach hook, also tainting the GPUs' devices in the node's ResourceSlice first."""

    def hook(step: Detach) -> None:
        if before_detach is not None:
            before_detach(step)
        slices.taint_for_detach(step.node, step.device_ids)

    return hook


def fresh_groups(catalog: NodeGroupCatalog, clock: Callable[[], float], max_age_seconds: float) -> Callable[[], tuple]:
    """The groups for the controller loop, re-read when older than `max_age` (CA's Refresh re-reads them too, but the
    loop must see new or changed MachineSets even while CA is down)."""
    last = {"at": None}

    def groups() -> tuple:
        now = clock()
        if last["at"] is None or now - last["at"] >= max_age_seconds:
            catalog.refresh()
            last["at"] = now
        return catalog.groups()

    return groups


@dataclass
class App:
    settings: Settings
    api: ApiClient
    fabric: Fabric
    catalog: NodeGroupCatalog
    registry: Registry
    controller: Controller
    server: ProviderServer
    ops: OpsServer
    events: KubeEventRecorder
    elector: Optional[LeaderElector]
    tracker: InstanceTracker
    scale_up: PlannerScaleUp  # what CA's IncreaseSize calls (case 1)
    scale_down: PlannerScaleDown  # what CA's DeleteNodes calls (case 3)
    cache: Optional[ClusterCache] = None  # settings.watch_cache: what every decision reads the cluster from
    leader_label: Optional[LeaderPodLabel] = None  # with leader election: the label the Service selects the leader by
    heap: HeapKeeper = field(default_factory=HeapKeeper)  # the collector kept off the cache's objects (dds/heap.py)
    stopped: threading.Event = field(default_factory=threading.Event)
    # Set once start() is done: the cache's first LIST in, the planner primed, the gRPC server listening. Readiness
    # waits for it, so a Service routes CA to a replica only once it can answer (at 5,000 nodes, 15 s after the
    # process answers HTTP).
    started: threading.Event = field(default_factory=threading.Event)
    exit_code: int = 0

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def start(self) -> None:
        self.ops.start()
        self._start_cache()
        self.catalog.refresh()
        self.server.start()
        if self.elector is None:
            self._start_acting()
        else:
            self.server.set_serving(False)
            if self.leader_label is not None:  # a container restarted in the Pod of a leader is not the leader
                self.leader_label.mark(False)
            self.elector.run_in_thread()
        self.started.set()
        log.info("DDS serving %d node group(s) on %s (fabric %s, metrics on %s)", len(self.catalog.groups()),
                 self.server.address, self.fabric.name, self.settings.metrics_listen)

    def _start_cache(self, sync_timeout_seconds: float = 120.0) -> None:
        """Start the watches and wait for their first LIST (bounded: until then decisions LIST, as without a cache)."""
        if self.cache is None:
            return
        self.cache.start()
        if not self.cache.wait_synced(sync_timeout_seconds):
            log.warning("the cluster cache is not synced after %.0fs: reading the apiserver directly until it is",
                        sync_timeout_seconds)
        self._prime_planner()
        self.heap.settle()  # the LISTs' objects are the bulk of what the process will hold

    def _prime_planner(self) -> None:
        """Observe and plan once before serving. A decision derives per pod and per node only what changed since the
        one before (dds/controller/observe.py, dds/planner/state.py); the first derives it for the whole cluster, a
        second or more at thousands of nodes: better here than inside CA's first call after a start or a failover.
        Nothing is written or acted on."""
        try:
            observation = self.controller.observer.observe()
            plan_scale_up(observation.snapshot, replace(self.controller.config.planner, allow_new_nodes=False),
                          memos=self.controller.memos)
        except Exception as exc:  # only a head start: the first decision derives it all if this could not
            log.warning("could not plan once before serving (%s): the first decision will take longer", exc)

    def _started_leading(self) -> None:
        try:
            self._resume_leader_state()
        except Exception as exc:  # acting on the state of minutes ago could attach twice: do not lead on it
            log.error("leading, but cannot read the state the previous leader left (%s): exiting so this replica "
                      "restarts as a clean standby", exc)
            self._exit_as_standby()
            return
        log.info("leading: starting the control loop and serving cluster-autoscaler")
        self._start_acting()
        self.server.set_serving(True)
        if self.leader_label is not None:
            self.leader_label.mark(True)

    def _start_acting(self) -> None:
        """What only one replica may do: the control loop (after the marks a previous leader left are settled)."""
        self._release_leftover_marks()
        self.controller.start()

    def _release_leftover_marks(self) -> None:
        """Delete-machine marks a previous leader set without lowering replicas (it stopped between the two writes):
        Cluster API would act on them at the next scale-down (dds/nodes/machineset.py)."""
        provisioner = self.controller.actions.executor.nodes.provisioner
        release = getattr(provisioner, "release_leftover_marks", None)
        if release is None:
            return
        for group in self.catalog.groups():
            if group.source.kind not in ("MachineSet", "MachineDeployment"):
                continue
            try:
                release(group)
            except Exception as exc:  # the group's MachineSet unreadable now: its marks stay, said so
                log.warning("%s: could not check for leftover delete-machine marks (%s); a mark a crash left there "
                            "stays until DDS starts acting again", group.id, exc)

    def _resume_leader_state(self) -> None:
        """Re-read what the previous leader kept outside the process. Without this a standby that takes over serves CA
        the instances it read at its own start (CA then sees a scale-up in flight vanish, and asks again) and plans on
        the fabric as it was then; a backend with a compare-and-swap store (Redfish) would refuse every write."""
        self.tracker.reload()
        if isinstance(self.fabric, ResumableFabric):
            self.fabric.resync()

    def _stopped_leading(self) -> None:
        log.error("lost the leader lease: exiting so this replica restarts as a clean standby")
        self._exit_as_standby()

    def _exit_as_standby(self) -> None:
        self.server.set_serving(False)
        if self.leader_label is not None:
            self.leader_label.mark(False)
        self.exit_code = 1
        self.stopped.set()

    def stop(self) -> None:
        self.ops.begin_shutdown()
        self.controller.stop()
        self.server.stop()
        if self.elector is not None:
            self.elector.stop()
        if self.cache is not None:
            self.cache.stop()
        self.fabric.close()
        self.events.close()
        self.ops.stop()


def build_app(settings: Settings, api: Optional[ApiClient] = None,
              clock: Callable[[], float] = time.time, pod_name: Optional[str] = None) -> App:
    """`pod_name`: the Pod DDS runs in (default: the POD_NAME variable the Deployment sets from the downward API)."""
    from dds.kube.client import api_client

    check_metrics_settings(settings)  # before anything reads the cluster: an unprotected /metrics is a usage error
    require_fabric_choice(settings)
    api = api or api_client(settings.kubeconfig, settings.in_cluster)
    instrument(api)  # dds_apiserver_requests_total{verb}: steady state must show no LIST
    refuse_simulation_on_real_nodes(settings, api)  # simulated GPUs on real machines only when asked for by name
    if settings.leader_election and not settings.identity:
        # One name for the lease holder and the Events' reportingInstance: which replica acted is then on every Event.
        settings = settings.model_copy(update={"identity": default_identity()})
    events = KubeEventRecorder.for_cluster(api, reporting_instance=settings.identity)
    # The fabric's own objects are watched too when it keeps its state in the cluster (ComposabilityRequests).
    fabric_objects = COMPOSABILITY_OBJECTS if settings.fabric == FabricBackend.COMPOSABILITY_REQUEST else ()
    cache = (cluster_cache(api, settings.machineset_namespaces, fabric_objects,
                           provisioning=bool(settings.provisioning_class)) if settings.watch_cache else None)
    lister = MachineSetLister(api, settings.machineset_namespaces)
    if not settings.node_group_namespaces:
        log.warning("node_group_namespaces is empty: no namespace may have node groups, every opted-in MachineSet is "
                    "refused (docs/configuration.md \"Who may have node groups\")")
    catalog = NodeGroupCatalog(source=MachineSetSource(CachedMachineSetLister(cache, lister) if cache else lister,
                                                        settings.node_group_namespaces),
                               events=events)
    simulating_on_kwok_only = (settings.fabric == FabricBackend.SIMULATED
                               and not settings.simulated_fabric.allow_non_kwok_nodes)
    on_devices = gpu_capacity_hook(api, gpu_resource_of(api, catalog.groups, cache),
                                   kwok_only=ALLOW_NON_KWOK_NODES_ADVICE if simulating_on_kwok_only else None,
                                   own_memory=own_memory_of(api, catalog.groups, cache))
    built: dict[str, Fabric] = {}  # the hook reads the fabric it is given to (re-entrant: see dds/fabric/simulated.py)
    slices: Optional[ResourceSlicePublisher] = None
    if settings.fabric == FabricBackend.SIMULATED:  # DDS plays the DRA driver of dra-node-local groups: docs/dra.md
        slices = ResourceSlicePublisher(api, lambda node: online_gpus(built["fabric"], node),
                                        lists=lists_node_local_devices(api, catalog.groups, cache))
        on_devices = with_resource_slices(on_devices, slices)
    fabric = built["fabric"] = build_fabric(settings, clock=clock, api_client=api, on_node_devices_changed=on_devices,
                                            cache=cache.composability if cache else None, events=events)
    provisioner = build_node_backend(settings, clock=clock, api_client=api, on_written=cache.assume if cache else None)
    groups = fresh_groups(catalog, clock, settings.loop_interval_seconds)
    observer = ClusterObserver(KubeClusterReader(api, settings.machineset_namespaces, cache), fabric, groups, clock,
                               IdleTracker(), settings.gpu_label, cache=cache, cel_limits=cel_limits(settings))
    tracker = InstanceTracker(ConfigMapStateStore(api, settings.namespace, INSTANCES_CONFIGMAP))
    registry = Registry(catalog, ObservedClusterView(observer, api, clock), tracker)
    executor = Executor(fabric, provisioner, events)
    watcher = OperationWatcher(fabric, events, clock)
    planner = planner_config(settings)
    loop = LoopConfig(interval_seconds=settings.loop_interval_seconds,
                      pending_debounce_seconds=settings.pending_debounce_seconds,
                      gang_start_timeout_seconds=settings.gang_start_timeout_seconds, planner=planner,
                      dra_binding_timeout_seconds=settings.dra_binding_timeout_seconds,
                      move_idle_gpus=settings.move_idle_gpus, release_idle_gpus=settings.release_idle_gpus,
                      orphan_timeout_seconds=settings.orphan_attach_timeout_seconds,
                      cxl_memory_visible_timeout_seconds=settings.cxl_memory_visible_timeout_seconds,
                      unheld_grace_seconds=(settings.composability.unheld_device_grace_seconds
                                            if settings.fabric == FabricBackend.COMPOSABILITY_REQUEST else None),
                      reservations=ReservationConfig(enabled=settings.reservations,
                                                     min_age_seconds=settings.reservation_min_age_seconds,
                                                     large_fraction=settings.reservation_large_fraction,
                                                     quiet_age_seconds=settings.reservation_quiet_age_seconds),
                      provisioning=ProvisioningConfig(class_name=settings.provisioning_class,
                                                      booking_seconds=settings.provisioning_booking_seconds))
    app_ref: dict[str, App] = {}
    # The applier and the cluster's ports are built here, over dds.kube: the raw ApiClient stays out of the controller.
    node_writer = KubeNodeWriter(api)
    actions = Actions(executor, watcher, node_writer)
    cluster = ClusterPorts(pod_groups=PodGroupReader(api, cached=watched_gangs(observer)),
                           reservation_writes=ReservationWrites(api), gpu_labels=GpuLabelKeeper(node_writer, fabric),
                           pool_binder=PoolModeBinder(KubePoolBindingWriter(api), fabric, actions, clock=clock,
                                                      binding_timeout_seconds=loop.dra_binding_timeout_seconds),
                           provisioning_reads=ProvisioningRequestReader(
                               api, settings.provisioning_class, cached=cache.provisioning if cache else None,
                               served=(lambda: provisioning_served(api)) if cache else None),
                           provisioning_writes=ProvisioningRequestWriter(
                               api, cached=cache.provisioning if cache else None))
    controller = Controller(observer, actions, fabric, cluster, events, loop, clock,
                            is_leader=lambda: app_ref["app"].is_leader)
    events.pause = controller.calls_first.wait_for_calls  # a burst's Events are written between CA's calls
    if slices is not None:  # a GPU DDS lists as a DRA device is tainted before its detach (docs/dra.md)
        executor.before_detach = taint_then(executor.before_detach, slices)
    scale_up = PlannerScaleUp(controller.ca_call_ports(), tracker, planner, InstanceFactory(clock=clock),
                              settings.max_node_provision_seconds)
    controller.listeners.append(DeviceRepair(fabric, controller.actions, events, clock).run)  # GPUs failed while attached
    controller.listeners.append(NodeClaimReporter(events).run)  # Machines naming a Node another Machine has
    if isinstance(provisioner, MachineSetProvisioner):  # GPUs back to the pool before a Machine's host goes
        controller.listeners.append(PreTerminateHooks(catalog.group, provisioner, fabric, controller.actions,
                                                      events, clock, settings.pre_terminate_detach_timeout_seconds).run)
    scale_down = PlannerScaleDown(controller.ca_call_ports(), tracker, planner)
    elector: Optional[LeaderElector] = None
    if settings.leader_election:
        elector = LeaderElector(api, settings, on_started_leading=lambda: app_ref["app"]._started_leading(),
                                on_stopped_leading=lambda: app_ref["app"]._stopped_leading(), clock=clock)
    gate = LeaderGate(lambda: app_ref["app"].is_leader, lambda: elector.observed_leader if elector else "")
    server = build_server(settings, registry, scale_up, scale_down, interceptors=[gate])
    ops = build_ops_server(settings, lambda: ApiserverAuthorizer.for_cluster(api))
    ops.add_ready_check("node-groups", lambda: catalog.last_error is None)
    ops.add_page("/decisions", lambda query: (controller.journal.render_json(), "application/json")
                 if query.get("format") == ["json"] else (controller.journal.render_text(), "text/plain; charset=utf-8"))
    app = App(settings=settings, api=api, fabric=fabric, catalog=catalog, registry=registry, controller=controller,
              server=server, ops=ops, events=events, elector=elector, tracker=tracker, scale_up=scale_up,
              scale_down=scale_down, cache=cache,
              leader_label=LeaderPodLabel(api, settings.namespace, pod_name or os.environ.get("POD_NAME"),
                                          elector.timing.request_timeout) if elector is not None else None)
    ops.add_ready_check("started", app.started.is_set)
    controller.listeners.append(app.heap.on_pass)
    if app.leader_label is not None:
        controller.listeners.append(app.leader_label.retry_failed)
    app_ref["app"] = app
    return app
