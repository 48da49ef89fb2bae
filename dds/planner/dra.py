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

A group whose GPUs come under a GPU vendor's driver (`NodeGroupSpec.dra`, e.g. NVIDIA's gpu.nvidia.com) is offered
each model in the vendor's shape instead: learnt from a device of that model the vendor already publishes, else
described by the group's dds.cdi.dev/dra-models, else not offered at all (the refusal says DDS cannot describe it).
Each driver's groups count their GPUs in a resource of their own (`dra_gpu_resource`), so a claim is planned onto the
nodes of the drivers whose devices satisfy it only (docs/dra.md "A GPU vendor's DRA driver").
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from dds.model.dra_devices import DRIVER, device_name, dra_pool_name, gpu_device
from dds.model.groups import ANN_DRA_MODELS, DraDriverConfig, GpuApi, NodeGroupSpec, dra_gpu_resource
from dds.model.quantity import to_int
from dds.model.resources import Resources
from dds.model.text import bounded_text
from dds.model.dra_records import (ALL, AllocatedDeviceInfo, DeviceClassInfo, DeviceRequestInfo, DraDevice, DraState,
                                   PodClaimRef, ResourceClaimInfo, ResourceSliceInfo)
from dds.model.plan import ScaleUpPlan, Verdict
from dds.planner.refusals import CLAIM_NOT_PLANNED, NO_MATCHING_DEVICE, SELECTOR_BUDGET_SPENT
from dds.planner.requests import effective_requests
from dds.model.snapshot import (NOT_READABLE, ContainerRequests, NodeInfo, NodeSelectorTerm, PodInfo,
                                SelectorRequirement, Snapshot)


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
    kind: str = "selector"  # or "capacity request" (exactly.capacity.requests)

    def text(self) -> str:
        outcome = f"fails with {bounded_text(self.error, SELECTOR_ERROR_QUOTED)}" if self.error else "is false"
        # A tenant's selector may be 10 KiB long: the refusal (an Event, `dds plan`) quotes its start.
        return f"{self.source} {self.kind} `{bounded_text(self.selector, SELECTOR_QUOTED)}` {outcome} for {self.device}"


SELECTOR_QUOTED = 160  # characters of a selector a refusal quotes
SELECTOR_ERROR_QUOTED = 400  # and of its error (a compiler's error quotes the whole selector)


def evaluate(expression: str, device: DraDevice) -> tuple[bool, str]:
    """(matches, error): an error never matches (kube-scheduler aborts the allocation on one). Whatever the
    evaluation raises is that selector's error, never the caller's: a tenant's valid but expensive selector exhausts
    the evaluator's iteration budget (RuntimeError), and that must refuse its claim, not stop the pass."""
    try:
        value = compile_selector(expression).eval(data={"device": cel_device(device, expression)})
        plain = value.plain_value()
    except SelectorError as exc:
        return False, str(exc)
    except Exception as exc:  # the evaluator's own errors (RuntimeError, value conversions) are the selector's
        return False, f"an evaluation error ({exc})"
    if isinstance(plain, bool):
        return plain, ""
    return False, f"a non-boolean result ({bounded_text(repr(plain), SELECTOR_QUOTED)})"


Judge = Callable[[str, DraDevice], tuple[bool, str]]  # `evaluate`, or a pass's CelBudget.evaluate


# resource.k8s.io/v1 CELSelectorExpressionMaxLength: the apiserver admits no longer selector.
CEL_MAX_EXPRESSION_LENGTH = 10 * 1024


@dataclass(frozen=True, slots=True)
class CelLimits:
    """How much CEL one selector and one pass may cost DDS (settings `cel_max_expression_length`,
    `cel_evaluations_per_pass`, `cel_seconds_per_pass`). The evaluator bounds each evaluation itself (its iteration
    budget: an expression over it fails with an error, which refuses the claim); the apiserver bounds a selector's
    worst-case cost when it admits it (CELSelectorExpressionMaxCost). The seconds are measured on the caller's clock
    (CelBudget), so a pass spends at most them plus one evaluation."""

    max_expression_length: int = CEL_MAX_EXPRESSION_LENGTH
    evaluations_per_pass: int = 5_000
    seconds_per_pass: float = 1.0


class CelBudgetSpent(Exception):
    """The pass's selector evaluations are used up: the claims not judged yet are refused, not evaluated."""


