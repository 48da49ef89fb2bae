"""AutoscalerStandIn: cluster-autoscaler's loop towards an externalgrpc provider, for tests where the real binary
cannot be built.

One `run_once()` is one CA iteration (core/static_autoscaler.go RunOnce), in CA's order:

1. list Nodes and Pods (an error aborts the loop); GPULabel (once, when a Ready node exists) marks GPU-labelled nodes
   with no allocatable GPU as unready;
2. Refresh (an error aborts the loop), NodeGroups (cached until the next Refresh);
3. templates per group: a good live node of the group (NodeGroupForNode), else one cached from a good node earlier,
   else NodeGroupTemplateNodeInfo, else an unready/unschedulable node of the group;
4. cluster state: NodeGroupTargetSize per group (an error aborts), NodeGroupNodes (refreshed every 2 min, every loop
   for a group scaling up), NodeGroupForNode per node and per unregistered instance, NodeGroupGetOptions; scale-up
   timeouts (failure, backoff, DecreaseTargetSize(−increase)) and failed instances (backoff);
5. NodeGroupDeleteNodes for instances unregistered longer than max-node-provision-time (placeholders `unregistered`)
   and for failed instances (placeholders `create-error`), every loop while they stay listed;
6. DecreaseTargetSize for a group whose registered size stayed below target for max-node-provision-time;
7. scale-up: unschedulable pods that fit neither an existing node nor an upcoming one are binpacked on each group's
   template, the least-waste option wins, NodeGroupIncreaseSize(delta) (an error backs the group off);
8. scale-down: nodes of a group below the utilization threshold (GPU nodes: GPU utilization) whose movable pods fit
   elsewhere, unneeded for scale-down-unneeded-time, group above min: taint ToBeDeletedByClusterAutoscaler, evict,
   NodeGroupDeleteNodes.

Simplifications (documented, not hidden): NodeGroupGetOptions is asked once per group per loop (CA asks for each value
it reads); the cluster-health gate, max-nodes-total, resource limits, balancing of similar groups, DaemonSet pods on
templates, pod (anti-)affinity and topology spread are not modelled; a drain evicts and calls DeleteNodes at once
instead of waiting for the pods to go; least-waste ties go to the first group id instead of a random one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from .cluster import ClusterAccess, ClusterSource, cluster_access
from .config import CloudConfig, StandInOptions, load_cloud_config
from .fit import Snapshot, binpack, utilization, waste_score
from .provider import (CloudProviderCrash, ExternalGrpcClient, GroupOptions, Instance, NodeGroup, NodeLike,
                       Placeholder, ProviderError, RpcCall, open_channel)
from .state import (AcceptableRange, Backoff, IncorrectSize, Readiness, ScaleDownRequest, ScaleUpRequest,
                    acceptable_ranges, incorrect_size, upcoming_nodes)
from .views import (ANNOTATION_SAFE_TO_EVICT, ANNOTATION_SCALE_DOWN_DISABLED, FAKE_NODE_CREATE_ERROR,
                    FAKE_NODE_UNREGISTERED, LABEL_HOSTNAME, TAINT_DELETION_CANDIDATE, TAINT_TO_BE_DELETED,
                    NodeView, PodView)

log = logging.getLogger("dds.testing.ca_standin")

# How long CA expects a cloud provider to need for a node deletion (MaxCloudProviderNodeDeletionTime).
NODE_DELETION_TIME = 5 * 60.0
# Taints CA strips when it turns a live node into a template (plus everything with the prefixes below).
_TEMPLATE_DROPPED_TAINTS = frozenset({TAINT_TO_BE_DELETED, TAINT_DELETION_CANDIDATE, "node.kubernetes.io/not-ready",
                                      "node.kubernetes.io/unreachable", "node.kubernetes.io/unschedulable",
                                      "node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure",
                                      "node.kubernetes.io/pid-pressure", "node.kubernetes.io/network-unavailable"})
_TEMPLATE_DROPPED_TAINT_PREFIXES = ("startup-taint.cluster-autoscaler.kubernetes.io/",
                                    "ignore-taint.cluster-autoscaler.kubernetes.io/",
                                    "status-taint.cluster-autoscaler.kubernetes.io/")


class LoopAborted(Exception):
    """The iteration stopped early, as CA's RunOnce returns an error."""


