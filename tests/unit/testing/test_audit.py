"""harness/audit.py reads the apiserver's audit log as the RBAC checks need it: each request of a ServiceAccount with
its verb, resource, subresource and answer; a 403 found and described; a line still being written left for later."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from harness import audit

DDS = "system:serviceaccount:dds-system:dds"
CA = "system:serviceaccount:dds-system:cluster-autoscaler"


def event(user: str, verb: str, code: int, resource: str = "", subresource: str = "", group: str = "",
          namespace: str = "", name: str = "") -> dict:
    ref = {"resource": resource, "apiGroup": group, "namespace": namespace, "name": name, "subresource": subresource}
    body = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata", "stage": "ResponseComplete",
            "requestURI": f"/x/{resource}", "verb": verb, "user": {"username": user},
            "responseStatus": {"code": code}}
    if resource:
        body["objectRef"] = {k: v for k, v in ref.items() if v}
    return body


def write(path: Path, events: list[dict], partial: str = "") -> None:
    with path.open("a") as log:
        for item in events:
            log.write(json.dumps(item) + "\n")
        log.write(partial)


def test_a_403_to_dds_is_found_with_what_was_asked(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    write(log, [event(DDS, "patch", 403, "resourceclaims", group="resource.k8s.io", namespace="demo", name="c1"),
                event(DDS, "get", 200, "nodes", name="n1"),
                event("system:serviceaccount:other:x", "get", 403, "secrets", namespace="demo", name="s"),
                event(CA, "update", 403, "nodes", subresource="status", name="n1")])
    requests, _ = audit.read_requests(log)
    refused = audit.forbidden(requests, [DDS, CA])
    assert [r.describe().split(" -> ")[0] for r in refused] == [
        f"{DDS}: patch resource.k8s.io/resourceclaims c1 in namespace demo",
        f"{CA}: update core/nodes/status n1"]


def test_only_allowed_resource_requests_count_as_used(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    write(log, [event(DDS, "update", 200, "resourceclaims", "status", "resource.k8s.io"),
                event(DDS, "list", 403, "secrets"),
                event(DDS, "get", 200),  # a non-resource URL (discovery): no objectRef
                event(CA, "list", 200, "pods")])
    requests, _ = audit.read_requests(log)
    assert audit.grants_used(requests, DDS) == {audit.Grant("update", "resourceclaims", "status", "resource.k8s.io")}


def test_the_cursor_reads_each_request_once_and_waits_for_a_line_being_written(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    cursor = audit.AuditCursor(lambda: [log])
    second = json.dumps(event(DDS, "list", 200, "pods"))
    write(log, [event(DDS, "get", 200, "nodes")], partial=second[:20])
    assert [r.resource for r in cursor.read()] == ["nodes"]
    write(log, [], partial=second[20:] + "\n")
    assert [r.resource for r in cursor.read()] == ["pods"]
    assert cursor.read() == []


def test_the_policy_logs_service_accounts_only_and_no_request_received_stage(tmp_path: Path) -> None:
    policy = yaml.safe_load(audit.write_policy(tmp_path / "policy.yaml").read_text())
    assert policy["omitStages"] == ["RequestReceived"]
    assert policy["rules"] == [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}]


def test_a_403_while_the_apiserver_restarts_is_not_a_verdict_on_the_roles(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    during = event(DDS, "list", 403, "pods")
    during["requestReceivedTimestamp"] = "2026-01-01T00:00:10.5Z"
    after = event(DDS, "list", 403, "nodes")
    after["requestReceivedTimestamp"] = "2026-01-01T00:01:00Z"
    write(log, [during, after])
    requests, _ = audit.read_requests(log)
    began = requests[0].received - 1
    assert [r.resource for r in audit.forbidden(requests, [DDS], [(began, began + 2)])] == ["nodes"]


def test_a_403_from_an_admission_webhooks_denial_is_not_an_rbac_gap(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    denied = event(DDS, "update", 403, "composabilityrequests", group="cro.hpsys.ibm.ie.com", name="dds-n1-gpu-a30")
    denied["responseStatus"]["message"] = ('admission webhook "vcomposabilityrequest-v1alpha1.kb.io" denied the '
                                           'request: composabilityRequest resource other with type gpu and model A30 '
                                           'already exists')
    rbac = event(DDS, "update", 403, "composabilityrequests", group="cro.hpsys.ibm.ie.com", name="dds-n2-gpu-a30")
    rbac["responseStatus"]["message"] = 'composabilityrequests "dds-n2-gpu-a30" is forbidden: User cannot update'
    write(log, [denied, rbac])
    requests, _ = audit.read_requests(log)
    assert [r.name for r in audit.forbidden(requests, [DDS])] == ["dds-n2-gpu-a30"]
