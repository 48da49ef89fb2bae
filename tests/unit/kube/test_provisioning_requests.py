"""Reading ProvisioningRequests a tenant wrote, and merging the conditions DDS writes (dds/kube/provisioning.py)."""

from __future__ import annotations

import pytest

from dds.kube.provisioning import MAX_PODS, RequestInvalid, conditions_of, merged_conditions, pod_sets_of


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
