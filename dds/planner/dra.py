"""ResourceClaims in the planner: which GPUs a DRA pod needs, judged with a real CEL evaluator, as GPU requests.

DDS attaches GPUs one model at a time to a node, and every GPU of a model it attaches is published alike (the same
attributes and capacity, `gpu_device`), so whether a claim is satisfiable after N attaches is a question about models:

    a pending pod's unallocated claims ──► per request: the models whose device passes the DeviceClass's selectors and
                                           the request's selectors (cel-expr-python, the environment kube-scheduler
                                           gives them: `device.driver`, `device.attributes[domain]`,
                                           `device.capacity[domain]`, `quantity()`, `cel.bind`)
                                       ──► a GPU request (sum of the counts) restricted to the models every request
                                           accepts (the GPU model node label, as an extended-resource pod asks),
                                           of DRA_GPU_RESOURCE: what DRA groups' nodes count their GPUs in and no
                                           other node has, so claims are planned onto DRA groups' nodes only

`lower_pods` rewrites each pod that way, so the whole scheduling simulation (live nodes, GPUs on their way, new
nodes, gangs, refusals) plans DRA pods exactly like extended-resource pods, and extended-resource pods are untouched
(they ask for their groups' resource, which DRA groups' nodes do not have).
Bound pods are charged the devices their allocated claims hold (a claim shared by several pods once), so those GPUs
are in use; `mark_claimed` flags the fabric devices behind allocated results, which a detach never takes.

A claim no device DDS can attach satisfies gets a refusal naming the request, the selector and the device that failed
it (`PodInfo.dra_refusal`), which the controller turns into an Event and `dds plan` prints.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from dds.model.groups import DRA_GPU_RESOURCE, GpuApi
from dds.model.quantity import to_int
from dds.model.resources import Resources
from dds.planner.dra_records import (ALL, AllocatedDeviceInfo, DeviceClassInfo, DeviceRequestInfo, DraDevice,
                                     DraState, PodClaimRef, ResourceClaimInfo)
from dds.planner.plan import ScaleUpPlan, Verdict
from dds.planner.snapshot import (ContainerRequests, NodeInfo, NodeSelectorTerm, PodInfo, SelectorRequirement,
                                  Snapshot)

DRIVER = "gpu.dds.cdi.dev"  # the DRA driver name DDS (or the fabric's driver) publishes attached GPUs under
DEVICE_CLASS = "gpu.dds.cdi.dev"  # the DeviceClass in manifests/dra/ selecting them

# Memory of the GPU models the simulated fabric and the demo use, published as the device's `memory` capacity. A model
# missing here is published without it (a selector reading it then fails with an error, as upstream does).
MODEL_MEMORY: Mapping[str, str] = {"A30": "24Gi", "A40": "48Gi", "A100": "80Gi", "H100": "80Gi", "H200": "141Gi",
                                   "L4": "24Gi", "L40S": "48Gi", "T4": "16Gi", "V100": "32Gi"}
PRODUCT_PREFIX = "NVIDIA"


# --- the devices DDS publishes ------------------------------------------------------------------------------------

def device_name(fabric_id: str) -> str:
    """A fabric device id as a DRA device name (a DNS label): "default/A30-003" -> "default-a30-003"."""
    name = re.sub(r"[^a-z0-9-]+", "-", fabric_id.lower()).strip("-")
    return name[:63].rstrip("-") or "gpu"


def gpu_device(model: str, fabric_id: str, pool: str, driver: str = DRIVER) -> DraDevice:
    """The device DDS publishes for an attached GPU: the ResourceSlice writer and the planner's "what would N attaches
    of `model` bring" both build it here, so they cannot disagree."""
    attributes = {f"{driver}/model": model, f"{driver}/productName": f"{PRODUCT_PREFIX} {model}",
                  f"{driver}/deviceID": fabric_id}
    memory = MODEL_MEMORY.get(model)
    capacity = {f"{driver}/memory": to_int(memory)} if memory else {}
    return DraDevice(name=device_name(fabric_id), driver=driver, pool=pool, attributes=attributes, capacity=capacity)


# --- CEL ------------------------------------------------------------------------------------------------------------

class SelectorError(ValueError):
    """A selector that does not compile: kube-scheduler fails every allocation with it."""


