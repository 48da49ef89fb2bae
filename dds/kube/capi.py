"""Cluster API MachineSets and Machines as plain dicts, for the node backends that write them (dds/nodes).

`CapiObjects` is the thin I/O edge: list, get, create, patch and delete through the custom-objects API, on the served
version (v1beta2 preferred, v1beta1 accepted; discovered once and kept). Status is written through the status
subresource, as Cluster API's own CRDs define it; a CRD without one gets the status in the main object instead.
API errors are raised as `dds.kube.errors.ApiError` (connection errors as they come): the callers know what a 404 or
a 409 means for them.

The functions below it read the fields both versions share, without I/O.
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from kubernetes import client

from dds.kube.errors import ApiError, api_errors
from dds.model.groups import ANN_CAPI_DELETE_MACHINE

log = logging.getLogger(__name__)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSIONS = ("v1beta2", "v1beta1")  # newest first

MACHINESETS = "machinesets"
MACHINES = "machines"
MACHINEDEPLOYMENTS = "machinedeployments"
# The plural of each kind a node group can scale (cluster-autoscaler's clusterapi provider scales the same two).
SCALABLE_PLURALS = {"MachineSet": MACHINESETS, "MachineDeployment": MACHINEDEPLOYMENTS}

# Labels and Node annotations as Cluster API sets them (and cluster-autoscaler's clusterapi provider reads them).
LABEL_SET_NAME = "cluster.x-k8s.io/set-name"
LABEL_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
# Set by the MachineDeployment controller on its MachineSets and their Machine template (so on every Machine).
LABEL_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"
NODE_ANN_MACHINE = "cluster.x-k8s.io/machine"
NODE_ANN_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
NODE_ANN_CLUSTER_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"
NODE_ANN_OWNER_KIND = "cluster.x-k8s.io/owner-kind"
NODE_ANN_OWNER_NAME = "cluster.x-k8s.io/owner-name"

# A Machine annotation with this prefix holds its deletion after the drain, before the host is deleted, until whoever
# set it removes it (Cluster API never times a hook out). DDS's: the GPUs go back to the pool before the host goes.
PRE_TERMINATE_HOOK_PREFIX = "pre-terminate.delete.hook.machine.cluster.x-k8s.io"
DDS_PRE_TERMINATE_HOOK = f"{PRE_TERMINATE_HOOK_PREFIX}/dds"
# The Machine's Deleting condition reason while pre-terminate hooks hold it (the node is drained by then).
WAITING_FOR_PRE_TERMINATE_HOOK = "WaitingForPreTerminateHook"

# Machine.status.phase values (Cluster API's MachinePhase).
PHASE_PENDING = "Pending"
PHASE_PROVISIONING = "Provisioning"
PHASE_PROVISIONED = "Provisioned"
PHASE_RUNNING = "Running"
PHASE_DELETING = "Deleting"
PHASE_FAILED = "Failed"

_MAX_LABEL_VALUE = 63

Obj = dict[str, Any]


class CapiNotInstalled(Exception):
    """No Cluster API version is served (the CRDs are not installed)."""


class CapiObjects:
    def __init__(self, api: client.ApiClient, *, request_timeout_seconds: float = 10.0,
                 preferred_version: Optional[str] = None, on_written: Optional[Callable[[Obj], None]] = None) -> None:
        self._custom = client.CustomObjectsApi(api)
        # Told every object a patch answered (the watch cache's `assume`: decisions read DDS's own writes at once).
        self._on_written = on_written
        self._timeout = request_timeout_seconds
        self._version: Optional[str] = None
        self._preferred = preferred_version
        self._no_status_subresource: set[str] = set()

    # --- the served version ---
    def version(self, namespace: Optional[str] = None) -> str:
        """The Cluster API version to use, discovered on first use (a 404 for every version: `CapiNotInstalled`)."""
        if self._version is not None:
            return self._version
        candidates = tuple(dict.fromkeys(v for v in (self._preferred, *CAPI_VERSIONS) if v))
        for version in candidates:
            if not self.serves(MACHINESETS, version, namespace):
                continue
            self._version = version
            log.debug("writing Cluster API objects as %s/%s", CAPI_GROUP, version)
            return version
        raise CapiNotInstalled(f"{MACHINESETS}.{CAPI_GROUP} is not served in any of {', '.join(candidates)}")

    def serves(self, plural: str, version: str, namespace: Optional[str] = None) -> bool:
        """Whether `plural` is served in `version` (MachineDeployments are not where only MachineSet CRDs are
        installed)."""
        if namespace:
            return _found(lambda: self._custom.list_namespaced_custom_object(
                CAPI_GROUP, version, namespace, plural, limit=1, _request_timeout=self._timeout))
        return _found(lambda: self._custom.list_cluster_custom_object(
            CAPI_GROUP, version, plural, limit=1, _request_timeout=self._timeout))

    def forget_version(self) -> None:
        """Discover again on the next call (the version in use stopped being served)."""
        self._version = None

    @property
    def api_version(self) -> str:
        return f"{CAPI_GROUP}/{self.version()}"

    # --- reads ---
    def list(self, plural: str, namespaces: Sequence[str] = ()) -> list[Obj]:
        """Objects in `namespaces`, or in every namespace when none are given."""
        version = self.version(namespaces[0] if namespaces else None)
        with api_errors():
            if not namespaces:
                return list(self._custom.list_cluster_custom_object(
                    CAPI_GROUP, version, plural, _request_timeout=self._timeout).get("items", []))
            items: list[Obj] = []
            for namespace in namespaces:
                items += self._custom.list_namespaced_custom_object(
                    CAPI_GROUP, version, namespace, plural, _request_timeout=self._timeout).get("items", [])
        return items

    def get(self, plural: str, namespace: str, name: str) -> Obj:
        version = self.version(namespace)
        with api_errors():
            return self._custom.get_namespaced_custom_object(CAPI_GROUP, version, namespace, plural, name,
                                                             _request_timeout=self._timeout)

    # --- writes ---
    def create(self, plural: str, namespace: str, body: Obj) -> Obj:
        version = self.version(namespace)
        with api_errors():
            return self._custom.create_namespaced_custom_object(CAPI_GROUP, version, namespace, plural, body,
                                                                _request_timeout=self._timeout)

    def patch(self, plural: str, namespace: str, name: str, body: Obj, version: str = "") -> Obj:
        """A JSON merge patch; put metadata.resourceVersion in `body` to make it conditional (409 when stale).
        `version`: the one the object was read in (no discovery needed), else the served version."""
        version = version or self.version(namespace)
        with api_errors():
            written = self._custom.patch_namespaced_custom_object(CAPI_GROUP, version, namespace, plural, name, body,
                                                                  _request_timeout=self._timeout)
        if self._on_written is not None and isinstance(written, dict):
            self._on_written(written)
        return written

    def patch_status(self, plural: str, namespace: str, name: str, status: Obj) -> Obj:
        body = {"status": status}
        if plural not in self._no_status_subresource:
            try:
                return self._custom.patch_namespaced_custom_object_status(
                    CAPI_GROUP, self.version(namespace), namespace, plural, name, body, _request_timeout=self._timeout)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise ApiError.of(exc) from exc
                self.get(plural, namespace, name)  # raises 404 when the object itself is gone
                log.info("%s.%s has no status subresource: writing status in the object", plural, CAPI_GROUP)
                self._no_status_subresource.add(plural)
        return self.patch(plural, namespace, name, body)

    def delete(self, plural: str, namespace: str, name: str) -> bool:
        """Delete; False when it was already gone."""
        version = self.version(namespace)
        return _found(lambda: self._custom.delete_namespaced_custom_object(
            CAPI_GROUP, version, namespace, plural, name, _request_timeout=self._timeout))


def _found(call: Callable[[], Any]) -> bool:
    """Run `call`: False on a 404, True otherwise; any other API error raised as ApiError."""
    try:
        call()
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise ApiError.of(exc) from exc
    return True


# --- pure readers over the dicts (the same fields in v1beta1 and v1beta2) ---

def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name", ""))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace", "default"))


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (meta(obj).get("annotations") or {}).items()}


def owner_of_kind(obj: Mapping[str, Any], kind: str) -> Optional[Mapping[str, Any]]:
    """The object's ownerReference of that kind, if any."""
    return next((o for o in meta(obj).get("ownerReferences") or () if o.get("kind") == kind), None)


