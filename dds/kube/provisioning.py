"""ProvisioningRequests (autoscaling.x-k8s.io/v1) of DDS's class, and the PodTemplates they name, read from the
apiserver; their conditions written back (docs/kueue.md). Requests of cluster-autoscaler's atomic class
(`best-effort-atomic-scale-up.autoscaling.x-k8s.io`) are read too: CA's scale-up for them reaches DDS as an
IncreaseSize with no pod behind it, which DDS plans for their pods (dds/controller/ca_requests.py); their conditions
are CA's, never written here.

Requests are listed in every namespace each pass (Kueue creates one per workload waiting for admission: few), and
only those of the two classes are decoded. Each request is read on its own: one a tenant wrote badly (a template missing
or malformed, a count out of range, resources no pod could ask for) is returned with `error` set — the controller
refuses it with an Event and `Failed` — and never stops the others. The templates are read only for requests still to
provision, or provisioned and still booked (the booked nodes must still hold the pods to come: `CapacityRevoked`
otherwise); for the others, and for a booked one whose template has gone, the pods are counted from the spec.

A cluster that serves no ProvisioningRequest API (the CRD not installed: 404) has none; any other failure to list
leaves the view incomplete, so no booking is released for a request that was merely not read.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional, Sequence

from kubernetes import client

from dds.kube.decode import noted_unreadable, pod_info, timestamp
from dds.kube.errors import api_errors
from dds.model.provisioning import (API_GROUP, API_VERSION, BOOKING_EXPIRED, CA_ATOMIC_CLASS, CAPACITY_CONSUMED,
                                    CAPACITY_REVOKED, FAILED, PLURAL, PROVISIONED, Condition, PodSet,
                                    ProvisioningRequest, ProvisioningView)

log = logging.getLogger(__name__)

# The most pods one request may ask DDS to plan: each is a virtual pod in every pass until the request is provisioned,
# so a count of 2^31 from a tenant must be refused, not planned. Kueue's own requests carry a job's pods (a few
# hundred at most); the CRD allows 32 pod sets of int32 counts.
MAX_PODS = 4096

Obj = Mapping[str, Any]
_EMPTY: Obj = {}


class RequestInvalid(ValueError):
    """What makes a request unservable, said to its author."""


def conditions_of(obj: Obj) -> dict[str, Condition]:
    out = {}
    for item in (obj.get("status") or _EMPTY).get("conditions") or ():
        if isinstance(item, Mapping) and item.get("type"):
            out[str(item["type"])] = Condition(str(item.get("status") or ""), str(item.get("reason") or ""),
                                               str(item.get("message") or ""),
                                               timestamp(item.get("lastTransitionTime")))
    return out


def pod_sets_of(obj: Obj) -> list[tuple[str, int]]:
    """(template name, count) per pod set; raises RequestInvalid when the spec is not one DDS can serve."""
    sets = (obj.get("spec") or _EMPTY).get("podSets")
    if not isinstance(sets, list) or not sets:
        raise RequestInvalid("spec.podSets is empty")
    out = []
    for index, item in enumerate(sets):
        item = item if isinstance(item, Mapping) else _EMPTY
        ref = item.get("podTemplateRef")
        name, count = (ref.get("name") if isinstance(ref, Mapping) else None), item.get("count")
        if not isinstance(name, str) or not name:
            raise RequestInvalid(f"spec.podSets[{index}] names no podTemplateRef")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise RequestInvalid(f"spec.podSets[{index}].count {count!r} is not a positive whole number")
        out.append((name, count))
    total = sum(count for _, count in out)
    if total > MAX_PODS:
        raise RequestInvalid(f"asks for {total} pods, more than the {MAX_PODS} DDS plans for one request")
    return out


class ProvisioningRequestReader:
    """The requests of one class (`class_name`) and of CA's atomic class, with their templates, each read on its
    own."""

    def __init__(self, api: client.ApiClient, class_name: str, cached: Optional[Any] = None,
                 served: Optional[Callable[[], bool]] = None, recheck_seconds: float = 60.0) -> None:
        """`cached`: the watch cache's collection of requests (`ClusterCache.provisioning`); read from it once it has
        synced, else listed every pass. `served`: with a watch cache whose API was not served at start, asked (a
        discovery GET, at most every `recheck_seconds`) whether it is now, so that a cluster without the CRD is not
        sent a LIST every pass; without either, requests are listed every pass."""
        self._api = api
        self._cached = cached
        self._served = served
        self._recheck_seconds = recheck_seconds
        self._served_checked_at: Optional[float] = None
        self._served_now = False
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._class = class_name
        self._warned = False

    def read(self) -> ProvisioningView:
        if not self._class:
            return ProvisioningView()
        if self._cached is not None and self._cached.synced:
            return self._view(self._cached.values())
        if self._cached is None and self._served is not None and not self._api_served():
            return ProvisioningView()
        try:
            listed = self._custom.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
        except client.ApiException as exc:
            if exc.status == 404:
                return ProvisioningView()  # the API is not served: no request to serve
            return self._unread(f"{exc.status} {exc.reason}")
        except Exception as exc:  # connection refused, TLS, timeouts
            return self._unread(f"apiserver unreachable: {exc}")
        return self._view(listed.get("items") or ())

    def _api_served(self) -> bool:
        now = time.monotonic()
        if self._served_checked_at is None or now - self._served_checked_at >= self._recheck_seconds:
            self._served_checked_at = now
            assert self._served is not None
            served = self._served()
            if served and not self._served_now:
                log.info("ProvisioningRequests are served now: listed every pass until DDS restarts and watches them")
            self._served_now = served
        return self._served_now

    def _view(self, objects: Sequence[Any]) -> ProvisioningView:
        self._warned = False
        classes = (self._class, CA_ATOMIC_CLASS)
        items = [o for o in objects if isinstance(o, Mapping)
                 and (o.get("spec") or _EMPTY).get("provisioningClassName") in classes]
        return ProvisioningView(tuple(self._request(o) for o in items))

    def _unread(self, why: str) -> ProvisioningView:
        if not self._warned:
            self._warned = True
            log.warning("cannot list provisioningrequests (%s): none is served, and no booking is released, until "
                        "they can be read", why)
        return ProvisioningView(complete=False)

    def _request(self, obj: Obj) -> ProvisioningRequest:
        meta = obj.get("metadata") or _EMPTY
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        conditions = conditions_of(obj)
        class_name = str((obj.get("spec") or _EMPTY).get("provisioningClassName") or "")
        request = ProvisioningRequest(namespace, name, str(meta.get("uid") or ""),
                                      timestamp(meta.get("creationTimestamp")), conditions=conditions,
                                      class_name=class_name)
        try:
            sets = pod_sets_of(obj)
            if not _booking_in_force(request) and any(request.is_true(k) for k in _PLANNED_NO_MORE):
                return _with_sets(request, _placeholders(namespace, sets))  # the count is all that is needed
            try:
                return _with_sets(request, [(self._template(namespace, t), c) for t, c in sets])
            except Exception:
                if not _booking_in_force(request):
                    raise
                # A provisioned request is never refused for a template it was served on (gone, or not read this
                # pass): the pods Kueue made from it say what they need.
                return _with_sets(request, _placeholders(namespace, sets))
        except Exception as exc:  # a tenant's object: whatever is wrong with it, it alone is refused
            error = noted_unreadable("ProvisioningRequest", f"{namespace}/{name}", exc, "refused")
            return ProvisioningRequest(namespace, name, request.uid, request.created_at, conditions=conditions,
                                       error=str(exc) if isinstance(exc, RequestInvalid) else error,
                                       class_name=class_name)

    def _template(self, namespace: str, name: str):
        try:
            template = self._core.read_namespaced_pod_template(name, namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                raise RequestInvalid(f"PodTemplate {namespace}/{name} does not exist") from exc
            raise
        body = self._api.sanitize_for_serialization(template)
        pod = (body.get("template") or {})
        return pod_info({"metadata": {**(pod.get("metadata") or {}), "name": name, "namespace": namespace},
                         "spec": pod.get("spec") or {}})


_PLANNED_NO_MORE = (PROVISIONED, FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED)


def _booking_in_force(request: ProvisioningRequest) -> bool:
    """Provisioned and still booked for pods to come: not consumed, expired, failed or revoked. (For CA's class DDS
    checks no capacity lost, so once CA says Provisioned the count from the spec is all DDS needs.)"""
    if request.cluster_autoscalers:
        return False
    provisioned = request.conditions.get(PROVISIONED)
    return (provisioned is not None and provisioned.status == "True" and provisioned.reason != CAPACITY_CONSUMED
            and not any(request.is_true(k) for k in (FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED)))


def _placeholders(namespace: str, sets: Sequence[tuple[str, int]]) -> list[tuple[Any, int]]:
    return [(pod_info({"metadata": {"name": t, "namespace": namespace}}), c) for t, c in sets]


def _with_sets(request: ProvisioningRequest, sets: Sequence[tuple[Any, int]]) -> ProvisioningRequest:
    return ProvisioningRequest(request.namespace, request.name, request.uid, request.created_at,
                               tuple(PodSet(template, count) for template, count in sets), request.conditions,
                               class_name=request.class_name)


def _rfc3339(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ProvisioningRequestWriter:
    """Conditions written on a request's status: read, merged by type (a condition's lastTransitionTime moves only
    when its status changes), written back with the resourceVersion read (a conflict raises; the next pass tries
    again). Every refusal is raised as dds.kube.errors.ApiError."""

    def __init__(self, api: client.ApiClient, cached: Optional[Any] = None) -> None:
        """`cached`: the watch cache's collection of requests: each write's answer is kept there at once
        (`Collection.assume`), so the pass that wrote a condition reads it back."""
        self._custom = client.CustomObjectsApi(api)
        self._cached = cached

    def set_conditions(self, namespace: str, name: str, changes: Sequence[tuple[str, str, str, str]],
                       now: float) -> None:
        """`changes`: (type, status, reason, message)."""
        with api_errors():
            obj = self._custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
            merged = merged_conditions((obj.get("status") or _EMPTY).get("conditions") or [], changes, now,
                                       (obj.get("metadata") or _EMPTY).get("generation"))
            body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "status": {"conditions": merged}}
            written = self._custom.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, namespace, PLURAL,
                                                                         name, body)
        if self._cached is not None and isinstance(written, Mapping):
            self._cached.assume(dict(written))


def merged_conditions(current: Sequence[Obj], changes: Sequence[tuple[str, str, str, str]], now: float,
                      generation: Optional[int] = None) -> list[dict[str, Any]]:
    out = [dict(c) for c in current if isinstance(c, Mapping)]
    for kind, status, reason, message in changes:
        entry: dict[str, Any] = {"type": kind, "status": status, "reason": reason, "message": message[:32000]}
        if generation is not None:
            entry["observedGeneration"] = generation
        found = next((c for c in out if c.get("type") == kind), None)
        if found is None:
            entry["lastTransitionTime"] = _rfc3339(now)
            out.append(entry)
            continue
        entry["lastTransitionTime"] = found.get("lastTransitionTime") if found.get("status") == status \
            and found.get("lastTransitionTime") else _rfc3339(now)
        found.clear()
        found.update(entry)
    return out
