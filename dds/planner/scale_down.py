"""Scale-down (the talk's cases 3 and 4): release idle GPUs, remove nodes only when right.

- Nodes CA asked to delete (`candidates`, case 3): removed when every movable pod fits on another node (simulated on a
  fork of the scratch, kept when it works so the next candidate cannot count on the same room), no pod is pinned, and
  the group stays at or above its min size. Otherwise the node is kept and only its idle GPUs go (GPU-only removal).
- DDS's own scan (case 4): a DDS node without work for its group's node cooldown is removed (when node removal is
  enabled), its devices released first; every other node, including an empty one that stays (its group at min size,
  its node cooldown not reached), loses the GPUs idle for the group's GPU cooldown.
- A GPU in use is never detached unless the group allows force-detach. Device choice is deterministic: newest
  attached first.
- A node whose GPUs the CDI operator serves in DEVICE_PLUGIN mode loses its idle GPUs only once none of its GPUs is in
  use: the operator refuses (and retries) any unforced detach from a node with GPU load (dds/planner/device_modes.py).
  Until then they are kept, with the reason in `kept`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from dds.model.groups import NodeGroupSpec
from dds.planner.cxl_memory import release_idle_cxl_memory
from dds.planner.device_modes import IDLE_NODE_ONLY, detaches_only_from_idle_node, held_by_node_load, held_reason
from dds.planner.existing import FastExisting
from dds.planner.headroom import WarmBudget
from dds.model.plan import Detach, IdlePastCooldown, Keep, PlannerConfig, RemoveNode, ScaleDownPlan
from dds.planner.requests import RequestCache, is_work, scheduling_order
from dds.planner.scoring import check_policy
from dds.model.snapshot import Device, NodeInfo, PodInfo, Snapshot
from dds.planner.state import ClusterState
from dds.planner.memos import PlannerMemos
from dds.planner.usage import GpuUsage, gpu_usage


def duration_text(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _ids(devices: Sequence[Device]) -> tuple[str, ...]:
    return tuple(d.id for d in devices)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


class _ScaleDown:
    def __init__(self, snapshot: Snapshot, config: PlannerConfig, hungry_pools: frozenset[str] = frozenset(),
                 memos: Optional[PlannerMemos] = None) -> None:
        self.snapshot = snapshot
        self.config = config
        self.warm = WarmBudget(snapshot, config, hungry_pools)
        memos = memos if memos is not None else PlannerMemos()
        self.cache = RequestCache(memos.requests)
        self.state = ClusterState(snapshot, self.cache, None, memos=memos)
        self.live = FastExisting(self.state, config.policy)
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.size: dict[str, int] = {}
        for node in snapshot.nodes:
            if node.group_id and not node.being_deleted:
                self.size[node.group_id] = self.size.get(node.group_id, 0) + 1
        self.detaches: list[Detach] = []
        self.removals: list[RemoveNode] = []
        self.kept: list[Keep] = []
        self.notes: list[str] = []
        self.idle_past_cooldown: list[IdlePastCooldown] = []
        self.done: set[str] = set()

    # --- helpers ---
    def group(self, node: NodeInfo) -> Optional[NodeGroupSpec]:
        return self.snapshot.group(node.group_id) if node.group_id else None

    def usage(self, node: NodeInfo) -> GpuUsage:
        return gpu_usage(node, self.snapshot.pods_on(node.name), self.cache)

    def work(self, node: NodeInfo) -> list[PodInfo]:
        return [p for p in self.snapshot.pods_on(node.name) if is_work(p)]

    def above_min(self, group: NodeGroupSpec, node: NodeInfo) -> bool:
        """Removing `node` keeps the group at or above its min size (removals of this plan counted). Nodes already
        being deleted are not counted in the size, except the one asked about (CA taints its candidates first)."""
        size = self.size.get(group.id, 0) + (1 if node.being_deleted else 0)
        return size - 1 >= group.min_size

    def keep(self, node: str, reason: str) -> None:
        self.kept.append(Keep(node, reason))
        self.done.add(node)

    def keep_node_only(self, node: str, reason: str) -> None:
        """The node stays, but its idle GPUs are still judged by their own cooldown (`idle_gpus`): a node kept for
        the group's min size or its node cooldown must not hold pool devices it does not use."""
        self.kept.append(Keep(node, reason))

    def remove(self, node: NodeInfo, group: NodeGroupSpec, usage: GpuUsage, reason: str) -> None:
        """Release the node's devices first, then remove it. In-use GPUs go only with force-detach; otherwise they are
        released once the pods have moved (the node is being deleted then, and idle GPUs go at once)."""
        if usage.in_use and not group.force_detach:
            if self.held(node, usage):
                # In the removal's reason, not a Keep: a kept candidate is untainted, and this node goes.
                reason += (f"; its {_gpus(len(usage.idle))} idle now {'stays' if len(usage.idle) == 1 else 'stay'} "
                           f"until its pods have moved ({IDLE_NODE_ONLY})")
            elif usage.idle:
                self.detaches.append(Detach(node.name, _ids(usage.idle), reason=(
                    f"{node.name} is being removed: its {_gpus(len(usage.idle))} idle now are released first")))
            reason += (f"; its {_gpus(usage.in_use)} in use are released once its pods have moved (force-detach is off "
                       f"for {group.id})")
        elif usage.devices:
            force = usage.in_use > 0
            self.detaches.append(Detach(node.name, _ids(usage.devices), force=force, reason=(
                f"{node.name} is being removed: its {_gpus(len(usage.devices))} are released first"
                + (f" ({_gpus(usage.in_use)} in use: force-detach is on for {group.id})" if force else ""))))
        self.removals.append(RemoveNode(node.name, group.id, reason))
        if not node.being_deleted:
            self.size[group.id] = self.size.get(group.id, 0) - 1
        self.done.add(node.name)

    def release_idle(self, node: NodeInfo, usage: GpuUsage, why: str) -> None:
        """Detach the node's idle GPUs, unless the operator would refuse it while other GPUs of the node are busy
        (device-plugin mode): then they are kept, and say why."""
        if not usage.idle:
            return
        if self.held(node, usage):
            self.note_held(node, usage)
            return
        self.detaches.append(Detach(node.name, _ids(usage.idle), reason=(
            f"{why}: releasing its {_gpus(len(usage.idle))} idle (newest attached first)")))

    def held(self, node: NodeInfo, usage: GpuUsage) -> bool:
        """Idle GPUs the operator would refuse to detach now: a device-plugin node with GPU load
        (dds/planner/device_modes.py)."""
        return bool(usage.idle) and held_by_node_load(self.config, self.group(node), usage.in_use)

    def idle_fate(self, node: NodeInfo, usage: GpuUsage) -> str:
        """The end of a kept candidate's reason: what becomes of its idle GPUs."""
        if self.held(node, usage):
            return held_reason(usage.in_use, len(usage.idle))
        return "only its idle GPUs are released"

    def note_held(self, node: NodeInfo, usage: GpuUsage) -> None:
        """Say why the node's idle GPUs stay: in the node's Keep when this plan keeps it for another reason already
        (one Keep per node, as the Events show them), else in a Keep of its own."""
        text = held_reason(usage.in_use, len(usage.idle))
        for index, keep in enumerate(self.kept):
            if keep.node == node.name:
                if IDLE_NODE_ONLY not in keep.reason:
                    self.kept[index] = Keep(node.name, f"{keep.reason}; {text}")
                return
        self.kept.append(Keep(node.name, text))

    def idle_since(self, node: NodeInfo, group: NodeGroupSpec) -> float:
        """Since when the node's idle GPUs count as idle. The node's idle clock starts with its first idle GPU; on a
        device-plugin node that GPU was held while others were busy, so the GPUs freed last would go the moment the
        work ends. Their cooldown counts from when the node's work ended (`empty_since`), where DDS knows it."""
        assert node.gpus_idle_since is not None
        if detaches_only_from_idle_node(self.config, group) and node.empty_since is not None:
            return max(node.gpus_idle_since, node.empty_since)
        return node.gpus_idle_since

    # --- case 3: nodes CA asked to delete ---
    def candidate(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            self.kept.append(Keep(name, "CA asked to remove it, but it is not in the snapshot"))
            return
        group = self.group(node)
        if group is None:
            self.keep(name, "CA asked to remove it, but it is not a node of a DDS group")
            return
        usage = self.usage(node)
        why_not = self._why_not_removable(node, group)
        if why_not:
            self.keep(name, f"CA asked to remove it; it stays: {why_not}; {self.idle_fate(node, usage)}")
            self.release_idle(node, usage, f"CA asked to remove {name}, which stays")
            return
        work = self.work(node)
        moves = self._move(node, work)
        if moves is None:
            return  # _move recorded the Keep and the GPU-only removal
        reason = (f"CA asked to remove it and its {len(work)} pod(s) fit elsewhere ({', '.join(moves)})" if work
                  else "CA asked to remove it and it holds no work")
        self.remove(node, group, usage, reason)

    def _why_not_removable(self, node: NodeInfo, group: NodeGroupSpec) -> str:
        pinned = [p for p in self.work(node) if p.not_movable_reason]
        if pinned:
            return f"pod {pinned[0].key} cannot move ({pinned[0].not_movable_reason})"
        if not self.config.node_removal_enabled:
            return "node removal is disabled in this pass"
        if not self.above_min(group, node):
            return f"group {group.id} would go below its min size {group.min_size}"
        # CA does not drain DaemonSet (or mirror) pods off a node it calls empty: a GPU one of them uses is never
        # released, and the removal would wait for it forever.
        holding = [p for p in self.snapshot.pods_on(node.name) if not is_work(p)
                   and self.cache.get(p).gpus(node.gpu_resource)]
        if holding and not group.force_detach:
            return (f"{holding[0].owner_kind} pod {holding[0].key} uses a GPU for as long as the node lives and "
                    f"force-detach is off for {group.id}")
        return ""

    def _move(self, node: NodeInfo, work: list[PodInfo]) -> Optional[list[str]]:
        """Simulate evicting the node's pods onto the other nodes; keep the placements if all fit (the moves), else
        revert, keep the node and release its idle GPUs (None)."""
        if not work:
            return []
        state = self.state
        mark = state.fork()
        state.disable(state.index[node.name])
        moves: list[str] = []
        for pod in sorted(work, key=scheduling_order):
            req = self.cache.get(pod)
            choice = self.live.fits_now(req)
            if choice is None:
                summary = self.live.explain(req, with_gpus=False).summary()
                state.revert(mark)
                usage = self.usage(node)
                self.keep(node.name, f"CA asked to remove it; it stays: pod {pod.key} fits no other node ({summary}); "
                                     f"{self.idle_fate(node, usage)}")
                self.release_idle(node, usage, f"CA asked to remove {node.name}, which stays")
                return None
            self.live.commit(req, choice)
            moves.append(f"{pod.key} -> {self.live.node_name(choice)}")
        return moves

    # --- case 4: DDS's own scan ---
    def empty_nodes(self) -> None:
        now = self.snapshot.now
        empty = [n for n in self.snapshot.nodes if n.name not in self.done and self.group(n) is not None
                 and not n.being_deleted and n.empty_since is not None and not self.work(n)]
        for node in sorted(empty, key=lambda n: (n.empty_since, n.name)):
            group = self.group(node)
            assert group is not None and node.empty_since is not None
            waited, cooldown = now - node.empty_since, group.node_idle_cooldown_seconds
            if waited < cooldown:
                self.keep_node_only(node.name, f"empty for {duration_text(waited)}; removed after "
                                               f"{duration_text(cooldown)}")
                continue
            if not self.above_min(group, node):
                self.keep_node_only(node.name, f"empty for {duration_text(waited)}, but group {group.id} is at its "
                                               f"min size {group.min_size}")
                continue
            usage = self.usage(node)
            if usage.in_use and not group.force_detach:
                self.keep_node_only(node.name, f"empty of work, but its pods use {_gpus(usage.in_use)} and "
                                               f"force-detach is off for {group.id}")
                continue
            self.remove(node, group, usage, f"no work for {duration_text(waited)} (cooldown "
                                            f"{duration_text(cooldown)}) and {group.id} stays at or above min size "
                                            f"{group.min_size}")

    def idle_gpus(self) -> None:
        now = self.snapshot.now
        for node in sorted(self.snapshot.nodes, key=lambda n: n.name):
            group = self.group(node)
            if node.name in self.done or group is None or not node.devices:
                continue
            if node.detaching:
                continue  # a detach is already on its way; idleness is judged again once it is done
            usage = self.usage(node)
            if not usage.idle:
                continue
            if node.being_deleted:
                self.release_idle(node, usage, f"{node.name} is being deleted")
                continue
            if node.gpus_idle_since is None:
                continue
            waited, cooldown = now - self.idle_since(node, group), group.gpu_idle_cooldown_seconds
            if waited >= cooldown:
                warm = self.warm.reserve(group, len(usage.idle))
                if warm:  # idle is newest first: the oldest stay warm
                    self.kept.append(Keep(node.name, f"keeps {_gpus(warm)} idle as warm headroom of {group.id}"))
                    usage = GpuUsage(usage.devices, usage.idle[:len(usage.idle) - warm], usage.in_use)
                if usage.idle and not self.held(node, usage):
                    self.idle_past_cooldown.append(IdlePastCooldown(node.name, group.id, len(usage.idle)))
                self.release_idle(node, usage, f"GPUs idle on {node.name} for {duration_text(waited)} (cooldown "
                                               f"{duration_text(cooldown)}, {_gpus(usage.in_use)} in use stay"
                                               + (f", {_gpus(warm)} kept warm" if warm else "") + ")")


def plan_scale_down(snapshot: Snapshot, config: PlannerConfig, candidates: Optional[Sequence[str]] = None,
                    hungry_pools: frozenset[str] = frozenset(), *, memos: Optional[PlannerMemos] = None
                    ) -> ScaleDownPlan:
    """`hungry_pools`: pools a pending pod waits on (dds/planner/headroom.py): no warm headroom is kept from them.
    `memos`: what an earlier decision derived (PlannerMemos, dds/planner/memos.py); a fresh one without it."""
    check_policy(config.policy)
    run = _ScaleDown(snapshot, config, hungry_pools, memos)
    for name in dict.fromkeys(candidates or ()):
        run.candidate(name)
    if config.node_removal_enabled:
        run.empty_nodes()
    else:
        run.notes.append("node removal is disabled (CA owns it): only idle GPUs are released")
    run.idle_gpus()
    plan = ScaleDownPlan(detaches=tuple(run.detaches), removals=tuple(run.removals), kept=tuple(run.kept),
                         notes=tuple(run.notes), idle_past_cooldown=tuple(run.idle_past_cooldown))
    return release_idle_cxl_memory(snapshot, plan)