@dataclass
class LoopResult:
    started: float
    outcome: str = "ok"  # ok | aborted: ... | crashed: ... | fixed-group-size
    calls: list[RpcCall] = field(default_factory=list)
    scale_up: Optional[tuple[str, int]] = None  # (group id, delta) of a successful IncreaseSize
    deleted_nodes: list[str] = field(default_factory=list)  # nodes removed by scale-down this loop
    pods_to_help: list[str] = field(default_factory=list)  # pending pods neither existing nor upcoming nodes take


@dataclass
class _Observed:
    """What one loop learned about the cluster before acting."""

    nodes: list[NodeView]
    pods: list[PodView]
    groups: dict[str, NodeGroup]
    node_group: dict[str, str] = field(default_factory=dict)  # node name -> group id (autoscaled nodes only)
    targets: dict[str, int] = field(default_factory=dict)
    instances: dict[str, list[Instance]] = field(default_factory=dict)
    templates: dict[str, NodeView] = field(default_factory=dict)
    readiness: dict[str, Readiness] = field(default_factory=dict)
    unregistered: dict[str, tuple[Placeholder, float, str]] = field(default_factory=dict)  # id -> (node, since, group)
    options: dict[str, GroupOptions] = field(default_factory=dict)


class AutoscalerStandIn:
    """A cluster-autoscaler stand-in that drives an externalgrpc provider over a real gRPC channel."""

    def __init__(self, kubeconfig_or_api_client: ClusterSource, cloud_config: Path | CloudConfig,
                 scan_interval: float = 10.0, max_node_provision_time: float = 15 * 60.0,
                 options: Optional[StandInOptions] = None, clock: Callable[[], float] = time.time) -> None:
        base = options or StandInOptions()
        self.options = replace(base, scan_interval=scan_interval, max_node_provision_time=max_node_provision_time)
        self.cloud_config = cloud_config if isinstance(cloud_config, CloudConfig) else load_cloud_config(cloud_config)
        self.cluster: ClusterAccess = cluster_access(kubeconfig_or_api_client)
        self._clock = clock
        self._channel = open_channel(self.cloud_config)
        self.provider = ExternalGrpcClient(self._channel, self.cloud_config.grpc_timeout, clock)
        self.backoff = Backoff(self.options.initial_node_group_backoff, self.options.max_node_group_backoff,
                               self.options.node_group_backoff_reset_timeout)
        self.scale_up_requests: dict[str, ScaleUpRequest] = {}
        self.scale_down_requests: list[ScaleDownRequest] = []
        self.incorrect_sizes: dict[str, IncorrectSize] = {}
        self.unneeded_since: dict[str, float] = {}
        self.loops: list[LoopResult] = []
        self.crashed: Optional[str] = None
        self._template_cache: dict[str, tuple[NodeView, float]] = {}
        self._instances: dict[str, list[Instance]] = {}
        self._previous_instances: dict[str, list[Instance]] = {}
        self._instances_refreshed_at: Optional[float] = None
        self._unregistered_since: dict[str, float] = {}
        self._scaling_up: set[str] = set()  # groups with upcoming nodes and a scale-up request, as of the last loop
        self._last_scale_up = -math.inf
        self._last_delete = -math.inf
        self._last_delete_failure = -math.inf
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._loop_lock = threading.Lock()

    @property
    def calls(self) -> list[RpcCall]:
        """Every RPC made so far: (time, method, request summary, status)."""
        return list(self.provider.calls)

    # --- running ---

    def run_once(self) -> LoopResult:
        with self._loop_lock:
            now = self._clock()
            mark = len(self.provider.calls)
            result = LoopResult(started=now)
            try:
                self._iterate(now, result)
            except LoopAborted as exc:
                result.outcome = f"aborted: {exc}"
                log.warning("autoscaler loop aborted: %s", exc)
            except CloudProviderCrash as exc:
                result.outcome = f"crashed: {exc}"
                self.crashed = str(exc)
                self._stop.set()
                log.error("cluster-autoscaler would crash here: %s", exc)
            result.calls = self.provider.calls[mark:]
            self.loops.append(result)
            return result

    def run_in_thread(self) -> threading.Thread:
        if self._thread is not None:
            raise RuntimeError("the stand-in is already running")
        self._thread = threading.Thread(target=self._run_forever, name="ca-standin", daemon=True)
        self._thread.start()
        return self._thread

    def _run_forever(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()  # only for pacing; the logic uses the injected clock
            try:
                self.run_once()
            except Exception:  # a bug must not silently end the loop of a long e2e test
                log.exception("autoscaler loop failed")
            self._stop.wait(max(0.0, self.options.scan_interval - (time.monotonic() - started)))

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the loop, call Cleanup as CA does on exit, close the channel."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self.provider.cleanup()
        except ProviderError as exc:
            log.warning("Cleanup failed: %s", exc)
        self._channel.close()

    # --- one iteration ---

    def _iterate(self, now: float, result: LoopResult) -> None:
        nodes, pods = self._list_cluster()
        nodes = self._mark_gpu_unready(nodes)
        try:
            self.provider.refresh()
        except ProviderError as exc:
            raise LoopAborted(f"Refresh failed: {exc}") from exc
        observed = _Observed(nodes, pods, {g.id: g for g in self.provider.node_groups()})
        observed.templates = self._templates(observed, now)
        self._update_cluster_state(observed, now)
        self._remove_old_unregistered(observed, now)
        self._delete_failed_instances(observed)
        if self._fix_group_sizes(observed, now):
            result.outcome = "fixed-group-size"
            return
        scaled_up = self._scale_up(observed, now, result)
        if self.options.scale_down_enabled:
            self._scale_down(observed, now, scaled_up, result)

    def _list_cluster(self) -> tuple[list[NodeView], list[PodView]]:
        try:
            return self.cluster.list_nodes(), self.cluster.list_pods()
        except Exception as exc:  # any apiserver failure: CA's listers return an error and the loop stops
            raise LoopAborted(f"listing nodes and pods failed: {exc}") from exc

    def _mark_gpu_unready(self, nodes: list[NodeView]) -> list[NodeView]:
        """A Ready node with CA's GPU label but no allocatable GPU counts as unready (its GPUs are coming up)."""
        if not any(n.ready for n in nodes):
            return nodes
        label = self.provider.gpu_label()
        if not label:
            return nodes
        return [replace(n, ready=False, ready_since=n.created)
                if n.ready and label in n.labels and not n.gpu_allocatable()[1] else n for n in nodes]

    def _group_of(self, node: NodeLike) -> Optional[NodeGroup]:
        try:
            return self.provider.node_group_for_node(node)
        except ProviderError as exc:
            log.warning("NodeGroupForNode failed for %s: %s", getattr(node, "name", node), exc)
            return None

    # --- templates ---

    def _good_template_candidate(self, node: NodeView, now: float) -> bool:
        stable = node.ready_since + self.options.template_stabilization_delay < now
        return node.ready and stable and not node.unschedulable and not node.to_be_deleted

    @staticmethod
    def _template_from_node(node: NodeView, group_id: str) -> NodeView:
        name = f"template-node-for-{group_id}"
        taints = tuple(t for t in node.taints if t.key not in _TEMPLATE_DROPPED_TAINTS
                       and not t.key.startswith(_TEMPLATE_DROPPED_TAINT_PREFIXES))
        labels = dict(node.labels)
        labels[LABEL_HOSTNAME] = name
        return replace(node, name=name, provider_id="", labels=labels, taints=taints, unschedulable=False,
                       ready=True)

    def _templates(self, observed: _Observed, now: float) -> dict[str, NodeView]:
        templates: dict[str, NodeView] = {}
        good = [n for n in observed.nodes if self._good_template_candidate(n, now)]
        bad = [n for n in observed.nodes if not self._good_template_candidate(n, now)]
        for node in good:
            group = self._group_of(node)
            if group is not None and group.id not in templates:
                templates[group.id] = self._template_from_node(node, group.id)
                self._template_cache[group.id] = (templates[group.id], now)
        for group_id in observed.groups:
            if group_id in templates:
                continue
            cached = self._template_cache.get(group_id)
            if cached is not None:
                if cached[1] + self.options.node_info_cache_expire_time >= now:
                    templates[group_id] = cached[0]
                    continue
                del self._template_cache[group_id]
            try:
                template = self.provider.template_node(group_id)
            except ProviderError as exc:
                log.error("unable to build a template node for %s: %s", group_id, exc)
                continue
            if template is not None:
                templates[group_id] = replace(template, name=f"template-node-for-{group_id}")
        for group_id in [g for g in self._template_cache if g not in observed.groups]:
            del self._template_cache[group_id]
        for node in bad:
            group = self._group_of(node)
            if group is not None and group.id not in templates:
                log.warning("built template for %s from unready/unschedulable node %s", group.id, node.name)
                templates[group.id] = self._template_from_node(node, group.id)
        return templates

    # --- cluster state ---

    def _defaults(self) -> GroupOptions:
        o = self.options
        return GroupOptions(o.scale_down_utilization_threshold, o.scale_down_gpu_utilization_threshold,
                            o.scale_down_unneeded_time, o.scale_down_unready_time, o.max_node_provision_time,
                            o.zero_or_max_node_scaling, o.ignore_daemonsets_utilization, o.max_node_startup_time)

    def _options(self, observed: _Observed, group_id: str) -> GroupOptions:
        if group_id not in observed.options:
            try:
                observed.options[group_id] = self.provider.get_options(group_id, self._defaults())
            except ProviderError as exc:
                log.warning("NodeGroupGetOptions failed for %s, using the defaults: %s", group_id, exc)
                observed.options[group_id] = self._defaults()
        return observed.options[group_id]

    def _update_cluster_state(self, observed: _Observed, now: float) -> None:
        for group_id in observed.groups:
            try:
                observed.targets[group_id] = self.provider.target_size(group_id)
            except ProviderError as exc:
                raise LoopAborted(f"NodeGroupTargetSize failed for {group_id}: {exc}") from exc
        observed.instances = self._fetch_instances(observed, now)
        self._count_readiness(observed, now)
        ranges = acceptable_ranges(observed.targets, observed.readiness, self.scale_up_requests,
                                   self.scale_down_requests)
        self._expire_scale_requests(observed, ranges, now)
        self._register_failed_instances(observed, now)
        for group_id, target in observed.targets.items():
            found = incorrect_size(target, observed.readiness.get(group_id), self.incorrect_sizes.get(group_id), now)
            if found is None:
                self.incorrect_sizes.pop(group_id, None)
            else:
                self.incorrect_sizes[group_id] = found
        for group_id in [g for g in self.incorrect_sizes if g not in observed.targets]:
            del self.incorrect_sizes[group_id]
        self._note_scaling_up(observed)

    def _note_scaling_up(self, observed: _Observed) -> None:
        """Groups with upcoming nodes and a scale-up request: the next loop re-fetches their NodeGroupNodes."""
        self._scaling_up = {g for g in observed.targets if g in self.scale_up_requests
                            and upcoming_nodes(observed.targets[g], observed.readiness.get(g)) > 0}

    def _recalculate(self, observed: _Observed) -> None:
        """CA's Recalculate after a scale-up or a delete of failed instances: every target size is read again."""
        for group_id in observed.groups:
            try:
                observed.targets[group_id] = self.provider.target_size(group_id)
            except ProviderError as exc:
                log.warning("failed to get target sizes while recalculating: %s", exc)
                break
        self._note_scaling_up(observed)

    def _fetch_nodes_for(self, group_id: str) -> list[Instance]:
        try:
            return self.provider.nodes(group_id)
        except ProviderError:
            # CA's cache fetches a missing entry twice (once in the parallel fill, once on read) before giving up.
            try:
                return self.provider.nodes(group_id)
            except ProviderError as exc:
                raise LoopAborted(f"NodeGroupNodes failed for {group_id}: {exc}") from exc

    def _fetch_instances(self, observed: _Observed, now: float) -> dict[str, list[Instance]]:
        self._previous_instances = {g: list(i) for g, i in self._instances.items()}
        for group_id in self._scaling_up:
            self._instances.pop(group_id, None)
        due = (self._instances_refreshed_at is None
               or now - self._instances_refreshed_at >= self.options.instances_refresh_interval)
        if due:
            self._instances_refreshed_at = now
            for group_id in observed.groups:
                try:  # the background refresh stores an empty list on error
                    self._instances[group_id] = self.provider.nodes(group_id)
                except ProviderError as exc:
                    log.error("failed to get the instances of %s: %s", group_id, exc)
                    self._instances[group_id] = []
        for group_id in [g for g in self._instances if g not in observed.groups]:
            del self._instances[group_id]
        for group_id in observed.groups:
            if group_id not in self._instances:
                self._instances[group_id] = self._fetch_nodes_for(group_id)
        return {g: list(self._instances[g]) for g in observed.groups}

    def _count_readiness(self, observed: _Observed, now: float) -> None:
        readiness: dict[str, Readiness] = {}
        for node in observed.nodes:
            group = self._group_of(node)
            if group is None:
                continue
            observed.node_group[node.name] = group.id
            entry = readiness.setdefault(group.id, Readiness())
            entry.registered.append(node.name)
            startup = self._options(observed, group.id).max_node_startup_time
            if node.to_be_deleted:
                entry.deleted.append(node.name)
            elif node.ready:
                entry.ready.append(node.name)
            elif node.created + startup > now:
                entry.not_started.append(node.name)
            else:
                entry.unready.append(node.name)
        registered_ids = {n.provider_id for n in observed.nodes}
        still_unregistered: dict[str, float] = {}
        for instances in observed.instances.values():
            for instance in instances:
                if instance.id in registered_ids or not instance.expected_to_register:
                    continue
                since = self._unregistered_since.get(instance.id, now)
                still_unregistered[instance.id] = since
                placeholder = Placeholder(instance.id, FAKE_NODE_UNREGISTERED)
                group = self._group_of(placeholder)
                if group is None:
                    continue
                observed.unregistered[instance.id] = (placeholder, since, group.id)
                entry = readiness.setdefault(group.id, Readiness())
                if since + self._options(observed, group.id).max_node_provision_time < now:
                    entry.long_unregistered.append(instance.id)
                else:
                    entry.unregistered.append(instance.id)
        self._unregistered_since = still_unregistered
        observed.readiness = readiness

    def _register_failed_scale_up(self, group_id: str, reason: str, now: float) -> None:
        until = self.backoff.fail(group_id, reason, now)
        log.warning("disabling scale-up for node group %s until %.0f: %s", group_id, until, reason)

    def _expire_scale_requests(self, observed: _Observed, ranges: dict[str, AcceptableRange], now: float) -> None:
        self.backoff.forget_stale(now)
        for group_id, request in list(self.scale_up_requests.items()):
            if group_id not in ranges or upcoming_nodes(ranges[group_id].current_target,
                                                        observed.readiness.get(group_id)) <= 0:
                del self.scale_up_requests[group_id]  # finished: nothing upcoming any more
                continue
            if request.expected_add_time < now:
                self._register_failed_scale_up(group_id, f"scale-up timed out after {now - request.time:.0f}s", now)
                if request.increase > 0:
                    try:  # 1.36: revert the failed scale-up so the provider stops retrying it
                        self.provider.decrease_target_size(group_id, -request.increase)
                    except ProviderError as exc:
                        log.warning("failed to revert timed-out scale-up of %s: %s", group_id, exc)
                del self.scale_up_requests[group_id]
        self.scale_down_requests = [r for r in self.scale_down_requests if r.expected_delete_time > now]

    def _register_failed_instances(self, observed: _Observed, now: float) -> None:
        for group_id, instances in observed.instances.items():
            seen = {i.id for i in self._previous_instances.get(group_id, []) if i.failed_creating}
            unseen = [i for i in instances if i.failed_creating and i.id not in seen]
            scaling_up = (group_id in self.scale_up_requests
                          and upcoming_nodes(observed.targets[group_id], observed.readiness.get(group_id)) > 0)
            if not unseen or not scaling_up:
                continue
            request = self.scale_up_requests[group_id]
            request.increase -= len(unseen)
            if request.increase <= 0:
                del self.scale_up_requests[group_id]
            errors = sorted({f"{i.error.code}: {i.error.message}" for i in unseen if i.error})
            self._register_failed_scale_up(group_id, f"failed adding {len(unseen)} nodes: {'; '.join(errors)}", now)

    # --- deleting what never came up ---

    def _zero_or_max(self, observed: _Observed, group_id: str, nodes: list[NodeLike]) -> list[NodeLike]:
        """With zeroOrMaxNodeScaling a group is deleted whole: every instance, as a placeholder without a reason."""
        if not self._options(observed, group_id).zero_or_max_node_scaling:
            return nodes
        return [Placeholder(i.id, "") for i in self.provider.nodes(group_id)]

    def _remove_old_unregistered(self, observed: _Observed, now: float) -> None:
        by_group: dict[str, list[Placeholder]] = {}
        for placeholder, since, _ in observed.unregistered.values():
            group = self._group_of(placeholder)
            if group is None:
                continue
            if since + self._options(observed, group.id).max_node_provision_time < now:
                by_group.setdefault(group.id, []).append(placeholder)
        for group_id, placeholders in sorted(by_group.items()):
            group = observed.groups.get(group_id)
            if group is None:
                continue
            try:
                room = self.provider.target_size(group_id) - group.min_size
            except ProviderError as exc:
                log.warning("failed to get the size of %s: %s", group_id, exc)
                continue
            if room <= 0:
                log.warning("node group %s is at its min size: not removing %d unregistered nodes", group_id,
                            len(placeholders))
                continue
            try:
                nodes = self._zero_or_max(observed, group_id, list(placeholders[:room]))
                if nodes:
                    self.provider.delete_nodes(group_id, nodes)
            except ProviderError as exc:
                log.warning("failed to remove unregistered nodes of %s: %s", group_id, exc)
                self._instances.pop(group_id, None)
                return
            self._instances.pop(group_id, None)

    def _delete_failed_instances(self, observed: _Observed) -> None:
        deleted_any = False
        for group_id, instances in sorted(observed.instances.items()):
            failed: list[NodeLike] = [Placeholder(i.id, FAKE_NODE_CREATE_ERROR) for i in instances if i.failed_creating]
            if not failed:
                continue
            try:
                nodes = self._zero_or_max(observed, group_id, failed)
                if nodes:
                    self.provider.delete_nodes(group_id, nodes)
                    deleted_any = True
                    self._instances.pop(group_id, None)
            except ProviderError as exc:
                log.warning("error deleting failed instances of %s: %s", group_id, exc)
        if deleted_any:
            self._recalculate(observed)

    def _fix_group_sizes(self, observed: _Observed, now: float) -> bool:
        fixed = False
        for group_id in observed.groups:
            wrong = self.incorrect_sizes.get(group_id)
            if wrong is None:
                continue
            if wrong.first_observed + self._options(observed, group_id).max_node_provision_time < now:
                delta = wrong.current - wrong.expected
                if delta < 0:
                    try:
                        self.provider.decrease_target_size(group_id, delta)
                    except ProviderError as exc:
                        raise LoopAborted(f"failed to decrease {group_id}: {exc}") from exc
                    fixed = True
        return fixed

    # --- scale-up ---

    def _upcoming(self, observed: _Observed, now: float) -> tuple[dict[str, int], set[str]]:
        counts, registered = {}, set()
        for group_id, target in observed.targets.items():
            readiness = observed.readiness.get(group_id)
            count = upcoming_nodes(target, readiness)
            # Only an active, not backed-off scale-up counts: otherwise fake upcoming nodes would hide pods forever.
            if count <= 0 or group_id not in self.scale_up_requests or self.backoff.backed_off(group_id, now):
                continue
            counts[group_id] = count
            if readiness is not None:
                registered.update(readiness.not_started)
        return counts, registered

    def _pods_to_help(self, observed: _Observed, now: float) -> list[PodView]:
        upcoming, registered_upcoming = self._upcoming(observed, now)
        snapshot = Snapshot([n for n in observed.nodes if n.name not in registered_upcoming],
                            [p for p in observed.pods if p.node_name])
        for group_id, count in sorted(upcoming.items()):
            template = observed.templates.get(group_id)
            if template is None:
                continue
            for index in range(count):
                snapshot.add_node(replace(template, name=f"{template.name}-upcoming-{index}"))
        pending = [p for p in observed.pods
                   if p.unschedulable and not p.node_name and not p.deleting and not p.terminal]
        pending.sort(key=lambda p: (-p.priority, p.created, p.key))
        still_pending = [p for p in pending if snapshot.place(p) is None]
        return [p for p in still_pending if now - p.created > self.options.new_pod_scale_up_delay]

    def _all_pods_are_new(self, pods: list[PodView], now: float) -> bool:
        if min(p.created for p in pods) + self.options.unschedulable_pod_time_buffer > now:
            return True
        gpu_pods = [p for p in pods if p.requests_gpu()]
        return bool(gpu_pods) and min(p.created for p in gpu_pods) + self.options.unschedulable_gpu_pod_time_buffer > now

    def _scale_up(self, observed: _Observed, now: float, result: LoopResult) -> bool:
        pods = self._pods_to_help(observed, now)
        result.pods_to_help = [p.key for p in pods]
        if not pods or self._all_pods_are_new(pods, now):
            return False
        best: Optional[tuple[float, str, int]] = None
        for group_id, group in sorted(observed.groups.items()):
            template = observed.templates.get(group_id)
            target = observed.targets.get(group_id, 0)
            if template is None or self.backoff.backed_off(group_id, now) or target >= group.max_size:
                continue
            estimate = binpack(pods, template, group.max_size - target)
            if estimate.node_count == 0:
                continue
            option = (waste_score(template, estimate), group_id, estimate.node_count)
            if best is None or option[:2] < best[:2]:
                best = option
        if best is None:
            log.info("no node group can help %d pending pods", len(pods))
            return False
        _, group_id, delta = best
        self.provider.gpu_types()  # the scale-up executor labels its metrics with the provider's GPU types
        try:
            self.provider.increase_size(group_id, delta)
        except ProviderError as exc:
            self._register_failed_scale_up(group_id, f"IncreaseSize failed: {exc}", now)
            return False
        self._register_scale_up(observed, group_id, delta, now)
        self._recalculate(observed)
        result.scale_up = (group_id, delta)
        return True

    def _register_scale_up(self, observed: _Observed, group_id: str, delta: int, now: float) -> None:
        provision = self._options(observed, group_id).max_node_provision_time
        request = self.scale_up_requests.get(group_id)
        if request is None:
            self.scale_up_requests[group_id] = ScaleUpRequest(delta, now, now + provision)
        else:
            request.increase += delta
            request.time, request.expected_add_time = now, now + provision
        self._last_scale_up = now

    # --- scale-down ---

    def _blocking_pod(self, pod: PodView) -> Optional[str]:
        safe = pod.annotations.get(ANNOTATION_SAFE_TO_EVICT)
        if safe == "false":
            return f"pod {pod.key} is annotated safe-to-evict=false"
        if safe == "true":
            return None
        if not pod.controller_kind:
            return f"pod {pod.key} is not backed by a controller"
        if self.options.skip_nodes_with_system_pods and pod.namespace == "kube-system":
            return f"pod {pod.key} is a kube-system pod"
        if self.options.skip_nodes_with_local_storage and pod.local_storage:
            return f"pod {pod.key} uses local storage"
        return None

    def _unneeded_nodes(self, observed: _Observed) -> dict[str, list[PodView]]:
        """Nodes CA would call unneeded now, each with the pods a drain would evict."""
        pods_on: dict[str, list[PodView]] = {}
        for pod in observed.pods:
            if pod.node_name and not pod.terminal:
                pods_on.setdefault(pod.node_name, []).append(pod)
        snapshot = Snapshot([n for n in observed.nodes if not n.to_be_deleted],
                            [p for p in observed.pods if p.node_name])
        # CA reads the GPU label when it judges a node of a group; with no such node it asks nothing.
        gpu_label = self.provider.gpu_label() if observed.node_group else ""
        unneeded: dict[str, list[PodView]] = {}
        for node in sorted(observed.nodes, key=lambda n: n.name):
            group_id = observed.node_group.get(node.name)
            if group_id is None or node.to_be_deleted or node.annotations.get(ANNOTATION_SCALE_DOWN_DISABLED) == "true":
                continue
            options = self._options(observed, group_id)
            on_node = pods_on.get(node.name, [])
            if node.ready:
                counted = [p for p in on_node if not (options.ignore_daemonsets_utilization and p.is_daemonset)]
                gpu_resource = node.gpu_allocatable()[0] or ("nvidia.com/gpu" if gpu_label in node.labels else "")
                threshold = (options.scale_down_gpu_utilization_threshold if gpu_resource
                             else options.scale_down_utilization_threshold)
                if utilization(node, counted, gpu_resource) >= threshold:
                    continue
            movable = [p for p in on_node if not p.is_daemonset and not p.is_mirror]
            if any(self._blocking_pod(p) for p in movable):
                continue
            # Simulate the drain on the shared snapshot: a later candidate sees the pods an earlier one pushed out.
            saved = {name: usage.copy() for name, usage in snapshot.usage.items()}
            removed = frozenset(unneeded) | {node.name}
            if all(snapshot.place(p, exclude=removed) is not None for p in movable):
                unneeded[node.name] = movable
            else:
                snapshot.usage = saved
        return unneeded

    def _scale_down(self, observed: _Observed, now: float, scaled_up: bool, result: LoopResult) -> None:
        unneeded = self._unneeded_nodes(observed)
        self.unneeded_since = {name: self.unneeded_since.get(name, now) for name in unneeded}
        in_cooldown = (scaled_up or self._last_scale_up + self.options.scale_down_delay_after_add > now
                       or self._last_delete + self.options.delay_after_delete > now
                       or self._last_delete_failure + self.options.scale_down_delay_after_failure > now)
        if in_cooldown:
            return
        nodes = {n.name: n for n in observed.nodes}
        deleting = {g: sum(1 for r in self.scale_down_requests if r.group_id == g) for g in observed.groups}
        drained_one = False
        for name in sorted(unneeded, key=lambda n: (bool(unneeded[n]), n)):  # empty nodes first
            group_id = observed.node_group[name]
            options = self._options(observed, group_id)
            wait = options.scale_down_unneeded_time if nodes[name].ready else options.scale_down_unready_time
            if self.unneeded_since[name] + wait > now:
                continue
            group = observed.groups.get(group_id)
            if group is None or observed.targets.get(group_id, 0) - deleting.get(group_id, 0) <= group.min_size:
                continue
            if unneeded[name] and drained_one:
                continue  # CA drains one non-empty node at a time
            if self._delete_node(nodes[name], group_id, unneeded[name], now):
                drained_one = drained_one or bool(unneeded[name])
                deleting[group_id] = deleting.get(group_id, 0) + 1
                result.deleted_nodes.append(name)

    def _delete_node(self, node: NodeView, group_id: str, pods: list[PodView], now: float) -> bool:
        try:
            self.cluster.add_to_be_deleted_taint(node.name, now)
            for pod in pods:
                self.cluster.evict_pod(pod.namespace, pod.name)
            self.provider.delete_nodes(group_id, [node])
        except Exception as exc:  # an API or provider failure: CA untaints the node and backs scale-down off
            log.warning("scale-down of %s failed: %s", node.name, exc)
            self._last_delete_failure = now
            try:
                self.cluster.remove_to_be_deleted_taint(node.name)
            except Exception as untaint_error:
                log.warning("could not remove the ToBeDeleted taint from %s: %s", node.name, untaint_error)
            return False
        self.scale_down_requests.append(ScaleDownRequest(group_id, node.name, now + NODE_DELETION_TIME))
        self.unneeded_since.pop(node.name, None)
        self._last_delete = now
        return True

