"""Which pods form a gang, and its minimum, from coscheduling PodGroups and 1.35 Workloads (dds/kube/podgroups.py)."""

from __future__ import annotations

from dataclasses import replace

from kubernetes import client

from dds.kube import decode
from dds.kube.podgroups import PodGroupReader, PodGroups, gang_min_counts, min_member, namespaces_to_read, snapshot_with_groups
from dds.planner.gangs import POD_GROUP_LABEL, gang_of
from dds.planner.snapshot import PodInfo, Snapshot, WorkloadRef

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
        answer = self.answers[plural]
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
