"""The ValidatingAdmissionPolicies DDS ships (manifests/dds/admission.yaml, manifests/rbac/reservations) on the real
apiserver, acting with DDS's ServiceAccount token (harness/rbac.py installs them with its RBAC): the writes DDS makes
pass, and what its RBAC grants but DDS never does — another node label or taint key, a cordon, a pod's image, another
toleration, a ResourceSlice of another driver, any change but the leader's label to a Pod of its own namespace — is
refused by the apiserver, naming the policy.

Each refused request is declared with `expect_refusal` (harness/rbac_plugin.py): the 403 is what these tests assert,
not a grant DDS lacks.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client

from dds.kube.composability import NODE_FINALIZER
from dds.kube.leader_label import LEADER_LABEL, LEADER_VALUE, LeaderPodLabel
from dds.kube.nodes import add_taint, label_node, remove_taint
from dds.kube.pods import add_toleration
from dds.model.groups import DDS_DRA_DRIVER, LABEL_ATTACHED_GPU
from dds.model.snapshot import Toleration
from dds.planner.reservations import RESERVATION_EFFECT, RESERVATION_TAINT_KEY

pytestmark = pytest.mark.integration

# The apiserver loads a new policy through an informer: a bound on how long that takes on a loaded machine.
POLICY_ACTIVE_TIMEOUT_S = 60.0
ADMIN_TAINT = "example.com/maintenance"
VENDOR_DRIVER = "gpu.nvidia.com"
DDS_NAMESPACE = "dds-system"  # where manifests/ install DDS (harness/rbac.py DDS)


def refused(call: Callable[[], Any], *policies: str) -> str:
    """Run a write DDS's token must not be allowed to make; return the apiserver's message (a 403 naming one of
    `policies`: where two policies deny the same write, the apiserver names whichever it evaluated first)."""
    with pytest.raises(client.ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    assert any(policy in caught.value.body for policy in policies), caught.value.body
    return caught.value.body


@pytest.fixture
def admin(control_plane: Any) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.api_client())


@pytest.fixture
def node(admin: client.CoreV1Api, namespace: str) -> Iterator[str]:
    """A Node (nothing else writes it) with an administrator's label and taint, named after the test's namespace."""
    name = f"{namespace}-node"
    admin.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                       "spec": {"taints": [{"key": ADMIN_TAINT, "effect": "NoSchedule"}]}})
    yield name
    admin.patch_node(name, {"metadata": {"finalizers": None}})
    admin.delete_node(name)


def wait_until_refused(write: Callable[[], Any], undo: Callable[[], Any]) -> None:
    """Retry `write` until the apiserver refuses it (the policies' informer has synced), undoing any success."""
    deadline = time.monotonic() + POLICY_ACTIVE_TIMEOUT_S
    while True:
        try:
            write()
        except client.ApiException as exc:
            if exc.status == 403:
                return
            raise
        undo()
        assert time.monotonic() < deadline, "the admission policies never took effect"
        time.sleep(0.2)


@pytest.fixture
def active(dds_kubeconfig: Any, admin: client.CoreV1Api, dds_api: client.ApiClient, node: str,
           expect_refusal: Callable[[str, str], None]) -> None:
    """The shipped policies loaded (installed with DDS's RBAC): a probe write they refuse is refused. A policy whose
    expression does not compile fails closed (failurePolicy: Fail), so the allowed writes below would be refused."""
    expect_refusal("nodes", node)
    core = client.CoreV1Api(dds_api)
    wait_until_refused(lambda: core.patch_node(node, {"metadata": {"labels": {"probe": "x"}}}),
                       lambda: admin.patch_node(node, {"metadata": {"labels": {"probe": None}}}))


def labels(admin: client.CoreV1Api, node: str) -> dict[str, str]:
    return admin.read_node(node).metadata.labels or {}


def taint_keys(admin: client.CoreV1Api, node: str) -> set[str]:
    return {t.key for t in admin.read_node(node).spec.taints or ()}


# --- Nodes: DDS's own label, taint and finalizer keys only ---

def test_dds_writes_its_own_node_labels_taints_and_finalizer(active: None, dds_api: client.ApiClient,
                                                             admin: client.CoreV1Api, node: str) -> None:
    label_node(dds_api, node, {LABEL_ATTACHED_GPU: "A30"})
    add_taint(dds_api, node, "dds.cdi.dev/removing", "true", "NoSchedule")
    core = client.CoreV1Api(dds_api)
    core.patch_node(node, {"metadata": {"finalizers": [NODE_FINALIZER]}})
    assert labels(admin, node)[LABEL_ATTACHED_GPU] == "A30"
    assert taint_keys(admin, node) == {ADMIN_TAINT, "dds.cdi.dev/removing"}
    remove_taint(dds_api, node, "dds.cdi.dev/removing")
    core.patch_node(node, {"metadata": {"finalizers": None}})
    label_node(dds_api, node, {LABEL_ATTACHED_GPU: "A100"})
    assert taint_keys(admin, node) == {ADMIN_TAINT}
    assert admin.read_node(node).metadata.finalizers is None
    assert labels(admin, node)["team"] == "ml"


def test_dds_lifts_cluster_autoscalers_taint_and_cordon(active: None, dds_api: client.ApiClient,
                                                        admin: client.CoreV1Api, node: str) -> None:
    current = admin.read_node(node)
    current.spec.taints = [*current.spec.taints, client.V1Taint(key="ToBeDeletedByClusterAutoscaler",
                                                                value="1700000000", effect="NoSchedule")]
    current.spec.unschedulable = True
    admin.replace_node(node, current)
    remove_taint(dds_api, node, "ToBeDeletedByClusterAutoscaler", uncordon_if_cordoned_with_it=True)
    assert taint_keys(admin, node) == {ADMIN_TAINT}


def test_another_label_key_is_refused(active: None, dds_api: client.ApiClient, admin: client.CoreV1Api,
                                      node: str) -> None:
    core = client.CoreV1Api(dds_api)
    refused(lambda: label_node(dds_api, node, {"example.com/gpu": "yes"}), "dds-node-writes")
    refused(lambda: core.patch_node(node, {"metadata": {"labels": {"team": "web"}}}), "dds-node-writes")
    refused(lambda: core.patch_node(node, {"metadata": {"labels": {"team": None}}}), "dds-node-writes")
    refused(lambda: core.patch_node(node, {"metadata": {"annotations": {"example.com/owner": "dds"}}}),
            "dds-node-writes")
    assert labels(admin, node) == {"team": "ml"}


def test_another_taint_a_removed_administrators_taint_and_a_cordon_are_refused(
        active: None, dds_api: client.ApiClient, admin: client.CoreV1Api, node: str) -> None:
    core = client.CoreV1Api(dds_api)
    refused(lambda: add_taint(dds_api, node, "example.com/other", "x", "NoSchedule"), "dds-node-writes")
    refused(lambda: remove_taint(dds_api, node, ADMIN_TAINT), "dds-node-writes")
    refused(lambda: core.patch_node(node, {"spec": {"unschedulable": True}}), "dds-node-writes")
    refused(lambda: core.patch_node(node, {"metadata": {"finalizers": ["example.com/keep"]}}), "dds-node-writes")
    assert taint_keys(admin, node) == {ADMIN_TAINT}
    assert not admin.read_node(node).spec.unschedulable


# --- Pods (reservations): adding the reservation's toleration only ---

@pytest.fixture
def pod(active: None, admin: client.CoreV1Api, namespace: str, expect_refusal: Callable[[str, str], None]) -> str:
    name = f"train-{uuid.uuid4().hex[:6]}"
    # A scheduler nobody runs: no other writer touches the pod (DDS's write carries the resourceVersion it read).
    admin.create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": {"app": "train"}}, "spec": {
        "schedulerName": "nobody", "containers": [{"name": "main", "image": "registry.example/train:1"}],
        "tolerations": [{"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"}]}})
    expect_refusal("pods", name)
    return name