@functools.lru_cache(maxsize=1)
def _env() -> Any:  # a cel_expr_python Env
    # Imported here: the compiled extension loads once, and only where selectors are evaluated.
    from cel_expr_python import cel
    from cel_expr_python.ext.ext_bindings import ExtBindings
    from cel_expr_python.ext.ext_strings import ExtStrings

    int_t = cel.Type.INT
    quantity = cel.FunctionDecl("quantity", [cel.Overload("quantity_string", int_t, [cel.Type.STRING], False,
                                                          impl=to_int)])
    # Quantities are compared through these member functions in Kubernetes CEL; capacities here are plain integers.
    members = [cel.FunctionDecl(name, [cel.Overload(f"int_{name}_int", ret, [int_t, int_t], True, impl=impl)])
               for name, ret, impl in (("compareTo", int_t, lambda a, b: (a > b) - (a < b)),
                                       ("isGreaterThan", cel.Type.BOOL, lambda a, b: a > b),
                                       ("isLessThan", cel.Type.BOOL, lambda a, b: a < b))]
    return cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=[ExtBindings(), ExtStrings()],
                      functions=[quantity, *members])


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Any:  # a cel_expr_python Expression
    try:
        return _env().compile(expression)
    except RuntimeError as exc:
        raise SelectorError(f"selector {expression!r} does not compile: {exc}") from None


_DOMAIN_LOOKUP = re.compile(r"""\.(?:attributes|capacity)\s*\[\s*(?:"([^"]*)"|'([^']*)')\s*\]""")


