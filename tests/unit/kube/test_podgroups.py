"""Which pods form a gang, and its minimum, from coscheduling PodGroups, 1.35 Workloads and 1.36 PodGroups
(dds/kube/podgroups.py)."""

from __future__ import annotations

from dataclasses import replace

from kubernetes import client

from dds.kube import convert, decode
from dds.kube.podgroups import (COSCHEDULING, PODGROUPS_V1ALPHA2, PodGroupReader, PodGroups, gang_min_counts,
                                kinds_to_read, min_member, namespaces_to_read, scheduling_group_min_count,
                                served_gang_apis, snapshot_with_groups)
from dds.model.snapshot import POD_GROUP_LABEL, PodInfo, Snapshot, WorkloadRef
from dds.planner.gangs import gang_of

WORKLOAD = {
    "apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 4}}},
                           {"name": "loaders", "policy": {"basic": {}}}]},
}


def workload_pod(name: str, group: str = "workers", replica: str = "", node: str | None = None) -> PodInfo:
    return PodInfo("ml", name, node_name=node, workload_ref=WorkloadRef("train", group, replica))


def test_the_pod_field_workload_ref_is_decoded():
    raw = {"metadata": {"name": "w-0", "namespace": "ml"},
           "spec": {"containers": [], "workloadRef": {"name": "train", "podGroup": "workers",
                                                      "podGroupReplicaKey": "r1"}}}
    assert decode.pod_info(raw).workload_ref == WorkloadRef("train", "workers", "r1")
    assert decode.pod_info({"metadata": {"name": "p"}, "spec": {}}).workload_ref is None


def test_a_workloads_gang_policies_give_the_minimum_per_pod_group():
    assert gang_min_counts(WORKLOAD) == {"workers": 4}
    assert min_member({"spec": {"minMember": 3}}) == 3


def test_workload_pods_with_the_gang_policy_form_one_gang_per_replica():
    groups = PodGroups(workload_gangs={"ml/train": {"workers": 4}})
    pods = (workload_pod("a", replica="r1"), workload_pod("b", replica="r2"), workload_pod("c", group="loaders"),
            workload_pod("d", node="n1"))
    snapshot = snapshot_with_groups(Snapshot(now=0.0, pods=pods), groups)
    a, b, c, d = snapshot.pods
    assert (gang_of(a), a.pod_group_min_member) == ("ml/train/workers/r1", 4)
    assert gang_of(b) == "ml/train/workers/r2"
    assert gang_of(c) is None  # the basic policy is no gang
    assert gang_of(d) == "ml/train/workers"  # bound members are named too: they count towards the minimum


def test_an_unreadable_workload_leaves_the_minimum_unknown_but_keeps_the_gang():
    groups = PodGroups(unread_workloads=frozenset({"ml"}))
    (pod,) = snapshot_with_groups(Snapshot(now=0.0, pods=(workload_pod("a"),)), groups).pods
    assert (gang_of(pod), pod.pod_group_min_member) == ("ml/train/workers", 0)


def test_a_missing_workload_is_no_gang_yet():
    (pod,) = snapshot_with_groups(Snapshot(now=0.0, pods=(workload_pod("a"),)), PodGroups()).pods
    assert gang_of(pod) is None


def test_coscheduling_pods_get_their_podgroups_min_member():
    pod = PodInfo("ml", "w-0", labels={POD_GROUP_LABEL: "ddp"})
    (filled,) = snapshot_with_groups(Snapshot(now=0.0, pods=(pod,)), PodGroups(min_member={"ml/ddp": 3})).pods
    assert (filled.pod_group, filled.pod_group_min_member) == ("ddp", 3)


def test_only_namespaces_with_a_pending_grouped_pod_are_read():
    pods = (workload_pod("a"), replace(workload_pod("b", node="n1"), namespace="other"), PodInfo("third", "x"))
    assert namespaces_to_read(Snapshot(now=0.0, pods=pods)) == frozenset({"ml"})