def owner_machineset(machine: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The MachineSet ownerReference of a Machine, if any."""
    return owner_of_kind(machine, "MachineSet")


def owned_by(child: Mapping[str, Any], owner: Mapping[str, Any], kind: str = "MachineSet") -> bool:
    """`child` (a Machine; a MachineSet for kind MachineDeployment) belongs to `owner`: same namespace, an owner
    reference of that kind with its name (and uid, when both carry one: an owner deleted and recreated under the same
    name does not inherit the old children)."""
    ref = owner_of_kind(child, kind)
    if ref is None or ref.get("name") != name_of(owner) or namespace_of(child) != namespace_of(owner):
        return False
    uid, ref_uid = meta(owner).get("uid"), ref.get("uid")
    return not (uid and ref_uid and uid != ref_uid)


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def set_name_label(machineset_name: str) -> str:
    """The cluster.x-k8s.io/set-name label value Cluster API's MachineSet controller gives its Machines: the name, or
    for a name no label value can hold, `hash_<FNV-32a, base64url>_z` (its util/labels/format MustFormatValue)."""
    if len(machineset_name) <= _MAX_LABEL_VALUE and _LABEL_VALUE.match(machineset_name):
        return machineset_name
    digest = 0x811C9DC5
    for byte in machineset_name.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "hash_" + base64.urlsafe_b64encode(digest.to_bytes(4, "big")).decode().rstrip("=") + "_z"


def owning_machineset(machine: Mapping[str, Any]) -> Optional[str]:
    """The name of the MachineSet that owns the Machine as Cluster API records it: an ownerReference to it and the
    set-name label for it. None when either is missing or they disagree (a Machine made or edited by hand)."""
    owner = owner_machineset(machine)
    if owner is None or not owner.get("name"):
        return None
    labels = meta(machine).get("labels") or {}
    return str(owner["name"]) if labels.get(LABEL_SET_NAME) == set_name_label(str(owner["name"])) else None


@dataclass(frozen=True)
class NodeClaim:
    """A Machine owned by a MachineSet (`owning_machineset`) and the Node it is counted with."""

    machine: Mapping[str, Any]
    machineset: str
    node: Optional[str]  # status.nodeRef, None while it has none or when the Node is another Machine's
    refused: str = ""  # why its status.nodeRef is not counted (empty: it is, or there is none)


def node_claims(machines: Iterable[Mapping[str, Any]]) -> tuple[NodeClaim, ...]:
    """The Machines owned by a MachineSet, each with its Node. A Node is a Machine's through status.nodeRef alone,
    never spec.providerID, which whoever creates a Machine writes; but Cluster API sets nodeRef by looking the Node
    up by that providerID (core/reconcilers/machine/machine_controller_noderef.go) and never asks whether another
    Machine has it already. So when Machines name one Node, the one created first keeps it: the Node's own Machine
    existed before the Node did, a copy of its providerID can only be made after. The others are refused."""
    owned = [(m, name) for m in machines if (name := owning_machineset(m)) is not None]
    named: dict[str, list[Mapping[str, Any]]] = {}
    for machine, _ in owned:
        node = node_ref_name(machine)
        if node:
            named.setdefault(node, []).append(machine)
    # Thousands of Machines, each naming its own Node: only a Node named twice needs the creation times compared.
    first = {node: found[0] if len(found) == 1 else
             min(found, key=lambda m: (created_at(m), namespace_of(m), name_of(m))) for node, found in named.items()}
    claims = []
    for machine, machineset in owned:
        node = node_ref_name(machine)
        holder = first.get(node) if node else None
        if node and holder is not machine:
            refused = (f"its status.nodeRef names Node {node}, which Machine {namespace_of(holder)}/{name_of(holder)} "
                       f"(created before it) has: a Node is counted for the Machine that had it first; this one is "
                       f"not counted in MachineSet {namespace_of(machine)}/{machineset} (a copied spec.providerID?)")
            claims.append(NodeClaim(machine, machineset, None, refused))
        else:
            claims.append(NodeClaim(machine, machineset, node))
    return tuple(claims)


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def marked_for_deletion(machine: Mapping[str, Any]) -> bool:
    return ANN_CAPI_DELETE_MACHINE in (meta(machine).get("annotations") or {})


def conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """v1beta2 status.conditions, or their v1beta1 home status.v1beta2.conditions."""
    status = obj.get("status") or {}
    if version_of(obj) == "v1beta1":
        return list(((status.get("v1beta2") or {}).get("conditions")) or [])
    return list(status.get("conditions") or [])


def waiting_for_pre_terminate_hooks(machine: Mapping[str, Any]) -> bool:
    """Cluster API has drained the Machine's node (or it has none) and waits for its pre-terminate hooks."""
    return is_deleting(machine) and any(c.get("type") == "Deleting" and c.get("reason") ==
                                        WAITING_FOR_PRE_TERMINATE_HOOK for c in conditions(machine))


def node_ref_name(machine: Mapping[str, Any]) -> Optional[str]:
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    return ref.get("name") or None


def provider_id(machine: Mapping[str, Any]) -> str:
    return str((machine.get("spec") or {}).get("providerID") or "")


def phase(machine: Mapping[str, Any]) -> str:
    return str((machine.get("status") or {}).get("phase") or "")


def failure_message(machine: Mapping[str, Any]) -> Optional[str]:
    """v1beta1 status.failureMessage, or its v1beta2 home status.deprecated.v1beta1.failureMessage."""
    status = machine.get("status") or {}
    deprecated = ((status.get("deprecated") or {}).get("v1beta1") or {})
    return status.get("failureMessage") or deprecated.get("failureMessage") or None


def created_at(obj: Mapping[str, Any]) -> float:
    stamp = meta(obj).get("creationTimestamp")
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if isinstance(stamp, str) and stamp:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return 0.0


def spec_replicas(machineset: Mapping[str, Any]) -> Optional[int]:
    replicas = (machineset.get("spec") or {}).get("replicas")
    return None if replicas is None else int(replicas)


def version_of(obj: Mapping[str, Any]) -> str:
    """"v1beta1" from apiVersion "cluster.x-k8s.io/v1beta1"."""
    return str(obj.get("apiVersion", "")).rpartition("/")[2]
