"""The CDI operator's DEVICE_PLUGIN mode at the pinned commit, as it runs: why DDS is tested with it in DRA mode only.

With `CDI_PROVIDER_TYPE=FTI_CDI`, `FTI_CDI_API_TYPE=FM` and `DEVICE_RESOURCE_TYPE=DEVICE_PLUGIN` (which requires
`FTI_CDI_CLUSTER_ID`), the fabric-manager client finds a node's machine through the Node's `machine.openshift.io/machine`
annotation and a Metal3Machine, a type the operator's scheme does not register (docs/composability.md, "Known issues":
the file:line path). Everything the operator would need is in place here — the node's Metal3 chain (Node annotation ->
Metal3Machine -> BareMetalHost with the fabric machine's uuid, harness/gpu_node_agent.py), the fabric manager, the
ClusterPolicy, RBAC — and the attach still fails before any fabric call. This test pins that: when an upstream update
makes it fail because the GPU *was* attached, run tests/e2e/test_cdi_operator.py in DEVICE_PLUGIN mode too.

A control plane of its own (as test_cdi_operator_process.py): the operator reconciles every request in its cluster."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from harness.cdi_operator import CdiOperator, DeviceResourceType, FabricManagerAccess
from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane, ensure_binaries, start_control_plane
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import DeviceMode, GpuNodeAgent

pytestmark = pytest.mark.integration

GROUP, VERSION = "cro.hpsys.ibm.ie.com", "v1alpha1"
MODEL = "A100"
CLUSTER_ID = "6d0c3c9e-3f5e-4a7b-9f1e-2b8c4d5e6f70"
UPSTREAM_ERROR = "no kind is registered for the type v1beta1.Metal3Machine"
SETTLE_TIMEOUT_S = 90.0
PORT_WAIT_S = 300.0  # another module's operator may hold the fixed webhook port for a while


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path_factory.mktemp("cdi-device-plugin-plane"), bin_dir=ensure_binaries()) as started:
        yield started



def test_device_plugin_mode_fails_every_attach_on_the_unregistered_metal3machine(plane: ControlPlane) -> None:
    with FabricManagerEmulator({MODEL: 2}) as fm, plane.api_client() as api:
        operator = CdiOperator(plane, FabricManagerAccess.of(fm, cluster_id=CLUSTER_ID),
                               device_resource_type=DeviceResourceType.DEVICE_PLUGIN).start_when_port_free(PORT_WAIT_S)
        try:
            node = f"gpu-node-{uuid.uuid4().hex[:6]}"
            key, value = KWOK_NODE_ANNOTATION
            client.CoreV1Api(api).create_node({"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": node, "annotations": {key: value}}})
            with GpuNodeAgent(api, fm, mode=DeviceMode.DEVICE_PLUGIN) as agent:
                machine = agent.add_node(node)
                custom = client.CustomObjectsApi(api)
                custom.create_cluster_custom_object(GROUP, VERSION, "composabilityrequests", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest",
                    "metadata": {"name": f"gpus-{node}"},
                    "spec": {"resource": {"type": "gpu", "model": MODEL, "size": 1, "allocation_policy": "samenode",
                                          "target_node": node}}})
                errors: list[str] = []
                deadline = time.monotonic() + SETTLE_TIMEOUT_S
                while not any(UPSTREAM_ERROR in e for e in errors):
                    assert time.monotonic() < deadline, (f"no {UPSTREAM_ERROR!r} after {SETTLE_TIMEOUT_S:.0f} s; "
                                                         f"errors seen: {errors}\n{operator.log_tail()}")
                    items = custom.list_cluster_custom_object(GROUP, VERSION, "composableresources")["items"]
                    errors = [(item.get("status") or {}).get("error", "") for item in items]
                    time.sleep(0.5)
                # The Metal3 chain the client would follow is there: only the scheme stops it.
                annotations = client.CoreV1Api(api).read_node(node).metadata.annotations or {}
                assert "machine.openshift.io/machine" in annotations
                assert not fm.attachments().get(machine), "the fabric attached a GPU: DEVICE_PLUGIN works now"
                assert not [c for c in fm.calls() if c.method in ("PATCH", "DELETE")], fm.calls()
        finally:
            operator.stop()