class CelBudget:
    """One pass's selector evaluations. The same selector on the same offered device is evaluated once a pass (many
    claims of one template share their selectors); past `evaluations_per_pass` distinct evaluations, or
    `seconds_per_pass` on `clock` (the caller's: the planner reads none itself; None: no time bound), the remaining
    claims are refused (CelBudgetSpent) and judged again next pass, so no tenant's selectors make a pass unbounded."""

    def __init__(self, limits: CelLimits = CelLimits(), clock: Optional[Callable[[], float]] = None) -> None:
        self.limits = limits
        self.evaluations = 0
        self._clock = clock
        self._started = clock() if clock is not None else 0.0
        self._results: dict[tuple[str, int], tuple[DraDevice, tuple[bool, str]]] = {}

    def _spent(self) -> Optional[str]:
        limits = self.limits
        if self.evaluations >= limits.evaluations_per_pass:
            return f"this pass evaluated its {limits.evaluations_per_pass} CEL selectors (cel_evaluations_per_pass)"
        if self._clock is not None and self._clock() - self._started >= limits.seconds_per_pass:
            return (f"this pass spent its {limits.seconds_per_pass:g}s on CEL selectors (cel_seconds_per_pass) in "
                    f"{self.evaluations} evaluations")
        return None

    def evaluate(self, expression: str, device: DraDevice) -> tuple[bool, str]:
        limit = self.limits.max_expression_length
        if len(expression) > limit:
            return False, f"a selector of {len(expression)} characters, over the {limit} DDS evaluates"
        key = (expression, id(device))  # the device is kept with its result, so its id is not reused in the pass
        found = self._results.get(key)
        if found is not None:
            return found[1]
        spent = self._spent()
        if spent is not None:
            raise CelBudgetSpent(f"{spent} before reaching it; it is judged again next pass")
        self.evaluations += 1
        result = evaluate(expression, device)
        self._results[key] = (device, result)
        return result


def request_mismatch(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo], device: DraDevice,
                     label: str = "", judge: Judge = evaluate) -> Optional[Mismatch]:
    """None when `device` serves `request`, else the first selector that rejects it (the class's first). `label`
    names the device in the explanation (default: "device <name>")."""
    label = label or f"device {device.name}"
    cls = classes.get(request.device_class)
    if cls is None:
        return Mismatch(request.name, label, request.device_class, "DeviceClass",
                        error=f"DeviceClass {request.device_class!r} does not exist")
    for source, selectors in ((f"DeviceClass {cls.name}", cls.selectors), ("request", request.selectors)):
        for expression in selectors:
            ok, error = judge(expression, device)
            if not ok:
                return Mismatch(request.name, label, expression, source, error)
    return capacity_mismatch(request, device, label)


def _quantity_text(amount: int) -> str:
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if amount and amount % unit == 0:
            return f"{amount // unit}{suffix}"
    return str(amount)


def capacity_mismatch(request: DeviceRequestInfo, device: DraDevice, label: str) -> Optional[Mismatch]:
    """A capacity request (consumable capacity, `exactly.capacity.requests`) is a filter on the device's capacity,
    as `device.capacity[domain].name.compareTo(quantity(amount)) >= 0` would be (resource.k8s.io/v1
    CapacityRequirements). A device that takes one allocation at a time is then allocated whole, so a GPU with
    enough of every requested capacity serves the request exactly as without it. A name without a domain belongs to
    the device's driver."""
    for name, amount in sorted(request.capacity.items()):
        have = device.capacity.get(_qualified(name, device.driver))
        if have is None or have < amount:
            return Mismatch(request.name, label, f"{name} >= {_quantity_text(amount)}", "request",
                            "" if have is not None else f"no capacity {name} on the device", kind="capacity request")
    return None


# --- a vendor's driver: its devices, as learnt from the cluster or described by the group -----------------------------
#
# A vendor's DRA driver (NVIDIA's gpu.nvidia.com) publishes each node's GPUs itself, in its own shape. What N attaches
# of model M would give a node is then a device in that shape: learnt exactly from a device of M the vendor already
# publishes anywhere in the cluster (its id attribute, the GPU UUID, is the id of a fabric device of M; or its model
# attribute is the value the group's dds.cdi.dev/dra-models gives M), else described from dds.cdi.dev/dra-models. A
# model neither gives is not guessed: no claim is planned onto it, and a refusal says why.

OWN_DRIVER = DraDriverConfig()  # DDS's own driver, the default of every DRA group