def _grouped(values: Mapping[str, object], domains: Iterable[str]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {d: {} for d in domains}
    for qualified, value in values.items():
        domain, _, name = qualified.rpartition("/")
        out.setdefault(domain, {})[name] = value
    return out


def cel_device(device: DraDevice, expression: str = "") -> dict[str, object]:
    """The `device` variable of a selector. A domain the device has no attribute of reads as an empty map, as in
    Kubernetes: the domains an expression looks up by a literal are given one (the evaluator has no lazy maps)."""
    domains = {a or b for a, b in _DOMAIN_LOOKUP.findall(expression)}
    return {"driver": device.driver, "allowMultipleAllocations": False,
            "attributes": _grouped(device.attributes, domains), "capacity": _grouped(device.capacity, domains)}


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Why a device does not serve a request: the selector (and whose: the DeviceClass's or the request's)."""

    request: str
    device: str
    selector: str
    source: str  # "DeviceClass <name>" | "request"
    error: str = ""  # set when the selector failed with an error instead of evaluating to false

    def text(self) -> str:
        outcome = f"fails with {self.error}" if self.error else "is false"
        return f"{self.source} selector `{self.selector}` {outcome} for {self.device}"


def evaluate(expression: str, device: DraDevice) -> tuple[bool, str]:
    """(matches, error): an error never matches (kube-scheduler aborts the allocation on one)."""
    try:
        value = compile_selector(expression).eval(data={"device": cel_device(device, expression)})
    except SelectorError as exc:
        return False, str(exc)
    plain = value.plain_value()
    if isinstance(plain, bool):
        return plain, ""
    return False, f"a non-boolean result ({plain!r})"


def request_mismatch(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo], device: DraDevice,
                     label: str = "") -> Optional[Mismatch]:
    """None when `device` serves `request`, else the first selector that rejects it (the class's first). `label`
    names the device in the explanation (default: "device <name>")."""
    label = label or f"device {device.name}"
    cls = classes.get(request.device_class)
    if cls is None:
        return Mismatch(request.name, label, request.device_class, "DeviceClass",
                        error=f"DeviceClass {request.device_class!r} does not exist")
    for source, selectors in ((f"DeviceClass {cls.name}", cls.selectors), ("request", request.selectors)):
        for expression in selectors:
            ok, error = evaluate(expression, device)
            if not ok:
                return Mismatch(request.name, label, expression, source, error)
    return None


# --- a pod's demand -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod's claims need of DDS: `gpus` new devices of one of `models` (None = any model DDS attaches), on
    `node` when an allocated claim already ties the pod to one; `refusal` when no attach can satisfy them."""

    gpus: int = 0
    models: Optional[frozenset[str]] = None
    node: Optional[str] = None
    refusal: Optional[str] = None
    claims: tuple[str, ...] = ()


def models_for(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo],
               offers: Sequence[DraDevice]) -> tuple[frozenset[str], tuple[Mismatch, ...]]:
    """The models (by their offered device) that serve `request`, and why each other one does not."""
    good, bad = set(), []
    for device in offers:
        model = str(device.attributes.get(f"{device.driver}/model", device.name))
        found = request_mismatch(request, classes, device, label=f"an attachable {model}")
        if found is None:
            good.add(model)
        else:
            bad.append(found)
    return frozenset(good), tuple(bad)


def _request_count(request: DeviceRequestInfo) -> int:
    # "All" takes every matching device of the node at allocation time and needs at least one: one attach is the
    # least that makes it satisfiable on a node with none.
    return 1 if request.allocation_mode == ALL else max(1, request.count)


def claim_demand(claim: ResourceClaimInfo, classes: Mapping[str, DeviceClassInfo],
                 offers: Sequence[DraDevice]) -> Demand:
    """An unallocated claim: the devices it needs and the models that give them, or why none can."""
    models: Optional[frozenset[str]] = None
    gpus = 0
    for request in claim.requests:
        if request.first_available:
            return Demand(refusal=f"ResourceClaim {claim.key} request {request.name!r} uses firstAvailable, which "
                                  f"DDS does not plan")
        accepted, mismatches = models_for(request, classes, offers)
        if not accepted:
            why = "; ".join(m.text() for m in mismatches) or "DDS attaches no GPU model at all"
            return Demand(refusal=f"ResourceClaim {claim.key} request {request.name!r}: no GPU DDS can attach "
                                  f"satisfies it ({why})")
        models = accepted if models is None else models & accepted
        if not models:
            return Demand(refusal=f"ResourceClaim {claim.key}: its requests accept no common GPU model, and a node "
                                  f"holds one model at a time")
        gpus += _request_count(request)
    if claim.constraints:
        return Demand(refusal=f"ResourceClaim {claim.key} has spec.devices.constraints, which DDS does not plan")
    return Demand(gpus=gpus, models=models, claims=(claim.key,))


def _merge(a: Demand, b: Demand) -> Demand:
    if a.refusal or b.refusal:
        return a if a.refusal else b
    if a.node and b.node and a.node != b.node:
        return Demand(refusal=f"claims {', '.join(a.claims + b.claims)} are allocated on different nodes "
                              f"({a.node}, {b.node})")
    models = b.models if a.models is None else a.models if b.models is None else a.models & b.models
    if models is not None and not models:
        return Demand(refusal=f"claims {', '.join(a.claims + b.claims)} accept no common GPU model")
    return Demand(gpus=a.gpus + b.gpus, models=models, node=a.node or b.node, claims=a.claims + b.claims)


@dataclass(frozen=True)
class _World:
    """Indexes over the DRA state and the offers, built once per lowering."""

    claims: Mapping[str, ResourceClaimInfo]
    templates: Mapping[str, ResourceClaimInfo]
    classes: Mapping[str, DeviceClassInfo]
    offers: tuple[DraDevice, ...]
    driver: str

    @classmethod
    def build(cls, state: DraState, models: Iterable[str], driver: str) -> "_World":
        templates = {f"{t.namespace}/{t.name}": ResourceClaimInfo(t.namespace, t.name, t.requests,
                                                                  constraints=t.constraints)
                     for t in state.templates}
        offers = tuple(gpu_device(m, f"pool/{m}", "pool", driver) for m in sorted(set(models)))
        return cls(claims={c.key: c for c in state.claims}, templates=templates,
                   classes={c.name: c for c in state.classes}, offers=offers, driver=driver)

    def resolve(self, pod: PodInfo, ref: PodClaimRef) -> tuple[Optional[ResourceClaimInfo], str]:
        """The claim behind a pod's entry (the template's spec while its claim is not created yet), or why none."""
        name = ref.resolved_name
        if name is not None:
            found = self.claims.get(f"{pod.namespace}/{name}")
            return (found, "") if found else (None, f"ResourceClaim {pod.namespace}/{name} does not exist")
        if ref.template_name:
            template = self.templates.get(f"{pod.namespace}/{ref.template_name}")
            if template is None:
                return None, f"ResourceClaimTemplate {pod.namespace}/{ref.template_name} does not exist"
            return replace(template, name=f"{pod.name}-{ref.name} (from template {template.name})"), ""
        return None, f"pod resource claim {ref.name!r} names neither a claim nor a template"


def _ours(results: Iterable[AllocatedDeviceInfo], driver: str) -> tuple[AllocatedDeviceInfo, ...]:
    return tuple(r for r in results if r.driver == driver)


def pod_demand(pod: PodInfo, world: _World, charged: set[str]) -> Demand:
    """The pod's claims as one Demand. `charged`: claims already counted on another pod of the pass (shared claims
    are counted once), updated in place."""
    total = Demand()
    for ref in pod.resource_claims:
        claim, missing = world.resolve(pod, ref)
        if claim is None:
            return Demand(refusal=f"waits for its claim: {missing}")
        if claim.allocated is not None:
            results = _ours(claim.allocated, world.driver)
            # The allocation's node (node-local devices and devices that bind to a node); a node-local pool is
            # also named by its node.
            node = claim.allocated_node or (results[0].pool if results else None)
            count = 0 if claim.key in charged or pod.node_name is None else len(results)
            charged.add(claim.key)
            part = Demand(gpus=count, node=node, claims=(claim.key,))
        elif claim.key in charged:
            part = Demand(claims=(claim.key,))  # another pending pod of the same claim asks for its devices
        else:
            charged.add(claim.key)
            part = claim_demand(claim, world.classes, world.offers)
        total = _merge(total, part)
    return total


def _with_demand(pod: PodInfo, demand: Demand, gpu_resource: str, model_label: str,
                 all_models: frozenset[str]) -> PodInfo:
    if demand.refusal:
        # Never promised a fit (the simulation cannot satisfy what it cannot read); the refusal says why.
        unsupported = pod.unsupported + ((demand.refusal,) if pod.node_name is None else ())
        return replace(pod, dra_refusal=demand.refusal, unsupported=unsupported, claims_lowered=True)
    containers = pod.containers
    if demand.gpus:
        containers = containers + (ContainerRequests(Resources(scalar={gpu_resource: demand.gpus})),)
    wanted: list[SelectorRequirement] = []
    if pod.node_name is None and demand.models is not None and demand.models != all_models:
        wanted.append(SelectorRequirement(model_label, "In", tuple(sorted(demand.models))))
    fields = (SelectorRequirement("metadata.name", "In", (demand.node,)),) if (
        pod.node_name is None and demand.node) else ()
    affinity = pod.required_node_affinity
    if wanted or fields:
        terms = affinity or (NodeSelectorTerm(),)
        affinity = tuple(NodeSelectorTerm(t.match_expressions + tuple(wanted), t.match_fields + fields)
                         for t in terms)
    return replace(pod, containers=containers, required_node_affinity=affinity, claims_lowered=True)


def lower_pods(pods: Sequence[PodInfo], state: DraState, models: Iterable[str], gpu_resource: str,
               model_label: str, driver: str = DRIVER) -> tuple[PodInfo, ...]:
    """Every pod with resource claims rewritten as the GPU requests they amount to (see the module docstring); other
    pods are returned as they are (the same objects). Bound pods are charged first, so a claim shared by a running
    and a pending pod is never asked for twice."""
    if not any(p.resource_claims and not p.claims_lowered for p in pods):
        return tuple(pods)
    world = _World.build(state, models, driver)
    all_models = frozenset(str(d.attributes[f"{driver}/model"]) for d in world.offers)
    charged: set[str] = set()
    lowered: dict[str, PodInfo] = {}
    ordered = sorted((p for p in pods if p.resource_claims and not p.claims_lowered),
                     key=lambda p: (p.node_name is None, -p.priority, p.created_at, p.key))
    for pod in ordered:
        lowered[pod.key] = _with_demand(pod, pod_demand(pod, world, charged), gpu_resource, model_label, all_models)
    return tuple(lowered.get(p.key, p) if p.resource_claims else p for p in pods)


# --- devices a detach must leave alone ------------------------------------------------------------------------------

def claimed_devices(state: DraState, driver: str = DRIVER) -> frozenset[tuple[str, str]]:
    """(pool, device name) of every device an allocated claim holds."""
    return frozenset((r.pool, r.device) for c in state.claims if c.allocated
                     for r in c.allocated if r.driver == driver)


def mark_claimed(snapshot: Snapshot, driver: str = DRIVER) -> Snapshot:
    """The snapshot with `Device.in_claim` set on the fabric devices allocated to a claim (node-local pools are named
    by node, devices by `device_name`; pool mode names the devices DDS attached for a claim on the claim)."""
    held = claimed_devices(snapshot.dra, driver)
    attached_for_claims = {d for c in snapshot.dra.claims if c.allocated is not None for d in c.fabric_devices}
    if not held and not attached_for_claims:
        return snapshot

    def marked(node: NodeInfo) -> NodeInfo:
        devices = tuple(replace(d, in_claim=True) if (node.name, device_name(d.id)) in held
                        or d.id in attached_for_claims else d for d in node.devices)
        return replace(node, devices=devices) if devices != node.devices else node

    return replace(snapshot, nodes=tuple(marked(n) for n in snapshot.nodes))


def lower_claims(snapshot: Snapshot, driver: str = DRIVER) -> Snapshot:
    """The snapshot as the planner plans it: claims lowered to GPU requests, claimed devices marked. The models are
    those the pools hold."""
    if not snapshot.dra.claims and not any(p.resource_claims and not p.claims_lowered for p in snapshot.pods):
        return snapshot
    models = {m for p in snapshot.pools for m in p.free} | {d.model for n in snapshot.nodes for d in n.devices}
    pods = lower_pods(snapshot.pods, snapshot.dra, models, DRA_GPU_RESOURCE, snapshot.gpu_model_label, driver)
    return mark_claimed(replace(snapshot, pods=pods), driver)


def lower_observed(pods: Sequence[PodInfo], state: DraState, models: Iterable[str],
                   model_label: str) -> tuple[PodInfo, ...]:
    """`lower_pods` for the observer, before anything reads the pods' GPU requests (idle tracking included)."""
    return lower_pods(pods, state, models, DRA_GPU_RESOURCE, model_label)


def pods_needing_nodes(plan: ScaleUpPlan, pods: Sequence[PodInfo]) -> tuple[PodInfo, ...]:
    """The pods with claims that `plan` (made without new nodes) leaves needing one. cluster-autoscaler cannot serve
    them (its externalgrpc templates carry no ResourceSlices), so DDS's loop adds their nodes (docs/dra.md)."""
    needing = {d.pod for d in plan.decisions if d.verdict == Verdict.NEEDS_NODE}
    return tuple(p for p in pods if p.resource_claims and p.key in needing)


def leave_pool_slots_to_the_scheduler(plan: ScaleUpPlan, snapshot: Snapshot) -> ScaleUpPlan:
    """`plan` without its attaches to nodes of dra-pool groups. There a GPU reaches a node only through a pool slot:
    kube-scheduler allocates the slot and picks the node, then DDS attaches it (PoolModeBinder). An attach planned
    for the same pod besides would take a second GPU out of the pool, and a slot off the slice, for a pod that gets
    one. The pods' verdicts stay: they fit once a slot is theirs, and a pod no live node takes still needs a node."""
    pool_groups = {g.id for g in snapshot.groups if g.gpu_api is GpuApi.DRA_POOL}
    if not pool_groups or not plan.attaches:  # the usual case: no walk over the nodes on every plan
        return plan
    pool_nodes = {n.name for n in snapshot.nodes if n.group_id in pool_groups}
    if not any(a.node in pool_nodes for a in plan.attaches):
        return plan
    decisions = tuple(replace(d, reason=f"{d.reason}; kube-scheduler allocates it a pool slot, then DDS attaches "
                                        f"the GPU (pool mode)")
                      if d.verdict == Verdict.FITS_AFTER_GPUS and d.node in pool_nodes else d
                      for d in plan.decisions)
    return replace(plan, attaches=tuple(a for a in plan.attaches if a.node not in pool_nodes), decisions=decisions)


# --- pool mode: free pool GPUs as devices that bind to a node once DDS has attached them -----------------------------
#
# kube-scheduler allocates a pool device to a claim and picks the node (`bindsToNode`), then waits in PreBind until the
# claim's `status.devices[]` entry has the binding condition True; DDS attaches a GPU of the device's model to that
# node and sets it (or the failure condition, so the scheduler tries again). The fabric attaches a model, not a named
# device, so a pool lists *slots*: every slot an allocation holds, plus one free slot per free GPU not yet promised to
# an allocation still waiting for its attach.

POOL_PREFIX = "fabric-"  # a pool slice's pool name: fabric-<fabric pool> (node-local pools are named by node)
ATTACHED = "dds.cdi.dev/attached"  # binding condition: the GPU is attached to the allocation's node
ATTACH_FAILED = "dds.cdi.dev/attach-failed"  # binding failure condition: the attach failed, the scheduler retries


def dra_pool_name(fabric_pool: str) -> str:
    return f"{POOL_PREFIX}{fabric_pool}"


def slot_device(model: str, index: int, fabric_pool: str, driver: str = DRIVER) -> DraDevice:
    device = gpu_device(model, f"{fabric_pool}/{model}-slot-{index:03d}", dra_pool_name(fabric_pool), driver)
    return replace(device, binds_to_node=True, binding_conditions=(ATTACHED,), binding_failure_conditions=(ATTACH_FAILED,))


@dataclass(frozen=True, slots=True)
class PoolBinding:
    """An allocated pool slot whose GPU DDS still has to attach to `node` (or report as failed)."""

    claim: ResourceClaimInfo
    device: str  # the slot's device name
    fabric_pool: str
    model: str
    node: str

    @property
    def key(self) -> str:
        """The attach's idempotency key: one attach per (claim, allocation, slot), whichever DDS process starts it;
        a new allocation after a failed one gets a new attach."""
        return f"dra-bind/{self.claim.uid or self.claim.key}/{self.claim.allocated_at}/{self.device}"


def _slot_model(device: str, fabric_pool: str, models: Iterable[str]) -> Optional[str]:
    return next((m for m in sorted(models) if device.startswith(device_name(f"{fabric_pool}/{m}-slot-"))), None)


def _slot_results(state: DraState, fabric_pool: str,
                  driver: str) -> list[tuple[ResourceClaimInfo, AllocatedDeviceInfo]]:
    pool = dra_pool_name(fabric_pool)
    return [(c, r) for c in state.claims if c.allocated for r in c.allocated if r.driver == driver and r.pool == pool]


def _bound(claim: ResourceClaimInfo, device: str) -> bool:
    return ATTACHED in claim.true_conditions.get(device, ()) or bool(claim.fabric_devices)


def pool_bindings(state: DraState, models_by_pool: Mapping[str, Iterable[str]],
                  driver: str = DRIVER) -> tuple[PoolBinding, ...]:
    """Allocated slots whose binding condition is neither True nor failed yet, in a stable order."""
    out = []
    for fabric_pool, models in sorted(models_by_pool.items()):
        for claim, result in _slot_results(state, fabric_pool, driver):
            done = claim.true_conditions.get(result.device, ())
            model = _slot_model(result.device, fabric_pool, models)
            if ATTACHED in done or ATTACH_FAILED in done or model is None or claim.allocated_node is None:
                continue
            out.append(PoolBinding(claim, result.device, fabric_pool, model, claim.allocated_node))
    return tuple(sorted(out, key=lambda b: b.key))


def pool_slots(fabric_pool: str, free: Mapping[str, int], state: DraState,
               driver: str = DRIVER) -> tuple[DraDevice, ...]:
    """The slots a pool's slice lists: every allocated one whose attach has not failed, and one unallocated per free
    GPU that no allocation waiting for its attach has promised already. A slot whose attach failed is left out, so
    the scheduler, which deallocates it, cannot allocate it again before a GPU is free (a GPU promised to a slot may
    be taken by another attach meanwhile: the failure is how the slot learns it)."""
    held: dict[str, set[int]] = {m: set() for m in free}
    waiting: dict[str, int] = {m: 0 for m in free}
    for claim, result in _slot_results(state, fabric_pool, driver):
        model = _slot_model(result.device, fabric_pool, free)
        if model is None or ATTACH_FAILED in claim.true_conditions.get(result.device, ()):
            continue
        index = int(result.device.rsplit("-", 1)[-1]) if result.device.rsplit("-", 1)[-1].isdigit() else -1
        held[model].add(index)
        if not _bound(claim, result.device):
            waiting[model] += 1
    out = []
    for model in sorted(free):
        indexes = set(held[model])
        spare, index = max(0, free[model] - waiting[model]), 0
        while spare:
            if index not in indexes:
                indexes.add(index)
                spare -= 1
            index += 1
        out += [slot_device(model, i, fabric_pool, driver) for i in sorted(i for i in indexes if i >= 0)]
    return tuple(out)