def test_dds_adds_the_reservations_toleration_to_a_pod(dds_api: client.ApiClient, admin: client.CoreV1Api,
                                                       namespace: str, pod: str) -> None:
    toleration = Toleration(key=RESERVATION_TAINT_KEY, operator="Equal", value="r-1", effect=RESERVATION_EFFECT)
    assert add_toleration(dds_api, namespace, pod, toleration)
    keys = [t.key for t in admin.read_namespaced_pod(pod, namespace).spec.tolerations]
    assert RESERVATION_TAINT_KEY in keys and "example.com/spot" in keys


def test_a_pod_image_change_another_toleration_or_a_label_is_refused(dds_api: client.ApiClient,
                                                                     admin: client.CoreV1Api, namespace: str,
                                                                     pod: str) -> None:
    core = client.CoreV1Api(dds_api)
    tolerations = admin.read_namespaced_pod(pod, namespace).spec.tolerations  # with the apiserver's default ones
    refused(lambda: core.patch_namespaced_pod(pod, namespace, {"spec": {"containers": [
        {"name": "main", "image": "attacker.example/miner:1"}]}}), "dds-pod-writes")
    other = Toleration(key="example.com/dedicated", operator="Exists", value="", effect="NoSchedule")
    refused(lambda: add_toleration(dds_api, namespace, pod, other), "dds-pod-writes")
    refused(lambda: core.patch_namespaced_pod(pod, namespace, {"metadata": {"labels": {"app": "other"}}}),
            "dds-pod-writes")
    current = admin.read_namespaced_pod(pod, namespace)
    assert current.spec.containers[0].image == "registry.example/train:1"
    assert current.spec.tolerations == tolerations
    assert current.metadata.labels == {"app": "train"}


# --- ResourceSlices: DDS's own driver only ---