def _qualified(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _is_gpu(device: DraDevice, config: DraDriverConfig) -> bool:
    """A device of the vendor's slices that is one GPU of the group's kind: it shows the model attribute and every
    attribute the group says its GPUs have (e.g. type=gpu, which tells a whole GPU from NVIDIA's MIG devices)."""
    attributes = device.attributes
    if _qualified(config.model_attribute, config.driver) not in attributes:
        return False
    return all(str(attributes.get(_qualified(k, config.driver))) == v for k, v in config.device_attributes.items())


def learnt_devices(slices: Iterable[ResourceSliceInfo], config: DraDriverConfig,
                   fabric_models: Mapping[str, str]) -> dict[str, DraDevice]:
    """Per fabric model, a device of `config.driver` published in the cluster that shows it: first one whose id
    attribute names a fabric device of that model (`fabric_models`: GPU UUID -> model), then one whose model
    attribute is the value dds.cdi.dev/dra-models gives the model. The first by slice and device name, so every pass
    learns the same one."""
    id_key = _qualified(config.device_id_attribute, config.driver)
    model_key = _qualified(config.model_attribute, config.driver)
    by_value = {d.value: m for m, d in config.models.items()}
    devices = [d for s in sorted(slices, key=lambda s: s.name) if s.driver == config.driver
               for d in sorted(s.devices, key=lambda d: d.name) if _is_gpu(d, config)]
    out: dict[str, DraDevice] = {}
    for device in devices:  # by the fabric's own id: the surest
        model = fabric_models.get(str(device.attributes.get(id_key, "")))
        if model is not None:
            out.setdefault(model, device)
    for device in devices:
        model = by_value.get(str(device.attributes.get(model_key)))
        if model is not None:
            out.setdefault(model, device)
    return out


def described_device(config: DraDriverConfig, model: str) -> Optional[DraDevice]:
    """`model` in the vendor's shape from the group's dds.cdi.dev/dra-models (None: no entry): the model attribute,
    the group's constant attributes, and the memory capacity when the entry gives one."""
    entry = config.models.get(model)
    if entry is None:
        return None
    attributes: dict[str, Any] = {_qualified(k, config.driver): v for k, v in config.device_attributes.items()}
    attributes[_qualified(config.model_attribute, config.driver)] = entry.value
    capacity = {_qualified(config.memory_capacity, config.driver): entry.memory} if entry.memory is not None else {}
    return DraDevice(name=device_name(f"{model}-described"), driver=config.driver, pool="described",
                     attributes=attributes, capacity=capacity)


@dataclass(frozen=True, slots=True)
class Offer:
    """A GPU model DDS can attach, as a device of one driver would show it; `device` None when DDS cannot describe the
    model in that driver's shape (`why_not` says so)."""

    model: str
    driver: str
    device: Optional[DraDevice]
    why_not: str = ""

    @property
    def label(self) -> str:
        own = self.driver == DRIVER
        return f"an attachable {self.model}" + ("" if own else f" as a {self.driver} device")


def _undescribed(config: DraDriverConfig, model: str) -> str:
    value = config.models.get(model)
    by_value = f" or whose {config.model_attribute} is {value.value!r}" if value else ""
    return (f"DDS cannot describe {model} as a {config.driver} device: no {config.driver} device in the cluster has "
            f"the {config.device_id_attribute} of a fabric {model}{by_value}, and {ANN_DRA_MODELS} has no entry for "
            f"{model}")


def offers_for(config: DraDriverConfig, models: Iterable[str], slices: Iterable[ResourceSliceInfo] = (),
               fabric_models: Optional[Mapping[str, str]] = None) -> tuple[Offer, ...]:
    """Each model as a device of `config.driver`: DDS's own shape for its own driver; learnt, else described, else
    not at all (with the reason) for a vendor's."""
    if config.own:
        return tuple(Offer(m, config.driver, gpu_device(m, f"pool/{m}", "pool", config.driver))
                     for m in sorted(set(models)))
    learnt = learnt_devices(slices, config, fabric_models or {})
    out = []
    for model in sorted(set(models)):
        device = learnt.get(model) or described_device(config, model)
        out.append(Offer(model, config.driver, device, "" if device else _undescribed(config, model)))
    return tuple(out)


def dra_drivers(groups: Iterable[NodeGroupSpec]) -> tuple[DraDriverConfig, ...]:
    """The distinct drivers' configurations of the DRA groups; DDS's own when there is no DRA group (claims are then
    judged as before, and refused for want of a DRA group)."""
    configs: list[DraDriverConfig] = []
    for group in groups:
        if group.gpu_api.dra and group.dra not in configs:
            configs.append(group.dra)
    return tuple(configs) or (OWN_DRIVER,)


def partitions_of(slices: Iterable[ResourceSliceInfo], configs: Sequence[DraDriverConfig]) -> tuple[DraDevice, ...]:
    """The devices of the drivers' slices that draw on shared counters (partitionable devices, KEP-4815) and are
    not a whole GPU of the driver (e.g. NVIDIA's MIG devices): what an attach brings too, but as part of a GPU."""
    by_driver = {c.driver: c for c in configs}
    return tuple(d for s in sorted(slices, key=lambda s: s.name) if s.driver in by_driver
                 for d in sorted(s.devices, key=lambda d: d.name)
                 if d.consumes_counters and not _is_gpu(d, by_driver[s.driver]))


# --- a pod's demand -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod's claims need of DDS: `gpus` new devices of one of the models `choices` gives per driver (None = no
    new device asked for), `held` GPUs per driver its allocated claims hold on its node, on `node` when an allocated
    claim already ties the pod to one; `refusal` when no attach can satisfy them."""

    gpus: int = 0
    choices: Optional[Mapping[str, frozenset[str]]] = None
    node: Optional[str] = None
    refusal: Optional[str] = None
    claims: tuple[str, ...] = ()
    held: tuple[tuple[str, int], ...] = ()
    # The Event reason of `refusal`: NoMatchingDevice (no GPU DDS can attach satisfies it) or ClaimNotPlanned (the
    # claim asks for something DDS does not plan, dds/planner/refusals.py).
    refusal_reason: str = NO_MATCHING_DEVICE

    @property
    def models(self) -> Optional[frozenset[str]]:
        """The models any driver accepts (None: no constraint)."""
        return None if self.choices is None else frozenset().union(*self.choices.values())


def _as_offer(item: Offer | DraDevice) -> Offer:
    if isinstance(item, Offer):
        return item
    return Offer(str(item.attributes.get(f"{item.driver}/model", item.name)), item.driver, item)


def accepted_by(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo],
                offers: Sequence[Offer | DraDevice], judge: Judge = evaluate
                ) -> tuple[dict[str, frozenset[str]], tuple[str, ...]]:
    """Per driver, the models whose offered device serves `request`; and why each other offer does not."""
    good: dict[str, set[str]] = {}
    why: list[str] = []
    for offer in map(_as_offer, offers):
        if offer.device is None:
            why.append(offer.why_not)
            continue
        found = request_mismatch(request, classes, offer.device, label=offer.label, judge=judge)
        if found is None:
            good.setdefault(offer.driver, set()).add(offer.model)
        else:
            why.append(found.text())
    return {d: frozenset(m) for d, m in good.items()}, tuple(why)


def models_for(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo],
               offers: Sequence[Offer | DraDevice]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The models (of any driver) that serve `request`, and why each other offer does not."""
    accepted, why = accepted_by(request, classes, offers)
    return frozenset().union(*accepted.values()), why


