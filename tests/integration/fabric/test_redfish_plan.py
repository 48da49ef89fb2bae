"""`dds plan` on a live cluster whose fabric is a Redfish service sends nothing to that service, even when the
operation log (the ConfigMap `<state_configmap>-redfish`) holds a planned block that `dds serve` would compose on its
next call."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import pytest
import yaml
from kubernetes import client

from dds.cli import main
from dds.config import PoolSpec, RedfishSettings, SimulatedFabricSettings
from dds.fabric.base import AttachRequest, OperationState
from dds.fabric.factory import REDFISH_LOG_SUFFIX
from dds.fabric.redfish import RedfishFabric
from dds.fabric.state_configmap import ConfigMapFabricStateStore
from harness.redfish_emulator import SESSIONS, EmulatedSystem, EmulatorConfig, RedfishEmulator
from tests.integration.nodes.harness import NodeGroupHarness, one_node_and_a_pending_gpu_pod, unschedulable

pytestmark = pytest.mark.integration

MODEL = "A30"


def test_plan_sends_nothing_to_the_redfish_service_for_a_planned_block(control_plane: Any, namespace: str, tmp_path,
                                                                        capsys, dds_kubeconfig: Any,
                                                                        dds_api: Any) -> None:
    harness = NodeGroupHarness(control_plane, namespace, dds_api=dds_api)
    emulator: Optional[RedfishEmulator] = None
    try:
        node = one_node_and_a_pending_gpu_pod(harness, namespace)
        pool = harness.group("gpu-workers").fabric_pool
        emulator = RedfishEmulator(EmulatorConfig(systems=[EmulatedSystem("node-1", node, host_name=node)],
                                                  gpus={pool: {MODEL: 2}}, username="dds", password="secret"))
        url = emulator.start()
        state = client.CoreV1Api(control_plane.api_client())
        log_name = SimulatedFabricSettings().state_configmap + REDFISH_LOG_SUFFIX

        # DDS planned an attach and crashed before the service took it: the compose answered 500, the block is planned.
        emulator.config.faults.compose_http_errors = 1
        serve = RedfishFabric(RedfishSettings(endpoint=url, username="dds"), password="secret", clock=time.time,
                              store=ConfigMapFabricStateStore(dds_api, namespace, log_name))
        accepted = serve.attach(AttachRequest(key="planned", node=node, pool=pool, model=MODEL, count=1))
        assert accepted.state == OperationState.RUNNING
        serve.close()
        stored = state.read_namespaced_config_map(log_name, namespace)
        [op] = json.loads(next(iter(stored.data.values())))["operations"].values()
        assert [b["step"] for b in op["blocks"].values()] == ["planned"]
        sent_before = len(emulator.requests)

        password = tmp_path / "redfish-password"
        password.write_text("secret\n")
        config = tmp_path / "dds.yaml"
        config.write_text(yaml.safe_dump({
            "namespace": namespace, "machineset_namespaces": [namespace], "fabric": "redfish",
            "node_group_namespaces": {namespace: {"pools": ["*"]}},
            "redfish": {"endpoint": url, "username": "dds", "password_file": str(password)},
            "simulated_fabric": {"pools": [PoolSpec(name=pool, devices={MODEL: 2}).model_dump()]}}))
        code = main(["plan", "--kubeconfig", str(dds_kubeconfig), "--config", str(config), "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out

        during_plan = emulator.requests[sent_before:]
        assert during_plan, "plan read nothing from the service"
        changes = [(m, p) for m, p in during_plan if m != "GET" and not p.startswith(SESSIONS)]
        assert changes == [], changes  # no compose, no PATCH: only reads (and its own session's login/logout)
        assert all(state == "Unused" for state, _ in
                   (s for b, s in emulator.block_states().items() if b.startswith("GPU-")))
        after = state.read_namespaced_config_map(log_name, namespace)
        assert after.metadata.resource_version == stored.metadata.resource_version  # the log untouched
        assert unschedulable(state, namespace, "train-0")
    finally:
        if emulator is not None:
            emulator.stop()
        harness.close()
