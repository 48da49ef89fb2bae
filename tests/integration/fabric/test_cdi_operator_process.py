"""The real CDI operator (CoHDI composable-resource-operator, built from the pinned source) runs in the test control
plane as shipped: its process, its readiness, its RBAC identity, its admission webhook (harness/cdi_operator.py), and a
GPU attached and detached through the fabric-manager emulator (harness/fabric_manager.py) with the node side played by
harness/gpu_node_agent.py. DRA mode: the operator's DEVICE_PLUGIN mode cannot attach at this commit (harness/
cdi_operator.py's docstring says why).

The module has a control plane of its own: the operator reconciles every ComposabilityRequest of the cluster and its
webhook (failurePolicy Fail) judges every write of one, which must not reach the session's other tests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import audit
from harness.cdi_operator import (DRA_FEATURE_GATES, DRA_RUNTIME_CONFIG, OPERATOR_BINARY, OPERATOR_NAMESPACE,
                                  SERVICE_ACCOUNT, CdiOperator, DeviceResourceType, FabricManagerAccess)
from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane, ensure_binaries, start_control_plane
from harness.fabric_manager import FabricManagerEmulator
from harness.gpu_node_agent import DeviceMode, GpuNodeAgent

GROUP, VERSION, PLURAL = "cro.hpsys.ibm.ie.com", "v1alpha1", "composabilityrequests"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
MODEL = "A100"
# Generous: an attach or detach takes a few seconds here; the bound only keeps a broken run from hanging.
SETTLE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with start_control_plane(tmp_path_factory.mktemp("cdi-operator-plane"), bin_dir=ensure_binaries(),
                             feature_gates=DRA_FEATURE_GATES, runtime_config=DRA_RUNTIME_CONFIG) as started:
        yield started


@pytest.fixture(scope="module")
def fabric_manager() -> Iterator[FabricManagerEmulator]:
    with FabricManagerEmulator({MODEL: 2}) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def operator(plane: ControlPlane, fabric_manager: FabricManagerEmulator) -> Iterator[CdiOperator]:
    with CdiOperator(plane, FabricManagerAccess.of(fabric_manager),
                     device_resource_type=DeviceResourceType.DRA) as started:
        yield started


@pytest.fixture(scope="module")
def custom(plane: ControlPlane) -> Iterator[client.CustomObjectsApi]:
    with plane.api_client() as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture(scope="module")
def node_agent(plane: ControlPlane, fabric_manager: FabricManagerEmulator) -> Iterator[GpuNodeAgent]:
    with plane.api_client() as api, GpuNodeAgent(api, fabric_manager, mode=DeviceMode.DRA) as agent:
        yield agent


@pytest.fixture
def node(plane: ControlPlane) -> Iterator[str]:
    """A kwok node of its own per test (the webhook's uniqueness is per node, type and model); in DRA mode the
    operator finds the node's fabric machine in its providerID."""
    name = f"gpu-node-{uuid.uuid4().hex[:6]}"
    key, value = KWOK_NODE_ANNOTATION
    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "annotations": {key: value}},
                          "spec": {"providerID": f"fsas-cdi://{uuid.uuid4()}"}})
        try:
            yield name
        finally:
            core.delete_node(name)


def _request(name: str, node: str, size: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComposabilityRequest", "metadata": {"name": name},
            "spec": {"resource": {"type": "gpu", "model": MODEL, "size": size, "allocation_policy": "samenode",
                                  "target_node": node}}}


def test_the_operator_runs_as_its_own_process_under_its_service_account(operator: CdiOperator,
                                                                       plane: ControlPlane) -> None:
    assert operator.pid is not None
    argv = Path(f"/proc/{operator.pid}/cmdline").read_bytes().split(b"\0")
    assert Path(argv[0].decode()).name == OPERATOR_BINARY
    assert f"--kubeconfig={operator.kubeconfig}".encode() in argv
    assert requests.get(operator.readyz_url, timeout=5).status_code == 200
    # Its requests reach the apiserver as its ServiceAccount (the audit log records ServiceAccounts only).
    logged, _ = audit.read_requests(plane.audit_log)
    assert any(r.user == OPERATOR_USER and r.resource == PLURAL for r in logged), operator.log_tail()


def test_a_killed_operator_is_gone_and_comes_back_on_restart(operator: CdiOperator) -> None:
    before = operator.pid
    operator.kill()
    assert not operator.running() and not Path(f"/proc/{before}").exists()
    operator.restart()
    assert operator.running() and operator.pid != before
    assert requests.get(operator.readyz_url, timeout=5).status_code == 200


def test_the_webhook_refuses_a_second_request_for_the_same_node_type_and_model(
        operator: CdiOperator, custom: client.CustomObjectsApi, node: str) -> None:
    first, second = f"first-{node}", f"second-{node}"
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _request(first, node, 0))
    try:
        with pytest.raises(ApiException) as refused:
            custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _request(second, node, 0))
        assert refused.value.status == 403, refused.value.body
        assert json.loads(refused.value.body)["message"] == (
            f'admission webhook "vcomposabilityrequest.kb.io" denied the request: composabilityRequest resource '
            f"{first} with type gpu and model {MODEL} already exists")
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, first)


def _settle(what: str, operator: CdiOperator, read: Callable[[], object], done: Callable[[object], bool]) -> object:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        seen = read()
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {SETTLE_TIMEOUT_S:.0f} s; last seen: {seen}\n"
                                 f"operator log:\n{operator.log_tail()}")
        time.sleep(0.2)


def test_one_gpu_is_attached_from_the_fabric_and_size_zero_detaches_it(
        operator: CdiOperator, plane: ControlPlane, custom: client.CustomObjectsApi,
        fabric_manager: FabricManagerEmulator, node_agent: GpuNodeAgent, node: str) -> None:
    machine = node_agent.add_node(node)
    name = f"gpus-{node}"
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _request(name, node, 1))
    try:
        def status() -> dict:
            return custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name).get("status") or {}

        def online(seen: object) -> bool:
            assert isinstance(seen, dict)
            return seen.get("state") == "Running" and [r.get("state") for r in
                                                       (seen.get("resources") or {}).values()] == ["Online"]

        attached = _settle("Running with one resource Online", operator, status, online)
        assert isinstance(attached, dict)
        [resource] = attached["resources"].values()
        [device] = fabric_manager.devices_of(machine)
        assert resource["device_id"] == device.serial and resource["node_name"] == node

        custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"resource": {"size": 0}}})

        def detached() -> tuple[dict, list, list]:
            resources = custom.list_cluster_custom_object(
                GROUP, VERSION, "composableresources", label_selector=f"app.kubernetes.io/managed-by={name}")
            return status(), resources["items"], fabric_manager.attachments().get(machine, [])

        def gone(seen: object) -> bool:
            assert isinstance(seen, tuple)
            request_status, resources, in_fabric = seen
            return (request_status.get("state") == "Running" and not request_status.get("resources")
                    and not resources and not in_fabric)

        _settle("the device detached from the fabric and its ComposableResource gone", operator, detached, gone)
        # The shipped RBAC (with the rules it lacks, MISSING_RBAC_RULES) covered all of it.
        refused = audit.forbidden(audit.read_requests(plane.audit_log)[0], [OPERATOR_USER])
        assert not refused, [r.describe() for r in refused]
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
