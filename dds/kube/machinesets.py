"""Read Cluster API MachineSets and MachineDeployments (cluster.x-k8s.io v1beta2 or v1beta1) through the
custom-objects API: the two kinds a node group can scale, as cluster-autoscaler's clusterapi provider has them.

Only reads: turning a MachineSet into a node group is dds/groups/sources.py's job, scaling one is dds/nodes'.
The served version is discovered once (newest first) and kept; a 404 for every version means Cluster API is not
installed, which is "no MachineSets", not an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from kubernetes import client

from dds.kube.capi import CAPI_GROUP, MACHINEDEPLOYMENTS, MACHINESETS, CapiNotInstalled, CapiObjects
from dds.kube.errors import ApiError

log = logging.getLogger(__name__)

PLURAL = MACHINESETS


class MachineSetReadError(Exception):
    """MachineSets could not be listed (apiserver unreachable, forbidden, ...): usually transient."""


@dataclass(frozen=True)
class MachineSetObject:
    """The fields of a MachineSet or MachineDeployment that a node group is built from, the same for v1beta1 and
    v1beta2 (both kinds have spec.replicas and spec.template)."""

    namespace: str
    name: str
    api_version: str
    uid: str
    annotations: Mapping[str, str]
    replicas: Optional[int]  # spec.replicas; None when unset (v1beta2 leaves it to defaulting)
    template_taints: tuple[Mapping[str, str], ...] = ()  # spec.template.spec.taints (v1beta2, CAPI 1.12+)
    owner_deployment: str = ""  # a MachineSet's: the MachineDeployment that owns it (and sets its replicas), if any
    kind: str = "MachineSet"  # or "MachineDeployment"

    @property
    def group_id(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


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
        template_taints=tuple(t for t in taints if isinstance(t, Mapping)),
        owner_deployment=next((str(o.get("name", "")) for o in meta.get("ownerReferences") or ()
                               if o.get("kind") == "MachineDeployment"), ""),
        kind="MachineDeployment" if item.get("kind") == "MachineDeployment" else "MachineSet")


class MachineSetLister:
    def __init__(self, api: client.ApiClient, namespaces: Sequence[str] = ()) -> None:
        self._capi = CapiObjects(api)
        self._namespaces = tuple(namespaces)
        self._logged_version: Optional[str] = None

    def list(self) -> list[MachineSetObject]:
        """All MachineSets and MachineDeployments in the configured namespaces (all namespaces when none are
        configured)."""
        try:
            items = self._capi.list(MACHINESETS, self._namespaces)
            items += [dict(item, kind="MachineDeployment") for item in self._deployments()]
            version = self._capi.version()
        except CapiNotInstalled:
            log.debug("Cluster API is not installed (no %s served): no MachineSet node groups", PLURAL)
            return []
        except ApiError as exc:
            if exc.not_found:
                # The version we used disappeared (Cluster API upgraded): discover again on the next call.
                self._capi.forget_version()
                raise MachineSetReadError(f"{PLURAL}.{CAPI_GROUP}: the version in use is no longer served") from exc
            raise MachineSetReadError(f"listing {PLURAL}.{CAPI_GROUP}: {exc.status} {exc.reason}") from exc
        except Exception as exc:  # connection refused, TLS, timeouts: all transient from our side
            raise MachineSetReadError(f"listing {PLURAL}.{CAPI_GROUP}: {exc}") from exc
        if self._logged_version != version:
            log.info("reading Cluster API MachineSets as %s/%s", CAPI_GROUP, version)
            self._logged_version = version
        return [machineset_from_object(item) for item in items]

    def _deployments(self) -> list[dict[str, Any]]:
        """MachineDeployments; none where only MachineSets are served (a cluster with MachineSet CRDs alone)."""
        try:
            return self._capi.list(MACHINEDEPLOYMENTS, self._namespaces)
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
