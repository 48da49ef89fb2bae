"""What a pod asks of a node: kube-scheduler's request rule, and the per-pod facts the filters need, computed once.

effective request = max(sum(app containers) + sum(sidecars),
                        max over init containers i of (init_i + sidecars declared before i))   [element-wise]
                    + pod overhead
as in k8s.io/component-helpers/resource PodRequests (sidecar = init container with restartPolicy Always; a sidecar
counts toward the app total and toward every init container that starts after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dds.model.resources import Resources
from dds.planner.selectors import unsupported_operators
from dds.model.snapshot import PodInfo

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
DAEMON_OWNERS = frozenset({"DaemonSet", "Node"})  # DaemonSet pods and mirror (static) pods are not "work"


def effective_requests(pod: PodInfo) -> Resources:
    """The resources kube-scheduler reserves for `pod` on a node (see the module docstring)."""
    overhead = pod.overhead
    has_overhead = bool(overhead.milli_cpu or overhead.memory or overhead.ephemeral_storage or overhead.pods
                        or overhead.scalar)
    if len(pod.containers) == 1 and not pod.init_containers and not has_overhead:
        return pod.containers[0].requests  # the common case, without building new vectors
    total = Resources()
    for container in pod.containers:
        total = total + container.requests
    sidecars = Resources()  # sidecars started so far, in declaration order
    init_peak = Resources()
    for container in pod.init_containers:
        if container.restartable_init:
            total = total + container.requests
            sidecars = sidecars + container.requests
            running = sidecars
        else:
            running = container.requests + sidecars
        init_peak = init_peak.max(running)
    if pod.init_containers:
        total = total.max(init_peak)
    return total + overhead if has_overhead else total


def is_work(pod: PodInfo) -> bool:
    """A pod that makes a node "not empty": anything but DaemonSet and mirror pods."""
    return pod.owner_kind not in DAEMON_OWNERS


def scheduling_order(pod: PodInfo) -> tuple[int, float, str]:
    """Pending pods are planned by priority (high first), then age (old first), then name: kube-scheduler's queue."""
    return (-pod.priority, pod.created_at, pod.key)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod with its effective requests and the facts the simulation keys on, computed once per planning pass."""

    pod: PodInfo
    requests: Resources
    unsupported: tuple[str, ...]
    static_key: tuple  # everything the label/taint filters read from the pod: equal keys -> equal verdicts
    label_keys: frozenset[str]  # node label keys the pod's selectors read
    uses_node_name: bool  # matchFields metadata.name: verdicts differ per node name
    has_placement_terms: bool  # host ports or pod (anti-)affinity: verdicts depend on other pods

    @property
    def key(self) -> str:
        return self.pod.key

    def gpus(self, resource: str) -> int:
        return self.requests.get(resource)


def pod_request(pod: PodInfo, requests: Resources | None = None) -> PodRequest:
    unsupported = list(pod.unsupported)
    for kind, terms in (("pod affinity", pod.required_pod_affinity),
                        ("pod anti-affinity", pod.required_pod_anti_affinity)):
        for term in terms:
            if term.topology_key != HOSTNAME_TOPOLOGY:
                unsupported.append(f"required {kind} on topology {term.topology_key!r} "
                                   f"(only {HOSTNAME_TOPOLOGY} is simulated)")
    unsupported += unsupported_operators(pod)
    keys = set(pod.node_selector)
    uses_node_name = False
    for term in pod.required_node_affinity:
        keys.update(r.key for r in term.match_expressions)
        uses_node_name = uses_node_name or bool(term.match_fields)
    static_key = (tuple(sorted(pod.node_selector.items())), pod.required_node_affinity, pod.tolerations)
    return PodRequest(
        pod=pod, requests=effective_requests(pod) if requests is None else requests,
        unsupported=tuple(dict.fromkeys(unsupported)),
        static_key=static_key, label_keys=frozenset(keys), uses_node_name=uses_node_name,
        has_placement_terms=bool(pod.host_ports or pod.required_pod_affinity or pod.required_pod_anti_affinity))


class LastingRequests:
    """Effective requests of bound pods across planning passes, by object identity.

    Pods are frozen, and the watch cache (dds/kube/cache.py) hands every snapshot the same PodInfo until the pod
    changes, so a pass computes requests only for the pods that changed since the last one, instead of for the whole
    cluster. Each entry holds the pod itself, so an id reused by a new object is never mistaken for the old pod; the
    table is cleared whole when it outgrows `limit` (pods gone from the cluster are forgotten that way). A pure memo:
    the same pod always gives the same requests, whichever pass computed them. Held by its user, never by this module:
    the planner's in PlannerMemos (dds/planner/memos.py), the observer's by the observer.
    """

    def __init__(self, limit: int = 500_000) -> None:
        self._limit = limit
        self._table: dict[int, tuple[PodInfo, Resources]] = {}

    def get(self, pod: PodInfo) -> Resources:
        found = self._table.get(id(pod))
        if found is not None and found[0] is pod:
            return found[1]
        if len(self._table) >= self._limit:
            self._table = {}
        requests = effective_requests(pod)
        self._table[id(pod)] = (pod, requests)
        return requests


class RequestCache:
    """Per planning pass: each pod's PodRequest (pods being placed), computed once; effective requests come from the
    lasting memo (`lasting`, a caller's that outlives the pass; else one of its own). Pods are frozen, so the object
    identity is the key (the snapshot keeps them alive for the pass)."""

    def __init__(self, lasting: Optional[LastingRequests] = None) -> None:
        self._placing: dict[int, PodRequest] = {}
        self.lasting = lasting if lasting is not None else LastingRequests()

    def requests(self, pod: PodInfo) -> Resources:
        return self.lasting.get(pod)

    def get(self, pod: PodInfo) -> PodRequest:
        found = self._placing.get(id(pod))
        if found is None or found.pod is not pod:
            found = pod_request(pod, self.requests(pod))
            self._placing[id(pod)] = found
        return found
