"""Reading Dynamic Resource Allocation objects (resource.k8s.io/v1) for the planner: ResourceClaims, their templates,
ResourceSlices and DeviceClasses, as one `DraState`.

From the watch cache when it watches them and is synced (no request); otherwise one LIST per kind, through the same
decoders (dds/kube/decode.py). An apiserver that does not serve resource.k8s.io/v1 reads as no DRA objects at all.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

from kubernetes import client

from dds.kube.cache import ClusterCache, Reflector, dra_resources
from dds.kube.decode import ANN_FABRIC_DEVICES
from dds.model.dra_records import DraState

log = logging.getLogger(__name__)


class DraReader:
    def __init__(self, api: client.ApiClient, cache: Optional[ClusterCache] = None) -> None:
        self._api = api
        self._cache = cache
        self._served: Optional[bool] = None  # learnt from the first LIST: a 404 means the API is not served

    def read(self) -> DraState:
        cached = self._cache.dra if self._cache is not None else None
        if cached is not None and all(c.synced for c in cached.values()):
            return _state({name: c.values() for name, c in cached.items()})
        if self._served is False:
            return DraState()
        return _state({name: self._list(name) for name in dra_resources()})

    def _list(self, name: str) -> tuple[Any, ...]:
        reflector = Reflector(self._api, dra_resources()[name])
        try:
            reflector.relist()
        except client.ApiException as exc:
            if exc.status == 404:
                self._served = False
                log.info("resource.k8s.io/v1 is not served: no DRA objects to plan with")
                return ()
            raise
        self._served = True
        return reflector.values()


def _state(values: dict[str, tuple[Any, ...]]) -> DraState:
    return DraState(claims=tuple(values.get("resourceclaims", ())),
                    templates=tuple(values.get("resourceclaimtemplates", ())),
                    slices=tuple(values.get("resourceslices", ())),
                    classes=tuple(values.get("deviceclasses", ())))


class ClaimBindingWriter:
    """Pool mode's writes on a ResourceClaim: which fabric devices DDS attached for it (an annotation, so a detach
    leaves them alone even after a restart), and the binding condition kube-scheduler waits for in PreBind."""

    def __init__(self, api: client.ApiClient, request_timeout_seconds: float = 10.0) -> None:
        self._client = api
        self._api = client.ResourceV1Api(api)
        self._timeout = request_timeout_seconds

    def record_devices(self, namespace: str, name: str, fabric_ids: Sequence[str]) -> None:
        body = {"metadata": {"annotations": {ANN_FABRIC_DEVICES: ",".join(fabric_ids)}}}
        self._api.patch_namespaced_resource_claim(name, namespace, body, _request_timeout=self._timeout)

    def set_condition(self, namespace: str, name: str, device: tuple[str, str, str], condition: str, reason: str,
                      message: str) -> None:
        """Set `condition` True on the claim's status.devices entry for (driver, pool, device), with the claim's
        resourceVersion (a conflict fails and the next pass tries again)."""
        claim = self._client.sanitize_for_serialization(
            self._api.read_namespaced_resource_claim(name, namespace, _request_timeout=self._timeout))
        status = claim.setdefault("status", {})
        driver, pool, device_name = device
        devices = status.setdefault("devices", [])
        entry = next((d for d in devices if (d.get("driver"), d.get("pool"), d.get("device")) == device), None)
        if entry is None:
            entry = {"driver": driver, "pool": pool, "device": device_name}
            devices.append(entry)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [c for c in entry.get("conditions") or () if c.get("type") != condition]
        conditions.append({"type": condition, "status": "True", "reason": reason, "message": message[:1000],
                           "lastTransitionTime": now, "observedGeneration": claim["metadata"].get("generation")})
        entry["conditions"] = conditions
        self._api.replace_namespaced_resource_claim_status(name, namespace, claim, _request_timeout=self._timeout)
