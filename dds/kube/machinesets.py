"""Read Cluster API MachineSets (cluster.x-k8s.io v1beta2 or v1beta1) through the custom-objects API.

Only reads: turning a MachineSet into a node group is dds/provider/sources.py's job, scaling one is dds/nodes'.
The served version is discovered once (newest first) and kept; a 404 for every version means Cluster API is not
installed, which is "no MachineSets", not an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from kubernetes import client

log = logging.getLogger(__name__)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSIONS = ("v1beta2", "v1beta1")  # newest first
PLURAL = "machinesets"


class MachineSetReadError(Exception):
    """MachineSets could not be listed (apiserver unreachable, forbidden, ...): usually transient."""


@dataclass(frozen=True)
class MachineSetObject:
    """The fields of a MachineSet that a node group is built from, the same for v1beta1 and v1beta2."""

    namespace: str
    name: str
    api_version: str
    uid: str
    annotations: Mapping[str, str]
    replicas: Optional[int]  # spec.replicas; None when unset (v1beta2 leaves it to defaulting)
    template_taints: tuple[Mapping[str, str], ...] = ()  # spec.template.spec.taints (v1beta2, CAPI 1.12+)

    @property
    def group_id(self) -> str:
        return f"MachineSet/{self.namespace}/{self.name}"


def machineset_from_object(item: Mapping[str, Any]) -> MachineSetObject:
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    template = spec.get("template") or {}
    replicas = spec.get("replicas")
    taints = (template.get("spec") or {}).get("taints") or ()
    return MachineSetObject(
        namespace=meta.get("namespace", "default"), name=meta.get("name", ""),
        api_version=item.get("apiVersion", ""), uid=meta.get("uid", ""),
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        replicas=None if replicas is None else replicas,
        template_taints=tuple(t for t in taints if isinstance(t, Mapping)))


class MachineSetLister:
    def __init__(self, api: client.ApiClient, namespaces: Sequence[str] = ()) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._namespaces = tuple(namespaces)
        self._version: Optional[str] = None

    @property
    def version(self) -> Optional[str]:
        return self._version

    def list(self) -> list[MachineSetObject]:
        """All MachineSets in the configured namespaces (all namespaces when none are configured)."""
        versions = (self._version,) if self._version else CAPI_VERSIONS
        for version in versions:
            try:
                items = self._list_version(version)
            except client.ApiException as exc:
                if exc.status == 404:
                    continue
                raise MachineSetReadError(
                    f"listing {PLURAL}.{version}.{CAPI_GROUP}: {exc.status} {exc.reason}") from exc
            except Exception as exc:  # connection refused, TLS, timeouts: all transient from our side
                raise MachineSetReadError(f"listing {PLURAL}.{version}.{CAPI_GROUP}: {exc}") from exc
            if self._version != version:
                log.info("reading Cluster API MachineSets as %s/%s", CAPI_GROUP, version)
            self._version = version
            return [machineset_from_object(item) for item in items]
        if self._version is not None:
            # The version we used disappeared (Cluster API upgraded): discover again on the next call.
            self._version = None
            raise MachineSetReadError(f"{PLURAL}.{versions[0]}.{CAPI_GROUP} is no longer served")
        log.debug("Cluster API is not installed (no %s served): no MachineSet node groups", PLURAL)
        return []

    def _list_version(self, version: str) -> list[dict[str, Any]]:
        if not self._namespaces:
            return list(self._custom.list_cluster_custom_object(CAPI_GROUP, version, PLURAL).get("items", []))
        items: list[dict[str, Any]] = []
        for namespace in self._namespaces:
            items += self._custom.list_namespaced_custom_object(CAPI_GROUP, version, namespace, PLURAL).get("items", [])
        return items
