"""Pod groups read from the cluster: which pods form a gang, and how many of them must run at once.

| source (API)                                             | pods                                      | the gang's minimum            |
|----------------------------------------------------------|-------------------------------------------|-------------------------------|
| coscheduling PodGroup, `scheduling.x-k8s.io/v1alpha1`    | label `scheduling.x-k8s.io/pod-group`     | `spec.minMember`              |
| Workload, `scheduling.k8s.io/v1alpha1` (Kubernetes 1.35) | `spec.workloadRef` {name, podGroup, podGroupReplicaKey} | `spec.podGroups[name=podGroup].policy.gang.minCount` |
| PodGroup, `scheduling.k8s.io/v1alpha2` (Kubernetes 1.36) | `spec.schedulingGroup.podGroupName`       | `spec.schedulingPolicy.gang.minCount` |

On 1.36 the Workload is only a template (`spec.podGroupTemplates`); the runtime group a pod names is a PodGroup
object of its own whose policy is copied in, and kube-scheduler's GangScheduling plugin reads the PodGroup, as DDS
does (k8s.io/api v0.36 scheduling/v1alpha2, core/v1 PodSchedulingGroup; 1.36 serves no scheduling.k8s.io/v1alpha1).

A pod group with the `basic` policy is no gang; one with `gang` is (for a 1.35 Workload, once per replica key:
kube-scheduler's GangScheduling plugin applies the policy to each replica apart). A group object DDS could not read
(API not served, no RBAC, the apiserver failing) leaves the gang's minimum unknown (0): the planner then takes every
member it sees as the minimum, the cautious reading of all-or-nothing. A group object that does not exist yet: no gang
(kube-scheduler holds such pods back until it exists).

The kinds the apiserver serves when DDS starts are watched (dds/kube/cache.py; found by discovery, once:
`served_gang_apis`) and read from the watch cache with no request. A kind not watched (its CRD installed later, the cache not synced) is
listed per decision, only when a pending pod names a group of that kind, and only in the namespaces of such pods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from kubernetes import client

from dds.kube.decode import noted_unreadable
from dds.model.snapshot import POD_GROUP_LABEL, PodInfo, Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GangApi:
    """One kind DDS reads gangs from."""

    group: str
    version: str
    plural: str

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.version}.{self.group}"


COSCHEDULING = GangApi("scheduling.x-k8s.io", "v1alpha1", "podgroups")
WORKLOADS_V1ALPHA1 = GangApi("scheduling.k8s.io", "v1alpha1", "workloads")
PODGROUPS_V1ALPHA2 = GangApi("scheduling.k8s.io", "v1alpha2", "podgroups")
GANG_APIS = (COSCHEDULING, WORKLOADS_V1ALPHA1, PODGROUPS_V1ALPHA2)

# Kept for readers of the 1.35-only names.
COSCHEDULING_GROUP, COSCHEDULING_VERSION, COSCHEDULING_PLURAL = COSCHEDULING.group, COSCHEDULING.version, "podgroups"
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = WORKLOADS_V1ALPHA1.group, WORKLOADS_V1ALPHA1.version, "workloads"


@dataclass(frozen=True)
class PodGroups:
    """What was read, per `namespace/name`: a coscheduling PodGroup's minMember; a 1.35 Workload's gang minCount per
    pod group (basic-policy pod groups absent); a 1.36 PodGroup's gang minCount (None: the basic policy).
    `unread_*`: namespaces whose objects of that kind could not be read."""

    min_member: Mapping[str, int] = field(default_factory=dict)
    workload_gangs: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    scheduling_groups: Mapping[str, Optional[int]] = field(default_factory=dict)
    unread_podgroups: frozenset[str] = frozenset()
    unread_workloads: frozenset[str] = frozenset()
    unread_scheduling_groups: frozenset[str] = frozenset()


def in_a_group(pod: PodInfo) -> bool:
    return pod.workload_ref is not None or pod.scheduling_group is not None or POD_GROUP_LABEL in pod.labels


def apis_of(pod: PodInfo) -> tuple[GangApi, ...]:
    """The kinds that say whether (and how) the pod's group is a gang."""
    if pod.scheduling_group is not None:
        return (PODGROUPS_V1ALPHA2,)
    if pod.workload_ref is not None:
        return (WORKLOADS_V1ALPHA1,)
    return (COSCHEDULING,) if POD_GROUP_LABEL in pod.labels else ()