def slice_body(name: str, driver: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


def test_dds_writes_its_own_drivers_slices_and_no_other(active: None, control_plane: Any,
                                                        dds_api: client.ApiClient, node: str,
                                                        expect_refusal: Callable[[str, str], None]) -> None:
    objects = client.CustomObjectsApi(dds_api)
    admin = client.CustomObjectsApi(control_plane.api_client())
    own, vendor = f"{node}-dds", f"{node}-vendor"
    expect_refusal("resourceslices", vendor)
    objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                         slice_body(own, DDS_DRA_DRIVER, node))
    grown = objects.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", own)
    grown["spec"]["devices"].append({"name": "gpu-1"})
    objects.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", own, grown)  # DDS's `update`
    refused(lambda: objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                         slice_body(vendor, VENDOR_DRIVER, node)),
            "dds-resourceslice-writes")
    # A vendor's slice (its driver publishes it): DDS's token may neither change nor delete it.
    published = admin.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                   slice_body(vendor, VENDOR_DRIVER, node))
    try:
        emptied = {**published, "spec": {**published["spec"], "devices": [{"name": "fake"}]}}
        refused(lambda: objects.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", vendor,
                                                              emptied), "dds-resourceslice-writes")
        refused(lambda: objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", vendor),
                "dds-resourceslice-writes")
    finally:
        admin.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", vendor)
    objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", own)



# --- Pods of DDS's own namespace: the leader's label only (dds-own-pod-writes) ---

@pytest.fixture
def own_pod(admin: client.CoreV1Api, namespace: str) -> Iterator[str]:
    """A Pod in DDS's namespace (dds-system), as a DDS replica's Pod is, with an administrator's label."""
    name = f"{namespace}-dds"
    admin.create_namespaced_pod(DDS_NAMESPACE, {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dds"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "dds", "image": "example.com/dds:1"}]}})
    yield name
    admin.delete_namespaced_pod(name, DDS_NAMESPACE, grace_period_seconds=0)


def pod_labels(admin: client.CoreV1Api, name: str) -> dict[str, str]:
    return admin.read_namespaced_pod(name, DDS_NAMESPACE).metadata.labels or {}


def test_dds_sets_and_clears_the_leader_label_on_a_pod_of_its_namespace(active: None, dds_api: client.ApiClient,
                                                                        admin: client.CoreV1Api, own_pod: str) -> None:
    label = LeaderPodLabel(dds_api, DDS_NAMESPACE, own_pod, request_timeout=10.0)
    assert label.mark(True)
    assert pod_labels(admin, own_pod) == {"app.kubernetes.io/name": "dds", LEADER_LABEL: LEADER_VALUE}
    assert label.mark(False)
    assert pod_labels(admin, own_pod) == {"app.kubernetes.io/name": "dds"}


def test_dds_changes_nothing_else_of_a_pod_of_its_namespace(active: None, dds_api: client.ApiClient,
                                                            admin: client.CoreV1Api, own_pod: str,
                                                            expect_refusal: Callable[[str, str], None]) -> None:
    expect_refusal("pods", own_pod)
    core = client.CoreV1Api(dds_api)

    def patch(body: dict[str, Any]) -> Callable[[], Any]:
        return lambda: core.patch_namespaced_pod(own_pod, DDS_NAMESPACE, body)

    policy = "dds-own-pod-writes"
    # A pod's labels, annotations and containers are also every pod's, which the reservations feature's policy guards
    # too: either may be the one the apiserver names, each with its own reason.
    both = (policy, "dds-pod-writes")
    metadata_policies = both
    metadata_reasons = ("may only set the label dds.cdi.dev/leader=true", "DDS never changes a pod's labels")
    image_reasons = ("changes nothing of a Pod in its own namespace", "DDS never changes a pod's images")
    wait_until_refused(patch({"metadata": {"labels": {"app.kubernetes.io/name": "other"}}}),
                       lambda: admin.patch_namespaced_pod(own_pod, DDS_NAMESPACE,
                                                          {"metadata": {"labels": {"app.kubernetes.io/name": "dds"}}}))
    removal = refused(patch({"metadata": {"labels": {"app.kubernetes.io/name": None}}}), *metadata_policies)
    assert any(reason in removal for reason in metadata_reasons), removal
    refused(patch({"metadata": {"labels": {LEADER_LABEL: "false"}}}), *metadata_policies)
    image = refused(patch({"spec": {"containers": [{"name": "dds", "image": "example.com/not-dds:1"}]}}), *both)
    assert any(reason in image for reason in image_reasons), image
    refused(patch({"metadata": {"annotations": {"example.com/x": "y"}}}), *metadata_policies)
    assert pod_labels(admin, own_pod) == {"app.kubernetes.io/name": "dds"}
    assert admin.read_namespaced_pod(own_pod, DDS_NAMESPACE).spec.containers[0].image == "example.com/dds:1"
