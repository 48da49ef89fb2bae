"""The Cluster API node backend: a group is a MachineSet or a MachineDeployment (its scalable resource, as in
cluster-autoscaler's clusterapi provider); adding nodes raises its spec.replicas, removing one marks that node's
Machine `cluster.x-k8s.io/delete-machine` and lowers replicas by one, so Cluster API's deletion order (Machines already
deleting, then marked ones, first) removes exactly that Machine. A MachineDeployment's Machines are those of the
MachineSets it owns; its controller passes the lower count to the MachineSet, whose deletion order then applies (with
several MachineSets, mid-rollout, the MachineDeployment controller picks which one shrinks). An infrastructure provider
makes the machines; in the demo and the e2e tests, Cluster API's own manager runs with the harness's kwok provider.

Idempotency: every applied request is recorded by key in the MachineSet annotation `dds.cdi.dev/scale-requests` (a JSON
list, the newest `HISTORY_LIMIT` entries), written in the same conditional patch (metadata.resourceVersion) as the
replicas it changes, so a request is either applied and recorded or neither. A retried key is answered from that record.

Removal is two writes, always in this order: the Machine annotation, then the MachineSet patch (replicas and record),
as cluster-autoscaler's clusterapi provider does them. A mark is not inert: Cluster API's next scale-down of that
MachineSet deletes marked Machines first, whoever lowered the replicas. So when the replica write fails, the mark this
call set is removed again; a mark left by a crash between the two writes (a value starting `MARK_PREFIX`, no removal
recorded for its Machine, the Machine not deleting) is removed by `release_leftover_marks` when DDS starts acting. A
retry (same key) finds the key unrecorded, marks again and completes. A Machine with a recorded removal is never
counted twice, whatever key a later call carries.

Errors are typed (`dds.nodes.errors`): an apiserver outage is `NodeBackendUnavailable` naming the group, the object and
the cause; a conflict is retried `CONFLICT_ATTEMPTS` times on a fresh read before it becomes one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from dds.crashpoints import crashpoint
from dds.kube import ApiClient, capi
from dds.kube.capi import MACHINES, MACHINESETS, SCALABLE_PLURALS, CapiNotInstalled, CapiObjects
from dds.kube.errors import ApiError
from dds.model.groups import ANN_CAPI_DELETE_MACHINE, ANN_SCALE_REQUESTS, NodeGroupSpec
from dds.nodes.base import MachineInfo, MachinePhase
from dds.nodes.errors import (MachineSetNotFound, NodeBackendError, NodeBackendUnavailable, NodeNotInGroup,
                              ScaleRefused)

log = logging.getLogger(__name__)

MARK_PREFIX = "dds at "  # the value of DDS's delete-machine marks (Cluster API reads only that the key is there)
HISTORY_LIMIT = 100  # far more than the requests in flight at once; ~10 KiB of annotation at most
CONFLICT_ATTEMPTS = 10

T = TypeVar("T")


class RequestKind(str, Enum):
    ADD = "add"
    REMOVE = "remove"


@dataclass(frozen=True)
class AppliedRequest:
    """One request applied to a MachineSet, as recorded in its `scale-requests` annotation."""

    key: str
    kind: RequestKind
    replicas: int  # spec.replicas after the request
    count: int = 0  # add: nodes added
    machine: str = ""  # remove: the Machine removed
    at: float = 0.0  # DDS's clock when applied (for people reading the annotation)


# --- pure parts ---

def read_history(annotations: Mapping[str, str]) -> tuple[AppliedRequest, ...]:
    """The recorded requests; an unreadable annotation (edited by hand) counts as empty, with a warning."""
    text = annotations.get(ANN_SCALE_REQUESTS)
    if not text:
        return ()
    try:
        entries = json.loads(text)
        return tuple(AppliedRequest(key=str(e["key"]), kind=RequestKind(e["kind"]), replicas=int(e["replicas"]),
                                    count=int(e.get("count", 0)), machine=str(e.get("machine", "")),
                                    at=float(e.get("at", 0.0))) for e in entries)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring unreadable %s annotation (%s): %.200s", ANN_SCALE_REQUESTS, exc, text)
        return ()


def history_text(history: Sequence[AppliedRequest]) -> str:
    entries = []
    for entry in history:
        data = asdict(entry)
        data["kind"] = entry.kind.value
        entries.append({k: v for k, v in data.items() if v or k in ("key", "kind", "replicas")})
    return json.dumps(entries, separators=(",", ":"))


def with_request(history: Sequence[AppliedRequest], entry: AppliedRequest,
                 limit: int = HISTORY_LIMIT) -> tuple[AppliedRequest, ...]:
    """`history` plus `entry`, keeping the newest `limit` entries."""
    return (*history, entry)[-limit:]


def find_request(history: Sequence[AppliedRequest], key: str) -> Optional[AppliedRequest]:
    return next((e for e in history if e.key == key), None)


@dataclass(frozen=True)
class ScalableRef:
    """The object a group scales: a MachineSet or a MachineDeployment."""

    kind: str
    namespace: str
    name: str

    @property
    def plural(self) -> str:
        return SCALABLE_PLURALS[self.kind]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def scalable_ref(group: NodeGroupSpec) -> ScalableRef:
    """The group's MachineSet or MachineDeployment."""
    source = group.source
    if source.kind in SCALABLE_PLURALS and source.name:
        return ScalableRef(source.kind, source.namespace or "default", source.name)
    kind, _, rest = group.id.partition("/")
    namespace, _, name = rest.partition("/")
    if kind not in SCALABLE_PLURALS or not namespace or not name or "/" in name:
        raise ValueError(f"node group {group.id} ({source.describe()}) is not a Cluster API MachineSet or "
                         f"MachineDeployment; the machineset node backend scales those only (without a cluster: "
                         f"node_backend memory)")
    return ScalableRef(kind, namespace, name)