def min_member(podgroup: Mapping[str, Any]) -> int:
    """A coscheduling PodGroup's `spec.minMember` (0 when absent)."""
    return int((podgroup.get("spec") or {}).get("minMember") or 0)


def gang_min_counts(workload: Mapping[str, Any]) -> dict[str, int]:
    """A 1.35 Workload's pod groups with the gang policy, by name, with their `minCount`."""
    out = {}
    for group in (workload.get("spec") or {}).get("podGroups") or ():
        gang = (group.get("policy") or {}).get("gang")
        if gang is not None and group.get("name"):
            out[group["name"]] = int(gang.get("minCount") or 0)
    return out


def scheduling_group_min_count(podgroup: Mapping[str, Any]) -> Optional[int]:
    """A 1.36 PodGroup's `spec.schedulingPolicy.gang.minCount`; None for the basic policy (no gang)."""
    gang = ((podgroup.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
    return None if gang is None else int(gang.get("minCount") or 0)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


_READERS = {COSCHEDULING: min_member, WORKLOADS_V1ALPHA1: gang_min_counts,
            PODGROUPS_V1ALPHA2: scheduling_group_min_count}


def _each_read(kind: GangApi, items: Iterable[Mapping[str, Any]], reader: Callable[[Mapping[str, Any]], Any],
               unread: set[str]) -> dict[str, Any]:
    """`reader` on each object, by namespace/name. An object it fails on (a tenant's group with a minimum that is no
    number, a spec of the wrong shape) is that object's problem: its namespace joins `unread`, so its gangs' minimum is
    taken as every member seen, as for a group DDS could not list; logged and counted, the others read as usual."""
    out: dict[str, Any] = {}
    for item in items:
        try:
            out[_key(item)] = reader(item)
        except Exception as exc:  # any error reading this one object
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            namespace = str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""
            unread.add(namespace)
            name = meta.get("name") if isinstance(meta, Mapping) else "?"
            noted_unreadable(kind.name, f"{namespace}/{name}", exc,
                             "the minimum of its namespace's gangs is taken as every member seen")
    return out


def served_gang_apis(api: client.ApiClient) -> tuple[GangApi, ...]:
    """The gang kinds the apiserver serves now (discovery, once at start): the watch cache watches those."""
    try:
        groups = client.ApisApi(api).get_api_versions().groups or ()
    except Exception as exc:  # unreachable now: gang objects are listed per decision instead
        log.warning("cannot tell which gang APIs are served (%s): Workloads and PodGroups are listed per decision", exc)
        return ()
    served = {(g.name, v.version) for g in groups for v in g.versions or ()}
    return tuple(kind for kind in GANG_APIS if (kind.group, kind.version) in served)


class PodGroupReader:
    """Reads gang objects in the namespaces asked for: from the watch cache's collection of the kind when it has a
    synced one (`cached`: GangApi -> something with `synced` and `values()`), else with a LIST. A kind the apiserver
    does not serve (404: CRD not installed, feature gate or API version off) is read as none, not as an error."""

    def __init__(self, api: client.ApiClient, objects: Optional[Any] = None,
                 cached: Optional[Mapping[GangApi, Any]] = None) -> None:
        """`objects`: what lists the objects (a CustomObjectsApi on `api` unless given)."""
        self._custom = objects if objects is not None else client.CustomObjectsApi(api)
        self._cached = dict(cached or {})
        self._warned: set[str] = set()

    def read(self, namespaces: Iterable[str], kinds: Sequence[GangApi] = GANG_APIS) -> PodGroups:
        namespaces = sorted(set(namespaces))
        read: dict[GangApi, dict[str, Any]] = {}
        unread: dict[GangApi, set[str]] = {}
        for kind in kinds:
            items, unread[kind] = self._objects(kind, namespaces)
            read[kind] = _each_read(kind, items, _READERS[kind], unread[kind])
        return PodGroups(
            min_member=read.get(COSCHEDULING, {}),
            workload_gangs=read.get(WORKLOADS_V1ALPHA1, {}),
            scheduling_groups=read.get(PODGROUPS_V1ALPHA2, {}),
            unread_podgroups=frozenset(unread.get(COSCHEDULING, ())),
            unread_workloads=frozenset(unread.get(WORKLOADS_V1ALPHA1, ())),
            unread_scheduling_groups=frozenset(unread.get(PODGROUPS_V1ALPHA2, ())))

    def _objects(self, kind: GangApi, namespaces: Sequence[str]) -> tuple[list[Mapping[str, Any]], set[str]]:
        """The kind's objects in `namespaces`, and the namespaces it could not be read in."""
        collection = self._cached.get(kind)
        if collection is not None and collection.synced:
            wanted = set(namespaces)
            return [o for o in collection.values() if (o.get("metadata") or {}).get("namespace") in wanted], set()
        found: list[Mapping[str, Any]] = []
        unread: set[str] = set()
        for namespace in namespaces:
            listed = self._list(kind, namespace)
            if listed is None:
                unread.add(namespace)
            found.extend(listed or ())
        return found, unread

    def _list(self, kind: GangApi, namespace: str) -> Optional[list[Mapping[str, Any]]]:
        """The items; [] when the kind is not served; None when it could not be read."""
        try:
            return list(self._custom.list_namespaced_custom_object(kind.group, kind.version, namespace,
                                                                   kind.plural).get("items") or ())
        except client.ApiException as exc:
            if exc.status == 404:
                return []
            why = f"{exc.status} {exc.reason}"
        except Exception as exc:  # connection refused, TLS, timeouts: the watch cache may still serve the snapshot
            why = f"apiserver unreachable: {exc}"
        self._warn_once(kind.name, f"cannot list {kind.name} in {namespace} ({why}): the minimum of its gangs is "
                        f"taken as every member seen")
        return None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)


def pod_with_group(pod: PodInfo, groups: PodGroups) -> PodInfo:
    """The pod with its gang and the gang's minimum filled in (unchanged when it belongs to none)."""
    if pod.scheduling_group is not None:
        return _with_scheduling_group(pod, pod.scheduling_group, groups)
    ref = pod.workload_ref
    if ref is not None:
        key = f"{pod.namespace}/{ref.name}"
        gangs = groups.workload_gangs.get(key)
        if gangs is None:
            if pod.namespace in groups.unread_workloads:
                return replace(pod, pod_group=ref.gang_name, pod_group_min_member=0)
            return pod  # no such Workload: kube-scheduler holds the pod back until it exists (PreEnqueue)
        if ref.pod_group not in gangs:
            return pod  # the basic policy: scheduled pod by pod
        return replace(pod, pod_group=ref.gang_name, pod_group_min_member=gangs[ref.pod_group])
    name = pod.labels.get(POD_GROUP_LABEL)
    if name:
        return replace(pod, pod_group=name, pod_group_min_member=groups.min_member.get(f"{pod.namespace}/{name}", 0))
    return pod


def _with_scheduling_group(pod: PodInfo, name: str, groups: PodGroups) -> PodInfo:
    key = f"{pod.namespace}/{name}"
    if key not in groups.scheduling_groups:
        if pod.namespace in groups.unread_scheduling_groups:
            return replace(pod, pod_group=name, pod_group_min_member=0)
        return pod  # no such PodGroup: kube-scheduler holds the pod back until it exists (PreEnqueue)
    count = groups.scheduling_groups[key]
    if count is None:
        return pod  # the basic policy: scheduled pod by pod
    return replace(pod, pod_group=name, pod_group_min_member=count)


def namespaces_to_read(snapshot: Snapshot) -> frozenset[str]:
    """Namespaces with a pending pod in a group: only there does a gang's minimum change a decision."""
    return frozenset(p.namespace for p in snapshot.pending_pods() if in_a_group(p))


def kinds_to_read(snapshot: Snapshot) -> tuple[GangApi, ...]:
    """The gang kinds the pending pods in a group name, in GANG_APIS order."""
    wanted = {kind for p in snapshot.pending_pods() for kind in apis_of(p)}
    return tuple(kind for kind in GANG_APIS if kind in wanted)


def snapshot_with_groups(snapshot: Snapshot, groups: PodGroups) -> Snapshot:
    """The snapshot with every grouped pod's gang filled in (bound members too: they count towards the minimum)."""
    pods = tuple(pod_with_group(p, groups) if in_a_group(p) else p for p in snapshot.pods)
    return replace(snapshot, pods=pods)
