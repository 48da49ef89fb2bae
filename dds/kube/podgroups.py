"""Pod groups read from the cluster: which pods form a gang, and how many of them must run at once.

| source (API)                                             | pods                                      | the gang's minimum            |
|----------------------------------------------------------|-------------------------------------------|-------------------------------|
| coscheduling PodGroup, `scheduling.x-k8s.io/v1alpha1`    | label `scheduling.x-k8s.io/pod-group`     | `spec.minMember`              |
| Workload, `scheduling.k8s.io/v1alpha1` (Kubernetes 1.35) | `spec.workloadRef` {name, podGroup, podGroupReplicaKey} | `spec.podGroups[name=podGroup].policy.gang.minCount` |

A Workload pod group with the `basic` policy is no gang; one with `gang` is, once per replica key (kube-scheduler's
GangScheduling plugin applies the policy to each replica apart). A Workload or PodGroup DDS could not read (not
created yet, API not served, the apiserver failing) leaves the gang's minimum unknown (0): the planner then takes every
member it sees as the minimum, the cautious reading of all-or-nothing.

Read only when a pending pod belongs to a group, and only in the namespaces of such pods: one LIST per kind and
namespace per decision, none at all in clusters without gangs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional

from kubernetes import client

from dds.planner.gangs import POD_GROUP_LABEL
from dds.planner.snapshot import PodInfo, Snapshot

log = logging.getLogger(__name__)

COSCHEDULING_GROUP, COSCHEDULING_VERSION, COSCHEDULING_PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = "scheduling.k8s.io", "v1alpha1", "workloads"


@dataclass(frozen=True)
class PodGroups:
    """What was read: per `namespace/name`, a coscheduling PodGroup's minMember, and a Workload's gang minCount per
    pod group (basic-policy pod groups absent). `unread`: namespaces whose objects of that kind could not be read."""

    min_member: Mapping[str, int] = field(default_factory=dict)
    workload_gangs: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    unread_podgroups: frozenset[str] = frozenset()
    unread_workloads: frozenset[str] = frozenset()


def in_a_group(pod: PodInfo) -> bool:
    return pod.workload_ref is not None or POD_GROUP_LABEL in pod.labels


def min_member(podgroup: Mapping[str, Any]) -> int:
    """A coscheduling PodGroup's `spec.minMember` (0 when absent)."""
    return int((podgroup.get("spec") or {}).get("minMember") or 0)


def gang_min_counts(workload: Mapping[str, Any]) -> dict[str, int]:
    """A Workload's pod groups with the gang policy, by name, with their `minCount`."""
    out = {}
    for group in (workload.get("spec") or {}).get("podGroups") or ():
        gang = (group.get("policy") or {}).get("gang")
        if gang is not None and group.get("name"):
            out[group["name"]] = int(gang.get("minCount") or 0)
    return out


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodGroupReader:
    """Lists PodGroups and Workloads in the namespaces asked for. A kind the apiserver does not serve (404: CRD not
    installed, feature gate off) is read as none, not as an error."""

    def __init__(self, api: client.ApiClient, objects: Optional[Any] = None) -> None:
        """`objects`: what lists the objects (a CustomObjectsApi on `api` unless given)."""
        self._custom = objects if objects is not None else client.CustomObjectsApi(api)
        self._warned: set[str] = set()

    def read(self, namespaces: Iterable[str]) -> PodGroups:
        min_members: dict[str, int] = {}
        workload_gangs: dict[str, dict[str, int]] = {}
        unread_podgroups: set[str] = set()
        unread_workloads: set[str] = set()
        for namespace in sorted(set(namespaces)):
            podgroups = self._list(COSCHEDULING_GROUP, COSCHEDULING_VERSION, COSCHEDULING_PLURAL, namespace)
            if podgroups is None:
                unread_podgroups.add(namespace)
            for item in podgroups or ():
                min_members[_key(item)] = min_member(item)
            workloads = self._list(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, namespace)
            if workloads is None:
                unread_workloads.add(namespace)
            for item in workloads or ():
                workload_gangs[_key(item)] = gang_min_counts(item)
        return PodGroups(min_members, workload_gangs, frozenset(unread_podgroups), frozenset(unread_workloads))

    def _list(self, group: str, version: str, plural: str, namespace: str) -> Optional[list[Mapping[str, Any]]]:
        """The items; [] when the kind is not served; None when it could not be read."""
        try:
            return list(self._custom.list_namespaced_custom_object(group, version, namespace, plural).get("items")
                        or ())
        except client.ApiException as exc:
            if exc.status == 404:
                return []
            why = f"{exc.status} {exc.reason}"
        except Exception as exc:  # connection refused, TLS, timeouts: the watch cache may still serve the snapshot
            why = f"apiserver unreachable: {exc}"
        self._warn_once(f"{plural}.{group}", f"cannot list {plural}.{group} in {namespace} ({why}): the minimum of "
                        f"its gangs is taken as every member seen")
        return None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)


def pod_with_group(pod: PodInfo, groups: PodGroups) -> PodInfo:
    """The pod with its gang and the gang's minimum filled in (unchanged when it belongs to none)."""
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


def namespaces_to_read(snapshot: Snapshot) -> frozenset[str]:
    """Namespaces with a pending pod in a group: only there does a gang's minimum change a decision."""
    return frozenset(p.namespace for p in snapshot.pending_pods() if in_a_group(p))


def snapshot_with_groups(snapshot: Snapshot, groups: PodGroups) -> Snapshot:
    """The snapshot with every grouped pod's gang filled in (bound members too: they count towards the minimum)."""
    pods = tuple(pod_with_group(p, groups) if in_a_group(p) else p for p in snapshot.pods)
    return replace(snapshot, pods=pods)