class _Custom:
    def __init__(self, answers):
        self.answers = answers

    def list_namespaced_custom_object(self, group, version, namespace, plural):
        answer = self.answers.get(f"{plural}.{version}.{group}", self.answers.get(plural, []))
        if isinstance(answer, Exception):
            raise answer
        return {"items": answer}


def reader_with(answers) -> PodGroupReader:
    return PodGroupReader(client.ApiClient(), objects=_Custom(answers))


def test_a_kind_not_served_is_none_and_a_failing_read_leaves_the_minimum_unknown():
    not_served = client.ApiException(status=404, reason="Not Found")
    groups = reader_with({"podgroups": not_served, "workloads": [WORKLOAD]}).read(["ml"])
    assert groups.workload_gangs == {"ml/train": {"workers": 4}} and groups.unread_podgroups == frozenset()
    groups = reader_with({"podgroups": [], "workloads": ConnectionRefusedError("no route")}).read(["ml"])
    assert groups.unread_workloads == frozenset({"ml"})


# --- Kubernetes 1.36: scheduling.k8s.io/v1alpha2 PodGroups named by `spec.schedulingGroup` ---

PODGROUP_V1ALPHA2 = {
    "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
    "metadata": {"name": "train-workers-0", "namespace": "ml"},
    "spec": {"podGroupTemplateRef": {"workload": {"workloadName": "train", "podGroupTemplateName": "workers"}},
             "schedulingPolicy": {"gang": {"minCount": 4}}},
}
BASIC_V1ALPHA2 = {"metadata": {"name": "loaders", "namespace": "ml"}, "spec": {"schedulingPolicy": {"basic": {}}}}


def grouped_pod(name: str, group: str = "train-workers-0", node: str | None = None) -> PodInfo:
    return PodInfo("ml", name, node_name=node, scheduling_group=group)


def test_the_pod_field_scheduling_group_is_decoded_from_json_and_from_the_client_model():
    raw = {"metadata": {"name": "w-0", "namespace": "ml"},
           "spec": {"containers": [], "schedulingGroup": {"podGroupName": "train-workers-0"}}}
    assert decode.pod_info(raw).scheduling_group == "train-workers-0"
    assert decode.pod_info({"metadata": {"name": "p"}, "spec": {}}).scheduling_group is None
    model = client.V1Pod(metadata=client.V1ObjectMeta(name="w-0", namespace="ml"), spec=client.V1PodSpec(
        containers=[], scheduling_group=client.V1PodSchedulingGroup(pod_group_name="train-workers-0")))
    assert convert.pod_info(model).scheduling_group == "train-workers-0"


def test_a_v1alpha2_podgroups_gang_policy_gives_the_minimum_and_the_basic_policy_none():
    assert scheduling_group_min_count(PODGROUP_V1ALPHA2) == 4
    assert scheduling_group_min_count(BASIC_V1ALPHA2) is None


def test_pods_of_a_v1alpha2_gang_podgroup_form_one_gang_and_basic_or_missing_groups_none():
    groups = PodGroups(scheduling_groups={"ml/train-workers-0": 4, "ml/loaders": None})
    pods = (grouped_pod("a"), grouped_pod("b", node="n1"), grouped_pod("c", group="loaders"),
            grouped_pod("d", group="not-created-yet"))
    a, b, c, d = snapshot_with_groups(Snapshot(now=0.0, pods=pods), groups).pods
    assert (gang_of(a), a.pod_group_min_member) == ("ml/train-workers-0", 4)
    assert gang_of(b) == "ml/train-workers-0"  # bound: counts towards the minimum
    assert gang_of(c) is None and gang_of(d) is None


def test_an_unreadable_v1alpha2_podgroup_leaves_the_minimum_unknown_but_keeps_the_gang():
    groups = PodGroups(unread_scheduling_groups=frozenset({"ml"}))
    (pod,) = snapshot_with_groups(Snapshot(now=0.0, pods=(grouped_pod("a"),)), groups).pods
    assert (gang_of(pod), pod.pod_group_min_member) == ("ml/train-workers-0", 0)


