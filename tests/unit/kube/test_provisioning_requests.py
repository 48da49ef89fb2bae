"""Reading ProvisioningRequests a tenant wrote, and merging the conditions DDS writes (dds/kube/provisioning.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from dds.kube.provisioning import (MAX_PODS, ProvisioningRequestReader, RequestInvalid, conditions_of,
                                   merged_conditions, pod_sets_of)
from dds.model.provisioning import CA_ATOMIC_CLASS, DEFAULT_CLASS, ProvisioningView


def spec(*pod_sets) -> dict:
    return {"spec": {"provisioningClassName": "attach-or-provision.dds.cdi.dev", "podSets": list(pod_sets)}}


def test_pod_sets_are_read_as_template_and_count():
    assert pod_sets_of(spec({"podTemplateRef": {"name": "a"}, "count": 4}, {"podTemplateRef": {"name": "b"},
                                                                             "count": 1})) == [("a", 4), ("b", 1)]


@pytest.mark.parametrize("obj, says", [
    ({"spec": {}}, "empty"),
    (spec({"count": 2}), "podTemplateRef"),
    (spec({"podTemplateRef": "a", "count": 2}), "podTemplateRef"),
    (spec({"podTemplateRef": {"name": "a"}, "count": 0}), "positive"),
    (spec({"podTemplateRef": {"name": "a"}, "count": "4"}), "positive"),
    (spec({"podTemplateRef": {"name": "a"}, "count": True}), "positive"),
    (spec({"podTemplateRef": {"name": "a"}, "count": 2**31 - 1}), f"{MAX_PODS}"),
    (spec("not a pod set"), "podTemplateRef"),
])
def test_a_request_dds_cannot_serve_is_refused_with_why(obj, says):
    with pytest.raises(RequestInvalid, match=says):
        pod_sets_of(obj)


def test_conditions_are_read_by_type_and_odd_entries_skipped():
    obj = {"status": {"conditions": [{"type": "Provisioned", "status": "True", "reason": "R", "message": "m",
                                      "lastTransitionTime": "2026-01-01T00:00:10Z"}, "junk", {"status": "True"}]}}
    (kind, condition), = conditions_of(obj).items()
    assert kind == "Provisioned" and condition.status == "True" and condition.since > 0


def test_a_condition_keeps_its_transition_time_unless_its_status_changes():
    current = [{"type": "Provisioned", "status": "False", "reason": "A", "message": "x",
                "lastTransitionTime": "2026-01-01T00:00:00Z"},
               {"type": "Accepted", "status": "True", "reason": "A", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    now = 1_800_000_000.0
    merged = merged_conditions(current, [("Provisioned", "False", "B", "y"), ("Accepted", "True", "A", "")], now)
    assert [c["lastTransitionTime"] for c in merged] == ["2026-01-01T00:00:00Z"] * 2
    merged = merged_conditions(current, [("Provisioned", "True", "C", "z"), ("Failed", "True", "D", "w")], now, 3)
    by_type = {c["type"]: c for c in merged}
    assert by_type["Provisioned"]["lastTransitionTime"] == by_type["Failed"]["lastTransitionTime"] == \
        "2027-01-15T08:00:00Z"
    assert by_type["Provisioned"]["observedGeneration"] == 3 and by_type["Accepted"]["reason"] == "A"


class _Template:
    def __init__(self, body):
        self.body = body


class _Api:
    """The three calls the reader makes, answering from dicts (a template raising `ApiException` when absent)."""

    def __init__(self, items, templates, list_error=None):
        self._items, self._templates, self._list_error = items, templates, list_error

    def list_cluster_custom_object(self, group, version, plural):
        if self._list_error is not None:
            raise self._list_error
        return {"items": self._items}

    def read_namespaced_pod_template(self, name, namespace):
        if name not in self._templates:
            raise client.ApiException(status=404, reason="Not Found")
        return _Template(self._templates[name])

    def sanitize_for_serialization(self, template):
        return template.body


def reader(items, templates=None, list_error=None) -> ProvisioningRequestReader:
    fake = _Api(items, templates or {}, list_error)
    out = ProvisioningRequestReader.__new__(ProvisioningRequestReader)
    out._api, out._custom, out._core, out._class, out._warned = fake, fake, fake, DEFAULT_CLASS, False
    out._cached = out._served = None  # no watch cache: listed every pass
    return out


def request(name, *pod_sets, klass=DEFAULT_CLASS) -> dict:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"provisioningClassName": klass, "podSets": list(pod_sets)}}


def pod_set(template, count=1) -> dict:
    return {"podTemplateRef": {"name": template}, "count": count}


GPU_POD = {"template": {"spec": {"containers": [{"name": "m", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}}
HOSTILE = {"template": {"spec": {"containers": [{"name": "m", "resources": {"requests": {"cpu": "1e400000"}}}]}}}


def test_each_request_is_read_on_its_own_and_a_hostile_one_refused_alone():
    items = [request("other-class", pod_set("ok"), klass="check-capacity.autoscaling.x-k8s.io"),
             request("hostile", pod_set("bad")), request("missing", pod_set("nowhere")),
             request("ok", pod_set("ok", 3)), "not an object"]
    view = reader(items, {"ok": GPU_POD, "bad": HOSTILE}).read()
    by_name = {r.name: r for r in view.requests}
    assert set(by_name) == {"hostile", "missing", "ok"} and view.complete
    assert by_name["hostile"].error and by_name["missing"].error == "PodTemplate team/nowhere does not exist"
    ok = by_name["ok"]
    assert ok.error is None and ok.pods == 3 and ok.pod_sets[0].template.containers[0].requests.scalar == {
        "nvidia.com/gpu": 2}


def test_a_list_that_fails_leaves_the_view_incomplete_and_an_api_not_served_has_no_request():
    assert reader([], list_error=client.ApiException(status=500, reason="boom")).read().complete is False
    assert reader([], list_error=client.ApiException(status=404, reason="Not Found")).read() == ProvisioningView()


def provisioned(obj: dict, reason: str = "CapacityAttached", **more: str) -> dict:
    conditions = [{"type": "Provisioned", "status": "True", "reason": reason, "message": ""}]
    conditions += [{"type": kind, "status": status, "reason": "R", "message": ""} for kind, status in more.items()]
    return {**obj, "status": {"conditions": conditions}}


def test_a_provisioned_request_still_booked_is_read_with_its_templates_and_never_refused_for_them():
    """While booked, DDS checks that the booked nodes still hold the pods to come (CapacityRevoked otherwise): their
    templates say what they need. Once the booking is over, the count is all that is read."""
    items = [provisioned(request("booked", pod_set("ok", 2))),
             provisioned(request("template-gone", pod_set("nowhere"))),
             provisioned(request("consumed", pod_set("ok")), reason="CapacityConsumed"),
             provisioned(request("expired", pod_set("ok")), BookingExpired="True"),
             provisioned(request("revoked", pod_set("ok")), CapacityRevoked="True")]
    by_name = {r.name: r for r in reader(items, {"ok": GPU_POD}).read().requests}
    assert by_name["booked"].pod_sets[0].template.containers[0].requests.scalar == {"nvidia.com/gpu": 2}
    assert by_name["template-gone"].error is None and by_name["template-gone"].pods == 1
    for name in ("template-gone", "consumed", "expired", "revoked"):
        assert by_name[name].error is None and by_name[name].pod_sets[0].template.containers == (), name


def test_requests_of_cas_atomic_class_are_read_too_and_say_so():
    """CA's best-effort-atomic scale-up reaches DDS as an IncreaseSize with no pod behind it: DDS plans the waiting
    requests of that class, so it reads them with their templates; once CA says Provisioned, the count is enough."""
    items = [request("waiting", pod_set("ok", 4), klass=CA_ATOMIC_CLASS),
             provisioned(request("admitted", pod_set("nowhere", 2), klass=CA_ATOMIC_CLASS),
                         reason="CapacityIsProvisioned"),
             request("check", pod_set("ok"), klass="check-capacity.autoscaling.x-k8s.io")]
    by_name = {r.name: r for r in reader(items, {"ok": GPU_POD}).read().requests}
    assert set(by_name) == {"waiting", "admitted"}
    waiting, admitted = by_name["waiting"], by_name["admitted"]
    assert waiting.cluster_autoscalers and waiting.class_name == CA_ATOMIC_CLASS and waiting.pods == 4
    assert waiting.pod_sets[0].template.containers[0].requests.scalar == {"nvidia.com/gpu": 2}
    assert admitted.cluster_autoscalers and admitted.error is None and admitted.pods == 2
    assert admitted.pod_sets[0].template.containers == ()
