"""The node side of the fabric (harness/gpu_node_agent.py) on the real apiserver and kwok: a device the fabric-manager
emulator attaches shows on the node as a real cluster would show it (capacity, or the NVIDIA DRA driver's slice), and
nvidia-smi run in the node's driver pod through the apiserver's exec (as the CDI operator runs it) lists it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import (BMH_ANNOTATION, FM_MACHINE_ANNOTATION, GPU_RESOURCE, MACHINE_ANNOTATION,
                                    NVIDIA_DRA_DRIVER, AgentNamespaces, DeviceMode, GpuNodeAgent)
from tests.integration.nodes.harness import wait_for

THIRD_PARTY_CRDS = Path(__file__).resolve().parents[3] / "harness" / "crds"  # Metal3Machine, BareMetalHost


@pytest.fixture(scope="module")
def metal3_crds(control_plane: ControlPlane) -> None:
    control_plane.install_crds([THIRD_PARTY_CRDS])


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.api_client() as api_client:
        yield api_client


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[FabricManagerEmulator]:
    with FabricManagerEmulator({"A100": 2, "H100": 1}, state_dir=tmp_path / "fm") as emulator:
        yield emulator


@pytest.fixture
def kwok_node(api: Any) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    key, value = KWOK_NODE_ANNOTATION
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, annotations={key: value},
                                                                labels={"dds-test/node": name}),
                                   status=client.V1NodeStatus(capacity=resources, allocatable=resources)))
    yield name
    try:
        core.delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def make_agent(api: Any, fabric: FabricManagerEmulator, namespace: str, mode: DeviceMode,
               tmp_path: Path) -> GpuNodeAgent:
    namespaces = AgentNamespaces(driver=namespace, dra_plugin=namespace, metal3=namespace)
    return GpuNodeAgent(api, fabric, mode=mode, state_dir=tmp_path / "nodes", namespaces=namespaces,
                        resync_interval_s=0.5)


def ready_pod(core: client.CoreV1Api, namespace: str, name: str, not_uid: str = "") -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return pod.metadata.uid != not_uid and pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def exec_in(core: client.CoreV1Api, namespace: str, pod: str, command: list[str]) -> str:
    """An exec through the apiserver, as `kubectl exec` (and the CDI operator) does it."""
    return str(stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=command, stdout=True,
                      stderr=True, stdin=False, tty=False, _request_timeout=30))


def nvidia_smi_uuids(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    return exec_in(core, namespace, pod, ["/usr/bin/nvidia-smi", "--query-gpu=gpu_uuid", "--format=csv,noheader"])


def capacity(core: client.CoreV1Api, node: str) -> Any:
    return (core.read_node(node).status.capacity or {}).get(GPU_RESOURCE)


def test_device_plugin_node_shows_what_the_fabric_attached(api: Any, fabric: FabricManagerEmulator, kwok_node: str,
                                                            namespace: str, metal3_crds: None,
                                                            tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    with make_agent(api, fabric, namespace, DeviceMode.DEVICE_PLUGIN, tmp_path) as agent:
        machine = agent.add_node(kwok_node)

        # the Metal3 chain the CDI operator follows from the node to its machine in the fabric
        m3m_ref = core.read_node(kwok_node).metadata.annotations[MACHINE_ANNOTATION]
        m3m_namespace, m3m_name = m3m_ref.split("/")
        m3m = custom.get_namespaced_custom_object("infrastructure.cluster.x-k8s.io", "v1beta1", m3m_namespace,
                                                  "metal3machines", m3m_name)
        bmh_namespace, bmh_name = m3m["metadata"]["annotations"][BMH_ANNOTATION].split("/")
        bmh = custom.get_namespaced_custom_object("metal3.io", "v1alpha1", bmh_namespace, "baremetalhosts", bmh_name)
        assert bmh["metadata"]["annotations"][FM_MACHINE_ANNOTATION] == machine
        # the same reference names OpenShift's Machine, which the cluster-manager client follows instead
        ocp_machine = custom.get_namespaced_custom_object("machine.openshift.io", "v1beta1", m3m_namespace,
                                                          "machines", m3m_name)
        assert ocp_machine["metadata"]["annotations"][BMH_ANNOTATION] == f"{bmh_namespace}/{bmh_name}"

        driver_pod = agent.driver_pod_name(kwok_node)
        wait_for("the driver pod Running and Ready", lambda: ready_pod(core, namespace, driver_pod))
        assert capacity(core, kwok_node) == "0"
        assert nvidia_smi_uuids(core, namespace, driver_pod).strip() == "No devices were found"

        [device] = fabric.attach(machine, "A100")
        wait_for("nvidia.com/gpu capacity 1", lambda: capacity(core, kwok_node) == "1")
        assert core.read_node(kwok_node).status.allocatable[GPU_RESOURCE] == "1"
        assert nvidia_smi_uuids(core, namespace, driver_pod).split() == [device.serial]

        # a pod using the GPU shows as a process on it: what the operator's in-use check reads before a detach
        core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name="train"),
            spec=client.V1PodSpec(node_name=kwok_node, containers=[client.V1Container(
                name="main", image="registry.example/train:1",
                resources=client.V1ResourceRequirements(limits={GPU_RESOURCE: "1"}))])))
        wait_for("the training pod Running", lambda: ready_pod(core, namespace, "train"))
        apps = ["/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,process_name", "--format=csv,noheader,nounits"]
        wait_for("a process on the GPU",
                 lambda: exec_in(core, namespace, driver_pod, apps).strip() == f"{device.serial}, {namespace}/train")

        fabric.detach(machine, device.res_uuid)
        wait_for("nvidia.com/gpu capacity 0", lambda: capacity(core, kwok_node) == "0")
        assert nvidia_smi_uuids(core, namespace, driver_pod).strip() == "No devices were found"


def slice_devices(custom: client.CustomObjectsApi, name: str) -> Any:
    try:
        return custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)["spec"]
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_dra_node_publishes_the_vendor_drivers_slice(api: Any, fabric: FabricManagerEmulator, kwok_node: str,
                                                     namespace: str, metal3_crds: None, tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    with make_agent(api, fabric, namespace, DeviceMode.DRA, tmp_path) as agent:
        machine = agent.add_node(kwok_node)
        slice_name = agent.slice_name(kwok_node)
        assert slice_devices(custom, slice_name) is None
        plugin_pod = agent.dra_plugin_pod_name(kwok_node)
        assert core.read_namespaced_pod(plugin_pod, namespace).metadata.labels["app.kubernetes.io/name"] \
            == "dra-driver-nvidia-gpu"

        [first] = fabric.attach(machine, "H100")
        [second] = fabric.attach(machine, "A100")
        spec = wait_for("the slice with both GPUs",
                        lambda: (s := slice_devices(custom, slice_name)) and len(s["devices"]) == 2 and s)
        assert spec["driver"] == NVIDIA_DRA_DRIVER and spec["nodeName"] == kwok_node
        assert spec["pool"]["name"] == kwok_node and spec["pool"]["resourceSliceCount"] == 1
        by_uuid = {d["attributes"]["uuid"]["string"]: d for d in spec["devices"]}
        assert set(by_uuid) == {first.serial, second.serial}
        h100 = by_uuid[first.serial]
        assert sorted(d["name"] for d in spec["devices"]) == ["gpu-0", "gpu-1"]  # by minor, in the node's order
        assert h100["attributes"]["type"]["string"] == "gpu"
        assert h100["attributes"]["productName"]["string"] == "NVIDIA H100 80GB HBM3"
        assert h100["capacity"]["memory"]["value"] == "81559Mi"
        assert capacity(core, kwok_node) is None  # DRA: no extended resource

        # a pod whose claim kube-scheduler allocated from the slice runs on that GPU: nvidia-smi shows its process
        class_name = f"gpu-nvidia-{namespace}"
        resource = client.CustomObjectsApi(api)
        resource.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": class_name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}'"}}]}})
        try:
            resource.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "one-h100"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": class_name, "selectors": [{"cel": {
                        "expression": f"device.attributes['{NVIDIA_DRA_DRIVER}'].productName == "
                                      "'NVIDIA H100 80GB HBM3'"}}]}}]}}})
            core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer"},
                "spec": {"nodeSelector": {"dds-test/node": kwok_node},
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-h100"}],
                         "containers": [{"name": "main", "image": "registry.example/infer:1",
                                         "resources": {"claims": [{"name": "gpu"}]}}]}})
            wait_for("the inference pod Running", lambda: ready_pod(core, namespace, "infer"), timeout=90)
            driver_pod = agent.driver_pod_name(kwok_node)
            wait_for("the driver pod Running and Ready", lambda: ready_pod(core, namespace, driver_pod))
            apps = ["/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,process_name",
                    "--format=csv,noheader,nounits"]
            wait_for("a process on the H100", lambda: exec_in(core, namespace, driver_pod, apps).strip()
                     == f"{first.serial}, {namespace}/infer")
            core.delete_namespaced_pod("infer", namespace)
        finally:
            resource.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", class_name)

        # the operator restarts the kubelet plugin after a change; its DaemonSet (the agent) brings it back
        old_uid = core.read_namespaced_pod(plugin_pod, namespace).metadata.uid
        core.delete_namespaced_pod(plugin_pod, namespace)
        wait_for("the kubelet plugin pod back", lambda: ready_pod(core, namespace, plugin_pod, not_uid=old_uid))

        fabric.detach(machine, first.res_uuid)
        spec = wait_for("the slice with one GPU",
                        lambda: (s := slice_devices(custom, slice_name)) and len(s["devices"]) == 1 and s)
        assert [d["attributes"]["uuid"]["string"] for d in spec["devices"]] == [second.serial]
        assert nvidia_smi_uuids(core, namespace, driver_pod).split() == [second.serial]
        fabric.detach(machine, second.res_uuid)
        wait_for("the slice gone", lambda: slice_devices(custom, slice_name) is None)


def test_a_deleted_node_leaves_its_devices_attached_in_the_fabric(api: Any, fabric: FabricManagerEmulator,
                                                                  kwok_node: str, namespace: str, metal3_crds: None,
                                                                  tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    with make_agent(api, fabric, namespace, DeviceMode.DEVICE_PLUGIN, tmp_path) as agent:
        machine = agent.add_node(kwok_node)
        [device] = fabric.attach(machine, "A100")
        wait_for("nvidia.com/gpu capacity 1", lambda: capacity(core, kwok_node) == "1")
        core.delete_node(kwok_node)
        wait_for("the node gone", lambda: kwok_node not in {n.metadata.name for n in core.list_node().items})
        agent.sync(kwok_node)  # nothing to do on the node side, and no error
        assert fabric.attachments() == {machine: [device.serial]}


def test_a_deleted_dra_nodes_slice_goes_with_it(api: Any, fabric: FabricManagerEmulator, kwok_node: str,
                                                namespace: str, metal3_crds: None, tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    with make_agent(api, fabric, namespace, DeviceMode.DRA, tmp_path) as agent:
        machine = agent.add_node(kwok_node)
        [device] = fabric.attach(machine, "A100")
        spec = wait_for("the slice", lambda: slice_devices(custom, agent.slice_name(kwok_node)))
        assert spec["devices"][0]["attributes"]["uuid"]["string"] == device.serial
        core.delete_node(kwok_node)
        wait_for("the slice gone with its node", lambda: slice_devices(custom, agent.slice_name(kwok_node)) is None)
        assert fabric.attachments() == {machine: [device.serial]}  # the fabric never heard of it
