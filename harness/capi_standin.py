"""A stand-in for Cluster API's MachineSet controller and an infrastructure provider together, for kwok nodes, in one
process. Test support only, never in the `dds` wheel: the demo and every e2e test run Cluster API's own manager
(harness/capi.py, harness/kwok_provider.py, harness/stack.py); the integration tests under tests/integration that
build on tests/integration/nodes/harness.py still scale MachineSets through this stand-in, on the shared control planes
with the trimmed Cluster API CRDs, and are the ones left to move onto the real manager (harness/capi_stack.py).

For every MachineSet opted into DDS (`dds.cdi.dev/enabled: "true"`) in the watched namespaces, one pass:

| state                                    | action (as Cluster API and an infrastructure provider would)       |
|------------------------------------------|--------------------------------------------------------------------|
| fewer live Machines than spec.replicas   | create Machines `<machineset>-<suffix>` from spec.template: owner   |
|                                          | reference, label cluster.x-k8s.io/set-name, providerID              |
|                                          | kwok://<name> (or as ProviderIds says); phase Provisioning          |
| a Machine older than the provisioning    | create its Node (annotation kwok.x-k8s.io/node=fake: kwok makes it  |
| delay, without a Node                    | Ready and runs its pods), then status.nodeRef and phase Running     |
| more live Machines than spec.replicas    | delete the surplus, Machines marked cluster.x-k8s.io/delete-machine |
|                                          | first, then the newest; each with its Node                          |
| always                                   | MachineSet status: replicas, readyReplicas (Node Ready),            |
|                                          | observedGeneration                                                  |

The Node is the group's node as cluster-autoscaler's template shows it (labels, taints, cpu/memory/pods), but with the
GPU resource at 0: a node's GPUs come from the fabric, and `dds/kube/nodes.py` shows them when they are attached (the
controller attaches a group's initial GPUs once the node is Ready).

It also does the garbage collection Cluster API gets from kube-controller-manager: Machines (with a kwok providerID)
whose MachineSet is gone, and kwok Nodes this provider made whose Machine is gone, are deleted.

Time comes from the injected clock (a Machine records when it was asked for in `dds.cdi.dev/kwok-requested-at`), so a
fake clock drives the provisioning delay in tests. Names are deterministic: the suffix is a hash of (MachineSet uid,
generation, index), so a repeated pass after a crash creates the same names, never a second set.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from dds.kube import ApiClient, capi
from dds.kube.capi import MACHINES, MACHINESETS, CapiNotInstalled, CapiObjects
from dds.kube.errors import ApiError
from dds.kube.machinesets import machineset_from_object
from dds.kube.nodes import NodeObjects
from dds.model.groups import ANNOTATION_PREFIX, LABEL_ATTACHED_GPU, LABEL_NODE_GROUP, NodeGroupSpec
from dds.nodes.errors import NodeBackendError, NodeBackendUnavailable
from dds.groups.sources import group_input_from_machineset, opted_in
from dds.groups.schema import parse_group
from dds.groups.labels import template_labels
from harness.kwok_provider import node_capacity

log = logging.getLogger(__name__)

ANN_KWOK_NODE = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
ANN_NODE_TTL = "node.alpha.kubernetes.io/ttl"
ANN_REQUESTED_AT = ANNOTATION_PREFIX + "kwok-requested-at"
PROVIDER_PREFIX = "kwok://"
DEFAULT_GPU_LABEL = "nvidia.com/gpu.product"
_MAX_NODE_NAME = 63  # the name is also the kubernetes.io/hostname label value
_SUFFIX_LENGTH = 5
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' generateName alphabet: no vowels, no look-alikes

Obj = dict[str, Any]


@dataclass
class KwokPass:
    """What one reconcile pass did (for logs and tests)."""

    machines_created: list[str] = field(default_factory=list)
    nodes_created: list[str] = field(default_factory=list)
    machines_deleted: list[str] = field(default_factory=list)
    nodes_deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.machines_created or self.nodes_created or self.machines_deleted or self.nodes_deleted)


# --- pure parts ---

@dataclass(frozen=True)
class ProviderIds:
    """How this provider names its machines: a Machine's spec.providerID, copied to its Node, is `prefix` followed by
    `machine_id(machine name)`; Machines and Nodes whose providerID has another prefix are not this provider's. The
    default is kwok://<name>; a test cluster whose nodes stand for another infrastructure's servers names them as that
    infrastructure does (harness/cdi_stack.py: fsas-cdi://<uuid>, which the CDI operator reads in DRA mode)."""

    prefix: str = PROVIDER_PREFIX
    machine_id: Callable[[str], str] = str

    def of(self, machine_name: str) -> str:
        return self.prefix + self.machine_id(machine_name)

    def owns(self, provider_id: str) -> bool:
        return provider_id.startswith(self.prefix)


KWOK_PROVIDER_IDS = ProviderIds()


def machine_name(machineset_name: str, uid: str, generation: int, index: int) -> str:
    """`<machineset>-<5 characters>`, the same for the same (MachineSet uid, generation, index)."""
    number = int.from_bytes(hashlib.sha256(f"{uid}/{generation}/{index}".encode()).digest()[:8], "big")
    suffix = ""
    for _ in range(_SUFFIX_LENGTH):
        number, digit = divmod(number, len(_ALPHABET))
        suffix += _ALPHABET[digit]
    prefix = machineset_name[: _MAX_NODE_NAME - _SUFFIX_LENGTH - 1].rstrip("-.")
    return f"{prefix}-{suffix}"


def template_metadata(machineset: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((machineset.get("spec") or {}).get("template") or {}).get("metadata") or {}


def cluster_name(machineset: Mapping[str, Any]) -> str:
    spec = machineset.get("spec") or {}
    return str(spec.get("clusterName") or ((spec.get("template") or {}).get("spec") or {}).get("clusterName") or "")


def node_labels(group: NodeGroupSpec, machineset: Mapping[str, Any], node_name: str, gpu_label: str) -> dict[str, str]:
    """The MachineSet template's labels, then what the group's template node carries (CA simulates with those: the real
    node must match): the group's labels, os/arch, hostname, the node-group label and the GPU model labels."""
    labels = {str(k): str(v) for k, v in (template_metadata(machineset).get("labels") or {}).items()}
    labels.update(template_labels(group, node_name, gpu_label))
    labels.pop(LABEL_ATTACHED_GPU, None)  # a node boots with 0 GPUs visible: DDS labels it once its GPUs are usable
    return labels


def build_node(group: NodeGroupSpec, machineset: Mapping[str, Any], machine: Mapping[str, Any],
               gpu_label: str) -> Obj:
    name = capi.name_of(machine)
    capacity = node_capacity(group)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels(group, machineset, name, gpu_label),
            "annotations": {
                ANN_KWOK_NODE: KWOK_NODE_VALUE, ANN_NODE_TTL: "0",
                capi.NODE_ANN_MACHINE: name, capi.NODE_ANN_CLUSTER_NAMESPACE: capi.namespace_of(machine),
                capi.NODE_ANN_CLUSTER_NAME: cluster_name(machineset),
                capi.NODE_ANN_OWNER_KIND: "MachineSet", capi.NODE_ANN_OWNER_NAME: capi.name_of(machineset),
            },
        },
        "spec": {"providerID": capi.provider_id(machine) or PROVIDER_PREFIX + name,
                 "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in group.taints]},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def build_machine(machineset: Mapping[str, Any], name: str, requested_at: float,
                  provider_ids: ProviderIds = KWOK_PROVIDER_IDS) -> Obj:
    """A Machine from the MachineSet's template, owned by it, with the providerID of its future Node."""
    template = (machineset.get("spec") or {}).get("template") or {}
    metadata = template.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    labels[capi.LABEL_SET_NAME] = capi.set_name_label(capi.name_of(machineset))  # as Cluster API writes it
    cluster = cluster_name(machineset)
    if cluster:
        labels[capi.LABEL_CLUSTER_NAME] = cluster
    annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
    annotations[ANN_REQUESTED_AT] = f"{requested_at:.3f}"
    spec = copy.deepcopy(template.get("spec") or {})
    if cluster:
        spec["clusterName"] = cluster
    spec["providerID"] = provider_ids.of(name)
    return {
        "apiVersion": machineset.get("apiVersion", ""), "kind": "Machine",
        "metadata": {
            "name": name, "namespace": capi.namespace_of(machineset), "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": machineset.get("apiVersion", ""), "kind": "MachineSet",
                                 "name": capi.name_of(machineset), "uid": capi.meta(machineset).get("uid", ""),
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def requested_at(machine: Mapping[str, Any]) -> float:
    """When the Machine was asked for, on the provider's clock (its creation time for a Machine made elsewhere)."""
    value = capi.annotations_of(machine).get(ANN_REQUESTED_AT)
    try:
        return float(value) if value else capi.created_at(machine)
    except ValueError:
        return capi.created_at(machine)


def choose_for_deletion(machines: Sequence[Mapping[str, Any]], count: int) -> list[Mapping[str, Any]]:
    """The `count` Machines a scale-down removes: those marked delete-machine first, then the newest."""
    ranked = sorted(machines, key=lambda m: (not capi.marked_for_deletion(m), -requested_at(m), capi.name_of(m)))
    return ranked[:max(0, count)]


def node_ref(machine_version: str, node: Mapping[str, Any]) -> Obj:
    """status.nodeRef: v1beta2 keeps the name only; v1beta1 is an ObjectReference."""
    name = capi.name_of(node)
    if machine_version == "v1beta1":
        return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": capi.meta(node).get("uid", "")}
    return {"name": name}


def failed_status(machine_version: str, reason: str, message: str) -> Obj:
    if machine_version == "v1beta1":
        return {"phase": capi.PHASE_FAILED, "failureReason": reason, "failureMessage": message}
    return {"phase": capi.PHASE_FAILED,
            "deprecated": {"v1beta1": {"failureReason": reason, "failureMessage": message}}}


def selector_string(machineset: Mapping[str, Any]) -> str:
    match = ((machineset.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def machineset_status(machineset: Mapping[str, Any], replicas: int, ready: int) -> Obj:
    status: Obj = {"replicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
                   "observedGeneration": int(capi.meta(machineset).get("generation") or 0)}
    selector = selector_string(machineset)
    if selector:
        status["selector"] = selector
    if capi.version_of(machineset) == "v1beta1":
        status["fullyLabeledReplicas"] = replicas
    return status


def status_differs(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return any(current.get(k) != v for k, v in wanted.items())


def node_is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_kwok_machine(machine: Mapping[str, Any], provider_ids: ProviderIds = KWOK_PROVIDER_IDS) -> bool:
    return provider_ids.owns(capi.provider_id(machine))


# --- the reconciler ---

class KwokInfrastructure:
    def __init__(self, api: ApiClient, clock: Callable[[], float], provisioning_delay_seconds: float,
                 namespaces: Sequence[str] = (), *, gpu_label: str = DEFAULT_GPU_LABEL,
                 request_timeout_seconds: float = 10.0, provider_ids: ProviderIds = KWOK_PROVIDER_IDS) -> None:
        if provisioning_delay_seconds < 0:
            raise ValueError(f"provisioning delay must be >= 0 seconds, got {provisioning_delay_seconds}")
        self._nodes = NodeObjects(api, request_timeout_seconds=request_timeout_seconds)
        self._capi = CapiObjects(api, request_timeout_seconds=request_timeout_seconds)
        self._clock = clock
        self.provisioning_delay_seconds = provisioning_delay_seconds
        self._namespaces = tuple(namespaces)
        self._gpu_label = gpu_label
        self._provider_ids = provider_ids
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pass_lock = threading.Lock()

    # --- lifecycle ---
    def run_in_thread(self, interval_seconds: float = 0.5) -> "KwokInfrastructure":
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(interval_seconds,), name="kwok-infrastructure",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> "KwokInfrastructure":
        return self.run_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, interval_seconds: float) -> None:
        failing: Optional[str] = None  # the last failure, logged once (not twice a second through an outage)
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as exc:  # the next pass starts from a fresh read
                if str(exc) != failing:
                    log.warning("kwok infrastructure: pass failed, retrying every %.1fs: %s", interval_seconds, exc)
                failing = str(exc)
            else:
                if failing is not None:
                    log.info("kwok infrastructure: passes succeed again")
                failing = None
            self._stop.wait(interval_seconds)

    # --- one pass ---
    def reconcile_once(self) -> KwokPass:
        with self._pass_lock:
            result = KwokPass()
            machinesets = self._read("listing MachineSets", lambda: self._capi.list(MACHINESETS, self._namespaces))
            machines = self._read("listing Machines", lambda: self._capi.list(MACHINES, self._namespaces))
            nodes = {n["metadata"]["name"]: n for n in self._read("listing Nodes", self._list_nodes)}
            for machineset in machinesets:
                if not opted_in(capi.annotations_of(machineset)):
                    continue
                owned = [m for m in machines if capi.owned_by(m, machineset)]
                try:
                    self._reconcile_machineset(machineset, owned, nodes, result)
                except Exception as exc:  # one broken MachineSet must not stop the others
                    message = f"MachineSet {capi.namespace_of(machineset)}/{capi.name_of(machineset)}: {exc}"
                    log.warning("kwok infrastructure: %s", message)
                    result.errors.append(message)
            self._collect_garbage(machinesets, machines, nodes, result)
            if result.changed:
                log.info("kwok infrastructure: created machines %s, nodes %s; deleted machines %s, nodes %s",
                         result.machines_created, result.nodes_created, result.machines_deleted, result.nodes_deleted)
            return result

    def _reconcile_machineset(self, machineset: Obj, owned: list[Obj], nodes: dict[str, Obj],
                              result: KwokPass) -> None:
        group = self._group(machineset)
        if group is None:
            return
        active = [m for m in owned if not capi.is_deleting(m)]
        desired = capi.spec_replicas(machineset)
        if desired is None:
            self._report_once(f"{group.id}: spec.replicas is not set; not creating or deleting Machines until it is")
            desired = len(active)
        if len(active) < desired:
            active += self._create_machines(machineset, desired - len(active), owned, nodes, result)
        elif len(active) > desired:
            for machine in choose_for_deletion(active, len(active) - desired):
                self._delete_machine(machine, nodes, result)
                active.remove(machine)
        for machine in active:
            self._ensure_node(group, machineset, machine, nodes, result)
        ready = sum(1 for m in active if capi.node_ref_name(m) in nodes and node_is_ready(nodes[capi.node_ref_name(m)]))
        wanted = machineset_status(machineset, len(active), ready)
        if status_differs(machineset.get("status") or {}, wanted):
            self._capi.patch_status(MACHINESETS, capi.namespace_of(machineset), capi.name_of(machineset), wanted)

    def _group(self, machineset: Obj) -> Optional[NodeGroupSpec]:
        spec, errors = parse_group(group_input_from_machineset(machineset_from_object(machineset)))
        if spec is None:
            problems = "; ".join(f"{e.key}: {e.message}" for e in errors)
            self._report_once(f"MachineSet {capi.namespace_of(machineset)}/{capi.name_of(machineset)} is not a "
                              f"valid DDS node group, not provisioning it: {problems}")
        return spec

    def _create_machines(self, machineset: Obj, count: int, owned: Sequence[Obj], nodes: Mapping[str, Obj],
                         result: KwokPass) -> list[Obj]:
        namespace = capi.namespace_of(machineset)
        taken = {capi.name_of(m) for m in owned} | set(nodes)
        uid = str(capi.meta(machineset).get("uid", ""))
        generation = int(capi.meta(machineset).get("generation") or 0)
        created: list[Obj] = []
        index = 0
        while len(created) < count:
            name = machine_name(capi.name_of(machineset), uid, generation, index)
            index += 1
            if name in taken:
                continue
            taken.add(name)
            try:
                machine = self._capi.create(MACHINES, namespace, build_machine(machineset, name, self._clock(), self._provider_ids))
            except ApiError as exc:
                if not exc.conflict:
                    raise
                continue  # made by an earlier pass we did not see listed: take the next name
            self._capi.patch_status(MACHINES, namespace, name, {"phase": capi.PHASE_PROVISIONING})
            result.machines_created.append(f"{namespace}/{name}")
            created.append(machine)
        return created

    def _ensure_node(self, group: NodeGroupSpec, machineset: Obj, machine: Obj, nodes: dict[str, Obj],
                     result: KwokPass) -> None:
        if capi.node_ref_name(machine) or not is_kwok_machine(machine, self._provider_ids) or capi.phase(machine) == capi.PHASE_FAILED:
            return
        name, namespace = capi.name_of(machine), capi.namespace_of(machine)
        node = nodes.get(name)
        if node is None:
            if self._clock() < requested_at(machine) + self.provisioning_delay_seconds:
                return
            node, created = self._create_node(group, machineset, machine)
            if node is None:
                return
            nodes[name] = node
            if created:
                result.nodes_created.append(name)
        annotations = capi.annotations_of(node)
        owner = (annotations.get(capi.NODE_ANN_CLUSTER_NAMESPACE), annotations.get(capi.NODE_ANN_MACHINE))
        if owner != (namespace, name):
            self._fail(machine, f"a Node named {name} already exists and is not this Machine's")
            return
        status = {"phase": capi.PHASE_RUNNING, "nodeRef": node_ref(capi.version_of(machine), node)}
        machine["status"] = {**(machine.get("status") or {}), **status}
        self._capi.patch_status(MACHINES, namespace, name, status)

    def _create_node(self, group: NodeGroupSpec, machineset: Obj, machine: Obj) -> tuple[Optional[Obj], bool]:
        """(the Machine's Node, whether this call created it); (None, False) when the Machine failed instead."""
        body = build_node(group, machineset, machine, self._gpu_label)
        try:
            return self._nodes.create(body), True
        except ApiError as exc:
            if exc.status in (400, 422):
                self._fail(machine, f"the apiserver refused its Node: {exc.status} {exc.reason}: {exc.body}")
                return None, False
            if not exc.conflict:
                raise
        # A Node of that name exists: ours from a pass that stopped before linking it, or someone else's.
        return self._nodes.get(body["metadata"]["name"]), False

    def _fail(self, machine: Obj, message: str) -> None:
        name, namespace = capi.name_of(machine), capi.namespace_of(machine)
        log.warning("kwok infrastructure: Machine %s/%s failed: %s", namespace, name, message)
        self._capi.patch_status(MACHINES, namespace, name,
                                failed_status(capi.version_of(machine), "CreateError", message))

    def _delete_machine(self, machine: Mapping[str, Any], nodes: dict[str, Obj], result: KwokPass) -> None:
        """Its Node first, then the Machine: a failure in between leaves a Machine without a Node, which the next
        pass deletes again, never a Node nobody owns."""
        name, namespace = capi.name_of(machine), capi.namespace_of(machine)
        node_name = capi.node_ref_name(machine) or (name if is_kwok_machine(machine, self._provider_ids) else None)
        if node_name and self._delete_node(node_name):
            result.nodes_deleted.append(node_name)
        nodes.pop(node_name or "", None)
        if self._capi.delete(MACHINES, namespace, name):
            result.machines_deleted.append(f"{namespace}/{name}")

    def _delete_node(self, name: str) -> bool:
        return self._nodes.delete(name)

    def _collect_garbage(self, machinesets: Sequence[Obj], machines: Sequence[Obj], nodes: dict[str, Obj],
                         result: KwokPass) -> None:
        for machine in machines:
            owner = capi.owner_machineset(machine)
            if owner is None or not is_kwok_machine(machine, self._provider_ids) or capi.is_deleting(machine):
                continue
            if not any(capi.owned_by(machine, ms) for ms in machinesets):
                log.info("kwok infrastructure: MachineSet %s/%s is gone; deleting its Machine %s",
                         capi.namespace_of(machine), owner.get("name"), capi.name_of(machine))
                self._delete_machine(machine, nodes, result)
        # Machines listed at the start of the pass or created during it, minus those deleted during it.
        live = {(capi.namespace_of(m), capi.name_of(m)) for m in machines}
        live |= {tuple(entry.split("/", 1)) for entry in result.machines_created}
        live -= {tuple(entry.split("/", 1)) for entry in result.machines_deleted}
        for name, node in list(nodes.items()):
            annotations = capi.annotations_of(node)
            machine_ref = (annotations.get(capi.NODE_ANN_CLUSTER_NAMESPACE, ""), annotations.get(capi.NODE_ANN_MACHINE))
            if annotations.get(ANN_KWOK_NODE) != KWOK_NODE_VALUE or not machine_ref[1] or \
                    not str((node.get("spec") or {}).get("providerID", "")).startswith(self._provider_ids.prefix):
                continue
            if self._namespaces and machine_ref[0] not in self._namespaces:
                continue
            if machine_ref not in live:
                log.info("kwok infrastructure: Machine %s/%s is gone; deleting its Node %s", *machine_ref, name)
                if self._delete_node(name):
                    result.nodes_deleted.append(name)
                nodes.pop(name, None)

    def _read(self, step: str, call: Callable[[], list[Obj]]) -> list[Obj]:
        where = f"kwok infrastructure ({', '.join(self._namespaces) or 'all namespaces'}): {step}"
        try:
            return call()
        except ApiError as exc:
            error: Exception = NodeBackendUnavailable(f"{where}: {exc.status} {exc.reason}")
            if exc.status not in (0, 408, 429) and exc.status is not None and exc.status < 500:
                error = NodeBackendError(f"{where}: {exc.status} {exc.reason}")
            raise error from exc
        except CapiNotInstalled as exc:
            raise NodeBackendError(f"{where}: {exc}") from exc
        except Exception as exc:  # connection refused, TLS, timeouts
            raise NodeBackendUnavailable(f"{where}: apiserver unreachable: {exc}") from exc

    def _list_nodes(self) -> list[Obj]:
        # Every node this provider makes carries the node-group label; a foreign node with a clashing name shows up
        # as a 409 when creating.
        return self._nodes.list(label_selector=LABEL_NODE_GROUP)

    def _report_once(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            log.warning("kwok infrastructure: %s", message)