def _common(a: Mapping[str, frozenset[str]], b: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    # A node's GPUs come under one driver and are of one model: what both accept, driver by driver.
    return {d: a[d] & b[d] for d in sorted(a) if d in b and a[d] & b[d]}


def _request_count(request: DeviceRequestInfo) -> int:
    # "All" takes every matching device of the node at allocation time and needs at least one: one attach is the
    # least that makes it satisfiable on a node with none.
    return 1 if request.allocation_mode == ALL else max(1, request.count)


def _not_planned(claim: ResourceClaimInfo, what: str) -> Demand:
    return Demand(refusal=f"ResourceClaim {claim.key} {what}", refusal_reason=CLAIM_NOT_PLANNED)


def _unplanned_field(claim: ResourceClaimInfo, request: DeviceRequestInfo) -> Optional[Demand]:
    """The refusal for a request field DDS cannot honour by attaching whole GPUs, if the request has one."""
    if request.first_available:
        return _not_planned(claim, f"request {request.name!r} uses firstAvailable, which DDS does not plan")
    if request.admin_access:
        # Admin access reaches devices already on a node (monitoring, management) without allocating them: a GPU
        # attached for it would be nobody's, and the pod needs none to run.
        return _not_planned(claim, f"request {request.name!r} asks for adminAccess (access to devices already in "
                                   f"use, for monitoring), which no attach serves; DDS does not plan it")
    return None


def _shared_devices(request: DeviceRequestInfo, accepted: Mapping[str, frozenset[str]],
                    offers: Sequence[Offer | DraDevice]) -> tuple[str, ...]:
    """The accepted models whose device several allocations share (allowMultipleAllocations)."""
    return tuple(sorted({o.model for o in map(_as_offer, offers) if o.device is not None
                         and o.device.allow_multiple_allocations and o.model in accepted.get(o.driver, ())}))


def _partition_match(request: DeviceRequestInfo, classes: Mapping[str, DeviceClassInfo],
                     partitions: Sequence[DraDevice], judge: Judge = evaluate) -> Optional[DraDevice]:
    """A published partition (a device drawing on a GPU's shared counters, not a whole GPU) serving `request`."""
    return next((d for d in partitions if request_mismatch(request, classes, d, judge=judge) is None), None)


def claim_demand(claim: ResourceClaimInfo, classes: Mapping[str, DeviceClassInfo],
                 offers: Sequence[Offer | DraDevice], group_classes: Sequence[str] = (),
                 partitions: Sequence[DraDevice] = (), judge: Judge = evaluate) -> Demand:
    """An unallocated claim: the devices it needs and the models (per driver) that give them, or why none can.
    `group_classes`: the DeviceClasses the DRA groups' GPUs come under, named in a refusal for a request of another.
    `partitions`: the published devices that are partitions of a GPU (they consume its shared counters): a request
    only they serve is refused as such, not as one for no device at all. `judge` evaluates the selectors (a pass's
    CelBudget)."""
    choices: Optional[dict[str, frozenset[str]]] = None
    gpus = 0
    for request in claim.requests:
        unplanned = _unplanned_field(claim, request)
        if unplanned is not None:
            return unplanned
        accepted, why = accepted_by(request, classes, offers, judge)
        if not accepted:
            partition = _partition_match(request, classes, partitions, judge)
            if partition is not None:
                return _not_planned(claim, f"request {request.name!r} is served by partitions of a GPU (device "
                                           f"{partition.name} of {partition.driver} pool {partition.pool} draws on "
                                           f"counter set {', '.join(partition.consumes_counters)}), not by a whole "
                                           f"GPU; DDS attaches whole GPUs and does not plan partitions")
            hint = (f"; DDS node groups take GPUs through DeviceClass {', '.join(group_classes)}, not "
                    f"{request.device_class}" if group_classes and request.device_class not in group_classes else "")
            return Demand(refusal=f"ResourceClaim {claim.key} request {request.name!r}: no GPU DDS can attach "
                                  f"satisfies it ({'; '.join(why) or 'DDS attaches no GPU model at all'}){hint}")
        shared = _shared_devices(request, accepted, offers) if request.capacity else ()
        if shared:
            asked = ", ".join(f"{k}: {_quantity_text(v)}" for k, v in sorted(request.capacity.items()))
            return _not_planned(claim, f"request {request.name!r} asks for part of a device's capacity ({asked}) "
                                       f"and the {', '.join(shared)} devices are shared by several allocations "
                                       f"(allowMultipleAllocations); DDS attaches whole GPUs and does not plan shares "
                                       f"of one")
        choices = accepted if choices is None else _common(choices, accepted)
        if not choices:
            return Demand(refusal=f"ResourceClaim {claim.key}: its requests accept no common GPU model, and a node "
                                  f"holds one model at a time")
        gpus += _request_count(request)
    if claim.constraints:
        return _not_planned(claim, "has spec.devices.constraints, which DDS does not plan")
    return Demand(gpus=gpus, choices=choices, claims=(claim.key,))


def _merge(a: Demand, b: Demand) -> Demand:
    if a.refusal or b.refusal:
        return a if a.refusal else b
    if a.node and b.node and a.node != b.node:
        return Demand(refusal=f"claims {', '.join(a.claims + b.claims)} are allocated on different nodes "
                              f"({a.node}, {b.node})")
    choices = b.choices if a.choices is None else a.choices if b.choices is None else _common(a.choices, b.choices)
    if choices is not None and not choices:
        return Demand(refusal=f"claims {', '.join(a.claims + b.claims)} accept no common GPU model")
    return Demand(gpus=a.gpus + b.gpus, choices=choices, node=a.node or b.node, claims=a.claims + b.claims,
                  held=a.held + b.held)


@dataclass(frozen=True)
class _World:
    """Indexes over the DRA state and the offers, built once per lowering."""

    claims: Mapping[str, ResourceClaimInfo]
    templates: Mapping[str, ResourceClaimInfo]
    classes: Mapping[str, DeviceClassInfo]
    offers: tuple[Offer, ...]
    drivers: frozenset[str]
    group_classes: tuple[str, ...] = ()  # the DeviceClasses of the DRA groups (none: no DRA group to name)
    partitions: tuple[DraDevice, ...] = ()  # published GPU partitions of the groups' drivers (shared counters)
    budget: CelBudget = field(default_factory=CelBudget)  # the pass's selector evaluations

    @classmethod
    def build(cls, state: DraState, models: Iterable[str], configs: Sequence[DraDriverConfig],
              fabric_models: Optional[Mapping[str, str]] = None, group_classes: Sequence[str] = (),
              limits: CelLimits = CelLimits(), clock: Optional[Callable[[], float]] = None) -> "_World":
        templates = {f"{t.namespace}/{t.name}": ResourceClaimInfo(t.namespace, t.name, t.requests,
                                                                  constraints=t.constraints)
                     for t in state.templates}
        group_classes = tuple(sorted(set(group_classes)))
        models = sorted(set(models))
        offers = tuple(o for c in configs for o in offers_for(c, models, state.slices, fabric_models))
        return cls(claims={c.key: c for c in state.claims}, templates=templates,
                   classes={c.name: c for c in state.classes}, offers=offers,
                   drivers=frozenset(c.driver for c in configs), group_classes=group_classes,
                   partitions=partitions_of(state.slices, configs), budget=CelBudget(limits, clock))

    def all_models(self) -> dict[str, frozenset[str]]:
        """Per driver, every model an attach may bring (described or not): a claim accepting fewer is restricted."""
        out: dict[str, set[str]] = {}
        for offer in self.offers:
            out.setdefault(offer.driver, set()).add(offer.model)
        return {d: frozenset(m) for d, m in out.items()}

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


def _held(results: Iterable[AllocatedDeviceInfo], drivers: frozenset[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for result in results:
        if result.driver in drivers:  # other drivers' devices (NICs, ...) are not GPUs DDS attaches
            counts[result.driver] = counts.get(result.driver, 0) + 1
    return tuple(sorted(counts.items()))


def pod_demand(pod: PodInfo, world: _World, charged: set[str]) -> Demand:
    """The pod's claims as one Demand. `charged`: claims already counted on another pod of the pass (shared claims
    are counted once), updated in place."""
    total = Demand()
    for ref in pod.resource_claims:
        claim, missing = world.resolve(pod, ref)
        if claim is None:
            return Demand(refusal=f"waits for its claim: {missing}")
        if claim.allocated is not None:
            results = [r for r in claim.allocated if r.driver in world.drivers]
            # The allocation's node (node-local devices and devices that bind to a node); a node-local pool is
            # also named by its node (DDS's slices and NVIDIA's alike).
            node = claim.allocated_node or (results[0].pool if results else None)
            held = () if claim.key in charged or pod.node_name is None else _held(results, world.drivers)
            charged.add(claim.key)
            part = Demand(node=node, claims=(claim.key,), held=held)
        elif claim.key in charged:
            part = Demand(claims=(claim.key,))  # another pending pod of the same claim asks for its devices
        else:
            charged.add(claim.key)
            part = claim_demand(claim, world.classes, world.offers, world.group_classes, world.partitions,
                                world.budget.evaluate)
        total = _merge(total, part)
    return total


def _guarded_demand(pod: PodInfo, world: _World, charged: set[str]) -> Demand:
    """pod_demand, with whatever stops judging this pod's claims (the pass's CEL budget spent, an error in a
    tenant's claim or DeviceClass) as the pod's refusal: the other pods of the pass are planned all the same."""
    try:
        return pod_demand(pod, world, charged)
    except CelBudgetSpent as spent:
        return Demand(refusal=f"its ResourceClaims were not evaluated: {spent}", refusal_reason=SELECTOR_BUDGET_SPENT)
    except Exception as exc:  # one object's error: the pod is refused with it, the pass goes on
        return Demand(refusal=f"DDS could not judge its ResourceClaims ({type(exc).__name__}: "
                              f"{bounded_text(str(exc), SELECTOR_QUOTED)})", refusal_reason=NOT_READABLE)


def _chosen_driver(choices: Mapping[str, frozenset[str]]) -> str:
    # A pod asks for one planner resource; when claims accept the devices of several drivers' groups, DDS's own
    # driver first, else the first by name (docs/dra.md: "Several drivers").
    return DRIVER if DRIVER in choices else min(choices)


def _with_demand(pod: PodInfo, demand: Demand, model_label: str, all_models: Mapping[str, frozenset[str]]) -> PodInfo:
    if demand.refusal:
        # Never promised a fit (the simulation cannot satisfy what it cannot read); the refusal says why.
        unsupported = pod.unsupported + ((demand.refusal,) if pod.node_name is None else ())
        return replace(pod, dra_refusal=demand.refusal, dra_refusal_reason=demand.refusal_reason,
                       unsupported=unsupported, claims_lowered=True)
    scalar: dict[str, int] = {}
    for driver, count in demand.held:
        scalar[dra_gpu_resource(driver)] = scalar.get(dra_gpu_resource(driver), 0) + count
    wanted: list[SelectorRequirement] = []
    if demand.gpus and demand.choices:
        driver = _chosen_driver(demand.choices)
        resource = dra_gpu_resource(driver)
        scalar[resource] = scalar.get(resource, 0) + demand.gpus
        models = demand.choices[driver]
        if pod.node_name is None and models != all_models.get(driver):
            wanted.append(SelectorRequirement(model_label, "In", tuple(sorted(models))))
    containers = pod.containers
    if scalar:
        containers = containers + (ContainerRequests(Resources(scalar=scalar)),)
    fields = (SelectorRequirement("metadata.name", "In", (demand.node,)),) if (
        pod.node_name is None and demand.node) else ()
    affinity = pod.required_node_affinity
    if wanted or fields:
        terms = affinity or (NodeSelectorTerm(),)
        affinity = tuple(NodeSelectorTerm(t.match_expressions + tuple(wanted), t.match_fields + fields)
                         for t in terms)
    return replace(pod, containers=containers, required_node_affinity=affinity, claims_lowered=True)


# --- extended resources served by DRA (KEP-5004, beta and on in Kubernetes 1.36) -------------------------------------
#
# A DeviceClass with `extendedResourceName: nvidia.com/gpu` (and every class, as deviceclass.resource.kubernetes.io/
# <class>) serves pods asking for that extended resource on nodes whose allocatable does not have it: kube-scheduler
# (noderesources fit.go shouldDelegateResourceToDRA) leaves the resource to the dynamicresources plugin, which
# allocates the class's devices and records them in a claim it makes for the pod (status.extendedResourceClaimStatus).
# DDS plans such a pod as if it named that claim: one request of the class per resource, for the count the pod asks.

IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"  # resource.k8s.io/v1 ResourceDeviceClassPrefix


def extended_resource_classes(classes: Iterable[DeviceClassInfo],
                              served_as_capacity: Iterable[str] = ()) -> dict[str, str]:
    """Extended resource name -> the DeviceClass serving it through DRA. Of two classes naming the same resource the
    later created wins, then the first by name (as kube-scheduler's extended resource cache). `served_as_capacity`:
    resources DDS's extended-resource groups show as node capacity: a pod asking for one is theirs (the scheduler uses
    a node's capacity where it has some), so it is not lowered to a claim."""
    out: dict[str, str] = {}
    chosen: dict[str, DeviceClassInfo] = {}
    for cls in sorted(classes, key=lambda c: c.name):
        out[IMPLICIT_CLASS_PREFIX + cls.name] = cls.name
        name = cls.extended_resource_name
        if name and (name not in chosen or cls.created_at > chosen[name].created_at):
            chosen[name] = cls
    out.update({name: cls.name for name, cls in chosen.items()})
    for name in served_as_capacity:
        out.pop(name, None)
    return out


def _without(containers: tuple[ContainerRequests, ...], names: frozenset[str]) -> tuple[ContainerRequests, ...]:
    return tuple(replace(c, requests=replace(c.requests, scalar={k: v for k, v in c.requests.scalar.items()
                                                                 if k not in names}))
                 if names & set(c.requests.scalar) else c for c in containers)


def _served_by_dra(pod: PodInfo, mapped: Mapping[str, str]) -> dict[str, int]:
    asked = effective_requests(pod).scalar
    return {name: asked[name] for name in sorted(asked) if name in mapped and asked[name] > 0}


def extended_resource_claims(pods: Sequence[PodInfo], state: DraState, groups: Sequence[NodeGroupSpec] = ()
                             ) -> tuple[tuple[PodInfo, ...], DraState]:
    """Pods asking for extended resources a DeviceClass serves, rewritten to name a claim for them (as kube-scheduler
    makes one: `<pod>-extended-resources`, one request of the class per resource) without those resources in their
    containers; pods whose scheduler-made claim exists already lose the resources it covers (its allocation is then
    counted like any claim's). The state gains the claims made here. Without such pods: the same objects."""
    if not state.classes:
        return tuple(pods), state
    mapped = extended_resource_classes(state.classes, {g.gpu_resource for g in groups if not g.gpu_api.dra})
    made: list[ResourceClaimInfo] = []
    out: list[PodInfo] = []
    for pod in pods:
        covered = frozenset(r for ref in pod.resource_claims for r in ref.extended_resources)
        if covered:
            out.append(replace(pod, containers=_without(pod.containers, covered),
                               init_containers=_without(pod.init_containers, covered)))
            continue
        wanted = _served_by_dra(pod, mapped) if pod.node_name is None and not pod.claims_lowered else {}
        if not wanted:
            out.append(pod)
            continue
        name = f"{pod.name}-extended-resources"
        made.append(ResourceClaimInfo(pod.namespace, name, tuple(
            DeviceRequestInfo(resource, mapped[resource], count=count) for resource, count in wanted.items())))
        names = frozenset(wanted)
        out.append(replace(pod, containers=_without(pod.containers, names),
                           init_containers=_without(pod.init_containers, names),
                           resource_claims=pod.resource_claims + (PodClaimRef("extended-resources", name),)))
    if not made and all(a is b for a, b in zip(out, pods)):
        return tuple(pods), state
    return tuple(out), replace(state, claims=state.claims + tuple(made))


def lower_pods(pods: Sequence[PodInfo], state: DraState, models: Iterable[str], model_label: str,
               groups: Sequence[NodeGroupSpec] = (), fabric_models: Optional[Mapping[str, str]] = None,
               limits: CelLimits = CelLimits(), clock: Optional[Callable[[], float]] = None) -> tuple[PodInfo, ...]:
    """Every pod with resource claims rewritten as the GPU requests they amount to (see the module docstring); other
    pods are returned as they are (the same objects). Bound pods are charged first, so a claim shared by a running
    and a pending pod is never asked for twice. `groups` give the DRA drivers to judge claims against (none: DDS's
    own); `fabric_models` (GPU UUID -> model of the fabric's devices) lets a vendor's published devices teach their
    model's shape. Extended resources a DeviceClass serves are claims too (`extended_resource_claims`). `limits`
    bound the pass's CEL (CelBudget, its seconds on `clock`). An error judging one pod's claims refuses that pod,
    never the others."""
    pods, state = extended_resource_claims(pods, state, groups)
    if not any(p.resource_claims and not p.claims_lowered for p in pods):
        return tuple(pods)
    world = _World.build(state, models, dra_drivers(groups), fabric_models,
                         [g.dra.device_class for g in groups if g.gpu_api.dra], limits, clock)
    all_models = world.all_models()
    charged: set[str] = set()
    lowered: dict[str, PodInfo] = {}
    ordered = sorted((p for p in pods if p.resource_claims and not p.claims_lowered),
                     key=lambda p: (p.node_name is None, -p.priority, p.created_at, p.key))
    for pod in ordered:
        lowered[pod.key] = _with_demand(pod, _guarded_demand(pod, world, charged), model_label, all_models)
    return tuple(lowered.get(p.key, p) if p.resource_claims else p for p in pods)


# --- devices a detach must leave alone, and the GPUs a vendor's driver shows -----------------------------------------

def claimed_devices(state: DraState, driver: str = DRIVER) -> frozenset[tuple[str, str]]:
    """(pool, device name) of every device an allocated claim holds."""
    return frozenset((r.pool, r.device) for c in state.claims if c.allocated
                     for r in c.allocated if r.driver == driver)


def _vendor_configs(groups: Iterable[NodeGroupSpec]) -> tuple[DraDriverConfig, ...]:
    return tuple(c for c in dra_drivers(groups) if not c.own)


def claimed_vendor_devices(state: DraState, configs: Sequence[DraDriverConfig]) -> frozenset[str]:
    """The fabric ids (the vendor's id attribute, the GPU UUID) of the vendor's devices an allocated claim holds."""
    if not configs:
        return frozenset()
    id_keys = {c.driver: _qualified(c.device_id_attribute, c.driver) for c in configs}
    held = {(r.driver, r.pool, r.device) for c in state.claims if c.allocated for r in c.allocated
            if r.driver in id_keys}
    if not held:
        return frozenset()
    return frozenset(str(d.attributes[id_keys[s.driver]]) for s in state.slices if s.driver in id_keys
                     for d in s.devices if (s.driver, s.pool, d.name) in held and id_keys[s.driver] in d.attributes)


def _published_gpus(state: DraState, configs: Sequence[DraDriverConfig]) -> dict[tuple[str, str], int]:
    """(driver, node) -> GPUs the vendor's driver publishes on the node (node-local slices)."""
    by_driver = {c.driver: c for c in configs}
    out: dict[tuple[str, str], int] = {}
    for s in state.slices:
        config = by_driver.get(s.driver)
        node = s.node_name
        if config is None or node is None:
            continue
        count = sum(1 for d in s.devices if _is_gpu(d, config))
        out[(s.driver, node)] = out.get((s.driver, node), 0) + count
    return out


def mark_claimed(snapshot: Snapshot, driver: str = DRIVER, fabric_ids: Optional[Mapping[str, str]] = None
                 ) -> Snapshot:
    """The snapshot with `Device.in_claim` set on the fabric devices allocated to a claim (node-local pools are named
    by node, devices by `device_name`; pool mode names the devices DDS attached for a claim on the claim; a vendor's
    devices name theirs in their id attribute, the GPU UUID: `fabric_ids` maps it to the fabric's device id where the
    two differ, e.g. a ComposableResource's name), and the nodes of vendor-driver groups showing the GPUs their driver
    publishes (a GPU the vendor lists is the node's, even one the fabric does not report)."""
    configs = _vendor_configs(snapshot.groups)
    held = claimed_devices(snapshot.dra, driver)
    # The annotation naming the devices DDS attached for a pool-mode claim is writable by whoever may update the
    # claim: it keeps only devices on the node the scheduler allocated the claim to, never another node's GPUs.
    annotated = {(c.allocated_node, d) for c in snapshot.dra.claims
                 if c.allocated is not None and c.allocated_node for d in c.fabric_devices}
    ids = fabric_ids or {}
    attached_for_claims = {ids.get(u, u) for u in claimed_vendor_devices(snapshot.dra, configs)}
    published = _published_gpus(snapshot.dra, configs) if configs else {}
    if not held and not annotated and not attached_for_claims and not published:
        return snapshot
    vendor_of = {g.id: g.dra.driver for g in snapshot.groups if g.gpu_api.dra and not g.dra.own}

    def marked(node: NodeInfo) -> NodeInfo:
        devices = tuple(replace(d, in_claim=True) if (node.name, device_name(d.id)) in held
                        or (node.name, d.id) in annotated or d.id in attached_for_claims else d for d in node.devices)
        shown = published.get((vendor_of.get(node.group_id or ""), node.name), 0)
        allocatable = node.allocatable
        if shown > allocatable.get(node.gpu_resource):
            allocatable = allocatable.with_scalar(node.gpu_resource, shown)
        if devices == node.devices and allocatable is node.allocatable:
            return node
        return replace(node, devices=devices, allocatable=allocatable)

    return replace(snapshot, nodes=tuple(marked(n) for n in snapshot.nodes))


def fabric_models_of(nodes: Iterable[NodeInfo], fabric_ids: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """GPU UUID -> model of the fabric devices on the nodes. `fabric_ids` (GPU UUID -> fabric device id) where the
    fabric names a device otherwise; else a device's id is its UUID (the simulated fabric's ids stand for it)."""
    uuid_of = {fabric_id: uuid for uuid, fabric_id in (fabric_ids or {}).items()}
    return {uuid_of.get(d.id, d.id): d.model for n in nodes for d in n.devices}


def lower_claims(snapshot: Snapshot, driver: str = DRIVER, fabric_ids: Optional[Mapping[str, str]] = None
                 ) -> Snapshot:
    """The snapshot as the planner plans it: claims lowered to GPU requests against the DRA groups' drivers,
    claimed devices marked, vendor-published GPUs counted. The models are those the pools hold. `fabric_ids`: GPU
    UUID -> fabric device id, where they differ."""
    # Device classes alone matter too: a pod asking for an extended resource a class serves is a claim (KEP-5004).
    if snapshot.dra.claims or snapshot.dra.classes or any(p.resource_claims and not p.claims_lowered
                                                          for p in snapshot.pods):
        models = {m for p in snapshot.pools for m in p.free} | {d.model for n in snapshot.nodes for d in n.devices}
        pods = lower_pods(snapshot.pods, snapshot.dra, models, snapshot.gpu_model_label, snapshot.groups,
                          fabric_models_of(snapshot.nodes, fabric_ids))
        if any(a is not b for a, b in zip(pods, snapshot.pods)):
            snapshot = replace(snapshot, pods=pods)
    return mark_claimed(snapshot, driver, fabric_ids)


def lower_observed(pods: Sequence[PodInfo], state: DraState, models: Iterable[str], model_label: str,
                   groups: Sequence[NodeGroupSpec] = (), fabric_models: Optional[Mapping[str, str]] = None,
                   limits: CelLimits = CelLimits(), clock: Optional[Callable[[], float]] = None
                   ) -> tuple[PodInfo, ...]:
    """`lower_pods` for the observer, before anything reads the pods' GPU requests (idle tracking included). Without
    `groups`, claims are judged against DDS's own driver only. `clock` measures the pass's CEL seconds."""
    return lower_pods(pods, state, models, model_label, groups, fabric_models, limits, clock)


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

ATTACHED = "dds.cdi.dev/attached"  # binding condition: the GPU is attached to the allocation's node
ATTACH_FAILED = "dds.cdi.dev/attach-failed"  # binding failure condition: the attach failed, the scheduler retries


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
        return binding_key(self.claim, self.device)


BINDING_KEY_PREFIX = "dra-bind/"


def binding_key(claim: ResourceClaimInfo, device: str) -> str:
    """The key of the attach for `device` of the claim's current allocation (PoolBinding.key)."""
    return f"{BINDING_KEY_PREFIX}{claim.uid or claim.key}/{claim.allocated_at}/{device}"


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
