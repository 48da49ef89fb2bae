"""No tenant input stops DDS (issue 37): generated hostile objects, read the way the watch cache reads them and planned
beside an ordinary GPU pod, never raise, and the ordinary pod is planned as it would be alone.

What a namespace user can write is generated as raw API JSON: ResourceClaims and DeviceClasses with pathological CEL
(nested comprehensions over long lists, deep nesting, unicode, huge numbers, selectors that do not compile, that are
not boolean, that are longer than the limit), huge, negative and malformed quantities and counts; pods with such
resource lists, thirty containers, long affinities, tolerations, host ports, unicode annotations and labels of 5,000
characters, and claims; gang objects (custom resources, whose schema may be loose) of any JSON shape. The built-in
kinds keep the types the apiserver's schema fixes, except a spec of the wrong shape as a whole. They pass through the
cache's decoding (dds/kube/cache.py Reflector.decoded, the one place the observer decodes), the gang reader, DRA
lowering with a small per-pass CEL budget (dds/planner/dra.py) and a scale-up plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dds.kube import decode
from dds.kube.cache import Reflector, Resource, dra_resources, pods
from dds.kube.podgroups import PodGroupReader
from dds.model.dra_devices import DEVICE_CLASS, DRIVER
from dds.model.dra_records import DeviceClassInfo, DraState, PodClaimRef, ResourceClaimInfo
from dds.model.plan import PlannerConfig, Verdict
from dds.planner import plan_scale_up
from dds.planner.dra import CelLimits, lower_pods
from tests.unit.planner.builders import make_group, make_node, make_pod, make_pool, make_snapshot

GREEDY = PlannerConfig(batch_solver="greedy")
LIMITS = CelLimits(max_expression_length=2048, evaluations_per_pass=200)
CLASS = DeviceClassInfo(DEVICE_CLASS, (f'device.driver == "{DRIVER}"',))
TENANT = "tenant"


def _list(n: int) -> str:
    return "[" + ",".join(str(i) for i in range(n)) + "]"


# --- hostile values -------------------------------------------------------------------------------------------------

weird_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
huge_numbers = st.sampled_from([2**63 - 1, 2**63, -(2**63), 10**40, -1, 0, -10**30])
int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1, -1, 0]))
quantities = st.one_of(st.sampled_from(["1e999", "-5", "9223372036854775807", "1Ei", "99999999Ei", "0.0000001m",
                                        "NaN", "", "1.5", "   ", "१२", "1e40", "1e41"]), weird_text, huge_numbers)
# Any JSON: what a custom resource with a loose schema (gang objects) may hold; for the built-in kinds the apiserver's
# schema fixes the types, so only the top of their spec is given a wrong shape (what a decoder must survive).
anything: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), huge_numbers, st.floats(allow_nan=True), weird_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(weird_text, inner, max_size=3)),
    max_leaves=8)
wrong_shape = st.one_of(st.lists(anything, max_size=2), weird_text, huge_numbers, st.booleans())

cel = st.one_of(
    st.sampled_from([
        f"{_list(100)}.all(x, {_list(100)}.all(y, x + y >= 0))",  # over the evaluator's iteration budget
        f"{_list(60)}.exists(x, {_list(60)}.exists(y, {_list(60)}.exists(z, x + y + z < 0)))",
        "(" * 400 + "true" + ")" * 400, "!" * 1500 + "true", "[" * 300 + "]" * 300 + ".size() > 0",
        "device.driver ==", "1", '"text"', "device.attributes", "1 / 0 == 1", "9223372036854775807 + 1 > 0",
        'device.attributes["gpu.dds.cdi.dev"].model.matches("(a+)+$")', "device.nope.nope",
        "quantity(\"1e999\").compareTo(0) > 0", 'quantity("banana") == 1',
        'cel.bind(a, "xxxxxxxx", cel.bind(b, a + a, cel.bind(c, b + b, size(c) > 0)))',
        'device.attributes["ünïcödé.example.com"].größe == "😀"', "true" + " && true" * 600,
    ]),
    weird_text)


def selectors() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(st.builds(lambda e: {"cel": {"expression": e}}, cel), max_size=3)


def claim(name: str) -> st.SearchStrategy[dict[str, Any]]:
    exactly = st.fixed_dictionaries({}, optional={
        "deviceClassName": st.one_of(st.just(DEVICE_CLASS), weird_text), "selectors": selectors(),
        "allocationMode": st.one_of(st.sampled_from(["ExactCount", "All"]), weird_text),
        "count": int32, "adminAccess": st.booleans(),
        "capacity": st.fixed_dictionaries({"requests": st.dictionaries(weird_text, quantities, max_size=2)}),
        "tolerations": st.lists(st.fixed_dictionaries({"key": weird_text, "operator": weird_text}), max_size=2)})
    request = st.fixed_dictionaries({"name": weird_text}, optional={
        "exactly": exactly, "firstAvailable": st.lists(st.fixed_dictionaries({"name": weird_text}), max_size=2)})
    devices = st.fixed_dictionaries({}, optional={
        "requests": st.lists(request, max_size=3),
        "constraints": st.lists(st.fixed_dictionaries({"matchAttribute": weird_text}), max_size=2)})
    return st.fixed_dictionaries({
        "metadata": st.just({"name": name, "namespace": TENANT, "resourceVersion": "1"}),
        # A spec of the wrong shape stands for what no decoder expects; the apiserver's schema admits none of them.
        "spec": st.one_of(st.fixed_dictionaries({"devices": devices}), wrong_shape)})


def device_class(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "metadata": st.just({"name": name, "resourceVersion": "1"}),
        "spec": st.one_of(st.fixed_dictionaries({}, optional={"selectors": selectors(),
                                                             "extendedResourceName": weird_text}), wrong_shape)})


def pod(name: str) -> st.SearchStrategy[dict[str, Any]]:
    names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "dds.cdi.dev/gpu", "ünïcödé/gpu"])
    resources = st.fixed_dictionaries({}, optional={"requests": st.dictionaries(names, quantities, max_size=3),
                                                    "limits": st.dictionaries(names, quantities, max_size=3)})
    container = st.fixed_dictionaries({"name": st.just("c")}, optional={
        "resources": resources, "restartPolicy": weird_text,
        "ports": st.lists(st.fixed_dictionaries({"hostPort": int32}, optional={"protocol": weird_text}), max_size=2)})
    requirement = st.fixed_dictionaries({"key": weird_text, "operator": weird_text,
                                         "values": st.lists(weird_text, max_size=40)})
    terms = st.lists(st.fixed_dictionaries({"matchExpressions": st.lists(requirement, max_size=3)}), max_size=30)
    affinity = st.fixed_dictionaries({}, optional={
        "nodeAffinity": st.fixed_dictionaries({"requiredDuringSchedulingIgnoredDuringExecution":
                                               st.fixed_dictionaries({"nodeSelectorTerms": terms})}),
        "podAntiAffinity": st.fixed_dictionaries({"requiredDuringSchedulingIgnoredDuringExecution": st.lists(
            st.fixed_dictionaries({"topologyKey": weird_text, "labelSelector": st.fixed_dictionaries(
                {"matchExpressions": st.lists(requirement, max_size=2)})}), max_size=2)})})
    strings = st.dictionaries(weird_text, st.one_of(weird_text, st.text(max_size=5000)), max_size=4)
    spec = st.fixed_dictionaries({"containers": st.lists(container, min_size=1, max_size=30)}, optional={
        "initContainers": st.lists(container, max_size=3), "affinity": affinity, "priority": int32,
        "tolerations": st.lists(st.fixed_dictionaries({"key": weird_text, "operator": weird_text,
                                                       "effect": weird_text}), max_size=3),
        "nodeSelector": strings, "overhead": st.dictionaries(names, quantities, max_size=2),
        "topologySpreadConstraints": st.lists(st.fixed_dictionaries({"topologyKey": weird_text,
                                                                     "whenUnsatisfiable": weird_text}), max_size=2),
        "schedulingGroup": st.fixed_dictionaries({"podGroupName": weird_text}),
        "resourceClaims": st.lists(st.fixed_dictionaries({"name": weird_text}, optional={
            "resourceClaimName": st.sampled_from(["claim-0", "claim-1", "missing"]),
            "resourceClaimTemplateName": weird_text}), max_size=3)})
    meta = st.fixed_dictionaries({"name": st.just(name), "namespace": st.just(TENANT), "resourceVersion": st.just("1")},
                                 optional={"annotations": strings, "labels": strings,
                                           "creationTimestamp": st.sampled_from(["2026-11-28T10:00:00Z", "garbage"])})
    return st.fixed_dictionaries({"metadata": meta, "spec": st.one_of(spec, wrong_shape)})


def gang_object(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"metadata": st.just({"name": name, "namespace": TENANT}),
                                  "spec": st.one_of(st.fixed_dictionaries({"minMember": anything}), anything)})


# --- the world the hostile objects land in ----------------------------------------------------------------------------

def _decoded(resource: Resource[Any], objects: list[dict[str, Any]]) -> list[Any]:
    reflector = Reflector(None, resource)  # type: ignore[arg-type]  # decoding only: no request is sent
    return [v for v in (reflector.decoded(o) for o in objects) if v is not None]


class _Custom:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str) -> dict[str, Any]:
        return {"items": self.items}


def _named(make: Any, prefix: str) -> st.SearchStrategy[tuple[dict[str, Any], ...]]:
    """Up to three objects of distinct names (the pods name claim-0)."""
    return st.lists(st.integers(0, 4), max_size=3, unique=True).flatmap(
        lambda ids: st.tuples(*(make(f"{prefix}-{i}") for i in ids)))


def _ordinary_dra_pod() -> Any:
    return replace(make_pod("ordinary", namespace="other"), resource_claims=(PodClaimRef("gpu", claim_name="gpu"),))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(claims=_named(claim, "claim"), classes=st.lists(device_class("hostile-class"), max_size=1),
       pod_objects=_named(pod, "p"), gangs=st.lists(gang_object("g"), max_size=2))
def test_hostile_tenant_objects_never_stop_the_planning_of_the_others(claims, classes, pod_objects, gangs) -> None:
    claims, pod_objects = list(claims), list(pod_objects)
    resources = dra_resources()
    claim_infos = _decoded(resources["resourceclaims"], claims)
    class_infos = _decoded(resources["deviceclasses"], classes)
    records = _decoded(pods(), pod_objects)
    assert len(records) == len(pod_objects)  # a pod DDS cannot read is refused, never dropped
    PodGroupReader(None, objects=_Custom(gangs)).read([TENANT])  # type: ignore[arg-type]

    ordinary_claim = ResourceClaimInfo("other", "gpu", (decode.device_requests(
        {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}})))
    hostile = [r.info for r in records if r.info.node_name is None and not r.terminal]
    extended = make_pod("extended", namespace="other", gpus=1)
    snapshot = make_snapshot([make_node("w1", gpus=1)], [_ordinary_dra_pod(), extended, *hostile],
                             groups=[make_group("gpu")], pools=[make_pool(A30=4)])
    dra = DraState(claims=(ordinary_claim, *claim_infos), classes=(CLASS, *class_infos))
    lowered = lower_pods(snapshot.pods, dra, {"A30"}, snapshot.gpu_model_label, limits=LIMITS)
    by_key = {p.key: p for p in lowered}
    assert by_key["other/ordinary"].dra_refusal is None, by_key["other/ordinary"].dra_refusal

    plan = plan_scale_up(replace(snapshot, pods=tuple(p for p in lowered if p.key != "other/ordinary")), GREEDY)
    decisions = {d.pod: d for d in plan.decisions}
    assert decisions["other/extended"].verdict in (Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS)
    for pod_info in hostile:
        if pod_info.dra_refusal:  # refused: never promised a fit, and told why
            assert decisions[pod_info.key].verdict == Verdict.UNSUPPORTED
            assert decisions[pod_info.key].refusal