def machine_phase(machine: Mapping[str, Any]) -> MachinePhase:
    """DDS's view of a Machine: Cluster API's phase, with the delete-machine mark counting as deleting."""
    phase = capi.phase(machine)
    if capi.is_deleting(machine) or capi.marked_for_deletion(machine) or phase in (capi.PHASE_DELETING, "Deleted"):
        return MachinePhase.DELETING
    if phase == capi.PHASE_FAILED or capi.failure_message(machine):
        return MachinePhase.FAILED
    if phase == capi.PHASE_RUNNING and capi.node_ref_name(machine):
        return MachinePhase.RUNNING
    return MachinePhase.PROVISIONING


def machine_info(group_id: str, machine: Mapping[str, Any]) -> MachineInfo:
    return MachineInfo(name=capi.name_of(machine), group_id=group_id, provider_id=capi.provider_id(machine),
                       phase=machine_phase(machine), node_name=capi.node_ref_name(machine),
                       created_at=capi.created_at(machine), error=capi.failure_message(machine))


def machine_of_node(machines: Sequence[Mapping[str, Any]], node_name: str) -> Optional[Mapping[str, Any]]:
    """The Machine whose Node is `node_name` (or, before its Node registered, the Machine of that name)."""
    by_node = next((m for m in machines if capi.node_ref_name(m) == node_name), None)
    return by_node or next((m for m in machines if capi.name_of(m) == node_name), None)


# --- the backend ---