def test_only_the_kinds_the_pending_pods_name_are_read():
    pods = (grouped_pod("a"), PodInfo("ml", "x", labels={POD_GROUP_LABEL: "ddp"}), workload_pod("w", node="n1"))
    assert kinds_to_read(Snapshot(now=0.0, pods=pods)) == (COSCHEDULING, PODGROUPS_V1ALPHA2)


def test_v1alpha2_podgroups_are_listed_apart_from_coscheduling_podgroups():
    reader = reader_with({"podgroups.v1alpha2.scheduling.k8s.io": [PODGROUP_V1ALPHA2],
                          "podgroups.v1alpha1.scheduling.x-k8s.io": [{"metadata": {"name": "ddp", "namespace": "ml"},
                                                                      "spec": {"minMember": 3}}]})
    groups = reader.read(["ml"])
    assert groups.scheduling_groups == {"ml/train-workers-0": 4} and groups.min_member == {"ml/ddp": 3}


class _Watched:
    def __init__(self, items, synced=True):
        self.items, self.synced = items, synced

    def values(self):
        return tuple(self.items)


def test_a_watched_kind_is_read_from_the_cache_without_a_request():
    class NoRequests:
        def list_namespaced_custom_object(self, *args):
            raise AssertionError(f"listed {args} although the kind is watched")

    other = {"metadata": {"name": "x", "namespace": "elsewhere"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 9}}}}
    reader = PodGroupReader(client.ApiClient(), objects=NoRequests(),
                            cached={PODGROUPS_V1ALPHA2: _Watched([PODGROUP_V1ALPHA2, other])})
    assert reader.read(["ml"], (PODGROUPS_V1ALPHA2,)).scheduling_groups == {"ml/train-workers-0": 4}


def test_a_watched_kind_not_synced_yet_is_listed():
    reader = PodGroupReader(client.ApiClient(), objects=_Custom({"podgroups.v1alpha2.scheduling.k8s.io": [
        PODGROUP_V1ALPHA2]}), cached={PODGROUPS_V1ALPHA2: _Watched([], synced=False)})
    assert reader.read(["ml"], (PODGROUPS_V1ALPHA2,)).scheduling_groups == {"ml/train-workers-0": 4}


def test_the_served_gang_apis_are_found_by_discovery(monkeypatch):
    class Discovery:
        def get_api_versions(self):
            def group(name, *versions):
                return client.V1APIGroup(name=name, versions=[
                    client.V1GroupVersionForDiscovery(group_version=f"{name}/{v}", version=v) for v in versions])
            return client.V1APIGroupList(groups=[group("scheduling.k8s.io", "v1", "v1alpha2"),
                                                 group("scheduling.x-k8s.io", "v1alpha1")])

    monkeypatch.setattr(client, "ApisApi", lambda api: Discovery())
    assert served_gang_apis(client.ApiClient()) == (COSCHEDULING, PODGROUPS_V1ALPHA2)


def test_a_group_object_that_cannot_be_read_leaves_its_namespaces_minimum_unknown_and_the_others_read():
    hostile = {"metadata": {"name": "evil", "namespace": "tenant"}, "spec": {"minMember": "lots"}}
    fine = {"metadata": {"name": "ok", "namespace": "ml"}, "spec": {"minMember": 3}}
    wrong_shape = {"metadata": {"name": "w", "namespace": "tenant"}, "spec": {"podGroups": "not a list"}}
    groups = reader_with({"podgroups": [hostile, fine], "workloads": [wrong_shape, WORKLOAD]}).read(["ml", "tenant"])
    assert groups.min_member == {"ml/ok": 3} and groups.unread_podgroups == frozenset({"tenant"})
    assert groups.workload_gangs == {"ml/train": {"workers": 4}} and groups.unread_workloads == frozenset({"tenant"})