class MachineSetProvisioner:
    """`NodeProvisioner` on Cluster API MachineSets, MachineDeployments and Machines (v1beta2 or v1beta1, whichever
    is served)."""

    def __init__(self, api: ApiClient, clock: Callable[[], float], *, request_timeout_seconds: float = 10.0,
                 history_limit: int = HISTORY_LIMIT,
                 on_written: Optional[Callable[[Mapping[str, Any]], None]] = None) -> None:
        # on_written: the watch cache's `assume`, so the next decision counts the replicas just written.
        self._capi = CapiObjects(api, request_timeout_seconds=request_timeout_seconds, on_written=on_written)
        self._clock = clock
        self._history_limit = history_limit

    def machines(self, group: NodeGroupSpec) -> tuple[MachineInfo, ...]:
        machineset = self._get_machineset(group, "listing machines")
        owned = self._owned_machines(group, machineset, "listing machines")
        infos = (machine_info(group.id, m) for m in owned)
        return tuple(sorted(infos, key=lambda m: (m.created_at, m.name)))

    def add_nodes(self, group: NodeGroupSpec, count: int, key: str) -> None:
        if count <= 0:
            raise ValueError(f"add_nodes for {group.id}: count must be positive, got {count}")
        ref = scalable_ref(group)
        what = f"adding {count} node(s) (request {key})"
        for _ in range(CONFLICT_ATTEMPTS):
            machineset = self._get_machineset(group, what)
            history = read_history(capi.annotations_of(machineset))
            if find_request(history, key) is not None:
                log.debug("%s: %s was applied already", group.id, key)
                return
            if capi.is_deleting(machineset):  # Cluster API is deleting it and its Machines: a replica would be undone
                raise MachineSetNotFound(f"{group.id}: {what}: {ref} is being deleted; nothing changed")
            current = self._current_replicas(group, machineset, what)
            wanted = current + count
            if wanted > group.max_size:
                raise ScaleRefused(f"{group.id}: {what}: {current} + {count} exceeds the maximum size "
                                   f"{group.max_size}; nothing changed")
            entry = AppliedRequest(key=key, kind=RequestKind.ADD, replicas=wanted, count=count, at=self._clock())
            if self._patch_machineset(group, machineset, history, entry, what):
                crashpoint("nodes.add.patched")
                log.info("%s: spec.replicas %d -> %d (%s)", group.id, current, wanted, what)
                return
        raise NodeBackendUnavailable(f"{group.id}: {what}: {ref} kept changing under us "
                                     f"({CONFLICT_ATTEMPTS} conflicts); nothing changed, retry with the same key")

    def remove_node(self, group: NodeGroupSpec, node_name: str, key: str) -> None:
        ref = scalable_ref(group)
        what = f"removing node {node_name} (request {key})"
        machine: Optional[Mapping[str, Any]] = None
        marked_here = False  # this call set the mark (then it is this call's to remove if the removal fails)
        for _ in range(CONFLICT_ATTEMPTS):
            machineset = self._get_machineset(group, what)
            history = read_history(capi.annotations_of(machineset))
            if find_request(history, key) is not None:
                log.debug("%s: %s was applied already", group.id, key)
                return
            owned = self._owned_machines(group, machineset, what)
            machine = machine_of_node(owned, node_name)
            if machine is None:
                known = ", ".join(sorted(capi.node_ref_name(m) or capi.name_of(m) for m in owned)) or "none"
                raise NodeNotInGroup(f"{group.id}: {what}: no Machine of {ref} has node "
                                     f"{node_name} (its nodes: {known}); nothing changed")
            machine_name = capi.name_of(machine)
            if any(e.kind == RequestKind.REMOVE and e.machine == machine_name for e in history):
                log.info("%s: %s: Machine %s is already being removed", group.id, what, machine_name)
                return
            marked_here = self._mark_for_deletion(group, machine, what) or marked_here
            crashpoint("nodes.remove.marked")
            current = self._current_replicas(group, machineset, what)
            wanted = max(0, current - 1)
            entry = AppliedRequest(key=key, kind=RequestKind.REMOVE, replicas=wanted, machine=machine_name,
                                   at=self._clock())
            try:
                patched = self._patch_machineset(group, machineset, history, entry, what)
            except NodeBackendError as exc:
                self._unmark_after_failure(group, machine, marked_here, what, exc)
                raise
            if patched:
                crashpoint("nodes.remove.patched")
                log.info("%s: Machine %s marked %s, spec.replicas %d -> %d (%s)", group.id, machine_name,
                         ANN_CAPI_DELETE_MACHINE, current, wanted, what)
                return
        failure = NodeBackendUnavailable(f"{group.id}: {what}: {ref} kept changing under us "
                                         f"({CONFLICT_ATTEMPTS} conflicts); retry with the same key")
        if machine is not None:
            self._unmark_after_failure(group, machine, marked_here, what, failure)
        raise failure

    def release_leftover_marks(self, group: NodeGroupSpec) -> tuple[str, ...]:
        """Remove the delete-machine marks DDS set on this group's Machines without completing the removal (a crash
        between the mark and the replica write): left there, Cluster API's next scale-down would delete that Machine
        instead of the one asked for. Returns the Machines released."""
        what = "releasing leftover delete-machine marks"
        machineset = self._get_machineset(group, what)
        removed = {e.machine for e in read_history(capi.annotations_of(machineset)) if e.kind == RequestKind.REMOVE}
        released = []
        for machine in self._owned_machines(group, machineset, what):
            mark = capi.annotations_of(machine).get(ANN_CAPI_DELETE_MACHINE, "")
            name = capi.name_of(machine)
            if mark.startswith(MARK_PREFIX) and name not in removed and not capi.is_deleting(machine):
                self._unmark(group, machine, what)
                log.warning("%s: Machine %s carried DDS's %s mark (%r) but no removal was recorded for it (DDS "
                            "stopped between the mark and the replica write): mark removed, so Cluster API does not "
                            "delete it at the next scale-down", group.id, name, ANN_CAPI_DELETE_MACHINE, mark)
                released.append(name)
        return tuple(released)

    # --- the pre-terminate hook (dds/controller/machine_hooks.py decides when) ---
    def set_hook(self, group: NodeGroupSpec, machine: str, hook: str, held: bool, api_version: str = "") -> None:
        """Add (`held`) or remove the annotation `hook` on the group's Machine `machine`, written in the version it was
        read in (`api_version`, e.g. cluster.x-k8s.io/v1beta2; a decision then sends no discovery request)."""
        namespace = scalable_ref(group).namespace
        body = {"metadata": {"annotations": {hook: "" if held else None}}}
        version = api_version.rpartition("/")[2]
        self._call(group, f"{'adding' if held else 'removing'} {hook}", f"patching Machine {namespace}/{machine}",
                   lambda: self._capi.patch(MACHINES, namespace, machine, body, version=version))

    # --- steps ---
    def _get_machineset(self, group: NodeGroupSpec, what: str) -> dict[str, Any]:
        """The group's scalable resource (a MachineSet or a MachineDeployment)."""
        ref = scalable_ref(group)
        return self._call(group, what, f"reading {ref}", lambda: self._capi.get(ref.plural, ref.namespace, ref.name))

    def _owned_machines(self, group: NodeGroupSpec, machineset: Mapping[str, Any], what: str) -> list[dict[str, Any]]:
        """The Machines of the group's MachineSet; of a MachineDeployment, those of every MachineSet it owns (old ones
        mid-rollout too: they are its nodes until they go)."""
        namespace = capi.namespace_of(machineset)
        owners: Sequence[Mapping[str, Any]] = (machineset,)
        if scalable_ref(group).kind == "MachineDeployment":
            sets = self._call(group, what, f"listing MachineSets in {namespace}",
                              lambda: self._capi.list(MACHINESETS, (namespace,)))
            owners = [s for s in sets if capi.owned_by(s, machineset, "MachineDeployment")]
        machines = self._call(group, what, f"listing Machines in {namespace}",
                              lambda: self._capi.list(MACHINES, (namespace,)))
        return [m for m in machines if any(capi.owned_by(m, owner) for owner in owners)]

    def _current_replicas(self, group: NodeGroupSpec, machineset: Mapping[str, Any], what: str) -> int:
        replicas = capi.spec_replicas(machineset)
        if replicas is not None:
            return replicas
        # Unset (Cluster API's defaulting webhook did not run): the Machines that exist are what is wanted now.
        owned = self._owned_machines(group, machineset, what)
        return sum(1 for m in owned if not capi.is_deleting(m) and not capi.marked_for_deletion(m))

    def _mark_for_deletion(self, group: NodeGroupSpec, machine: Mapping[str, Any], what: str) -> bool:
        """Mark the Machine; False when it was marked already (by DDS before, or by someone else)."""
        if capi.marked_for_deletion(machine):
            return False
        namespace, name = capi.namespace_of(machine), capi.name_of(machine)
        # Cluster API only checks that the annotation is there; the value says who and when, for people.
        body = {"metadata": {"annotations": {ANN_CAPI_DELETE_MACHINE: f"{MARK_PREFIX}{self._clock():.0f}"}}}
        self._call(group, what, f"marking Machine {namespace}/{name} {ANN_CAPI_DELETE_MACHINE}",
                   lambda: self._capi.patch(MACHINES, namespace, name, body))
        return True

    def _unmark(self, group: NodeGroupSpec, machine: Mapping[str, Any], what: str) -> None:
        namespace, name = capi.namespace_of(machine), capi.name_of(machine)
        body = {"metadata": {"annotations": {ANN_CAPI_DELETE_MACHINE: None}}}
        self._call(group, what, f"removing the {ANN_CAPI_DELETE_MACHINE} mark from Machine {namespace}/{name}",
                   lambda: self._capi.patch(MACHINES, namespace, name, body))

    def _unmark_after_failure(self, group: NodeGroupSpec, machine: Mapping[str, Any], marked_here: bool, what: str,
                              failure: Exception) -> None:
        """The replica write failed: take back the mark this call set (as cluster-autoscaler's clusterapi provider
        does), or Cluster API's next scale-down would delete this Machine whatever was asked. A mark that cannot be
        taken back now is left to `release_leftover_marks`, and said so."""
        if not marked_here:
            return
        try:
            self._unmark(group, machine, what)
        except NodeBackendError as exc:
            log.error("%s: %s failed (%s), and the mark on Machine %s could not be removed either (%s): it is removed "
                      "when DDS next starts acting, or by hand", group.id, what, failure, capi.name_of(machine), exc)
            return
        log.info("%s: %s failed (%s): the %s mark on Machine %s was removed again", group.id, what, failure,
                 ANN_CAPI_DELETE_MACHINE, capi.name_of(machine))

    def _patch_machineset(self, group: NodeGroupSpec, machineset: Mapping[str, Any],
                          history: Sequence[AppliedRequest], entry: AppliedRequest, what: str) -> bool:
        """Replicas and the record in one conditional patch; False on a conflict (re-read and try again)."""
        ref = scalable_ref(group)
        body = {"metadata": {"resourceVersion": capi.meta(machineset).get("resourceVersion"),
                             "annotations": {ANN_SCALE_REQUESTS: history_text(
                                 with_request(history, entry, self._history_limit))}},
                "spec": {"replicas": entry.replicas}}
        try:
            self._call(group, what, f"patching {ref}",
                       lambda: self._capi.patch(ref.plural, ref.namespace, ref.name, body), conflict_ok=True)
        except _Conflict:
            return False
        return True

    def _call(self, group: NodeGroupSpec, what: str, step: str, call: Callable[[], T], *,
              conflict_ok: bool = False) -> T:
        """Run one API call, turning its failure into a typed error that names the group, the request and the step."""
        context = f"{group.id}: {what}: {step}"
        try:
            return call()
        except ApiError as exc:
            if exc.conflict and conflict_ok:
                raise _Conflict() from exc
            raise _api_error(context, exc) from exc
        except CapiNotInstalled as exc:
            raise MachineSetNotFound(f"{context}: {exc}") from exc
        except NodeBackendError:
            raise
        except Exception as exc:  # urllib3 connection errors, TLS, timeouts: the apiserver is not answering
            raise NodeBackendUnavailable(f"{context}: apiserver unreachable: {exc}") from exc


class _Conflict(Exception):
    """A conditional write lost a race: re-read and try again."""


def _api_error(context: str, exc: ApiError) -> NodeBackendError:
    reason = f"{exc.status} {exc.reason}"
    detail = exc.message
    message = f"{context}: {reason}" + (f": {detail}" if detail else "")
    if exc.status == 404:
        return MachineSetNotFound(message + "; nothing changed")
    if exc.status in (0, 408, 409, 429) or exc.status is None or exc.status >= 500:
        return NodeBackendUnavailable(message)
    return NodeBackendError(message)
