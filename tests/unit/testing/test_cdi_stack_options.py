"""harness/cdi_stack.py's options: the stack it describes is one DDS and the CDI operator can both work with."""

from __future__ import annotations

import uuid

from dds.groups.sources import group_input_from_machineset
from dds.groups.schema import parse_group
from dds.kube.machinesets import machineset_from_object
from harness.cdi_operator import DRA_FEATURE_GATES, DRA_RUNTIME_CONFIG
from harness.cdi_stack import FSAS_CDI_PROVIDER_IDS, PRODUCT_NAME, CdiFabricSide, cdi_options, machine_uuid
from harness.gpu_node_agent import NVIDIA_DRA_DRIVER, PROVIDER_ID_PREFIX, NodeTimings
from harness.kwok_provider import node_object, node_shape
from harness.stack import StackOptions, machineset


def test_the_machineset_is_a_valid_vendor_driver_group() -> None:
    options = cdi_options(StackOptions())
    spec, errors = parse_group(group_input_from_machineset(machineset_from_object(machineset(options))))
    assert spec is not None, errors
    assert spec.gpu_api.dra and spec.dra is not None
    assert spec.dra.driver == NVIDIA_DRA_DRIVER and not spec.publishes_own_slices
    assert PRODUCT_NAME == "NVIDIA A30"


def test_the_stack_runs_dra_the_operator_needs_and_drives_it_through_requests() -> None:
    options = cdi_options(StackOptions(feature_gates={"GangScheduling": True}, dds_settings={"loop_interval_seconds": 2}))
    assert options.feature_gates == {**DRA_FEATURE_GATES, "GangScheduling": True}
    assert set(DRA_RUNTIME_CONFIG) <= set(options.runtime_config)
    assert options.controller_manager and options.fabric_side.func is CdiFabricSide
    assert options.fabric_side.keywords == {"node_timings": NodeTimings()}  # the instant node side by default
    assert options.dds_settings == {"fabric": "composability-request", "loop_interval_seconds": 2}


def test_hosts_and_their_nodes_carry_the_fabric_machine_id_the_operator_reads() -> None:
    """The kwok provider names a host (its KwokMachine's providerID, which Cluster API copies to the Machine, and its
    Node's) as the CDI operator's fabric knows the server."""
    options = cdi_options(StackOptions())
    provider_id = options.provider_ids.of("gpu-workers-bcd23")
    assert provider_id == PROVIDER_ID_PREFIX + machine_uuid("gpu-workers-bcd23")
    assert uuid.UUID(provider_id.removeprefix(PROVIDER_ID_PREFIX))  # the operator's FM path takes the uuid
    assert machine_uuid("gpu-workers-bcd23") == machine_uuid("gpu-workers-bcd23") != machine_uuid("gpu-workers-x")
    assert options.provider_ids == FSAS_CDI_PROVIDER_IDS and StackOptions().provider_ids.of("n") == "kwok://n"
    spec, _ = parse_group(group_input_from_machineset(machineset_from_object(machineset(options))))
    assert spec is not None
    node = node_object("gpu-workers-bcd23", node_shape(spec, "nvidia.com/gpu.product"), options.provider_ids)
    assert node["spec"]["providerID"] == provider_id


def test_device_plugin_mode_is_an_extended_resource_group_through_the_cluster_manager() -> None:
    from dds.model.groups import GpuApi
    from harness.cdi_stack import MODEL, CdiDevicePluginFabricSide
    from harness.gpu_node_agent import DeviceMode

    options = cdi_options(StackOptions(dds_settings={"loop_interval_seconds": 2}), device_mode=DeviceMode.DEVICE_PLUGIN)
    assert options.fabric_side.func is CdiDevicePluginFabricSide
    assert CdiDevicePluginFabricSide.device_mode is DeviceMode.DEVICE_PLUGIN
    assert CdiFabricSide.device_mode is DeviceMode.DRA
    assert options.provider_ids == FSAS_CDI_PROVIDER_IDS  # the node agent registers nodes by it in both modes
    assert not options.feature_gates and not options.controller_manager  # no DRA in this mode
    assert options.dds_settings == {"fabric": "composability-request", "loop_interval_seconds": 2}
    spec, errors = parse_group(group_input_from_machineset(machineset_from_object(machineset(options))))
    assert spec is not None, errors
    assert spec.gpu_api is GpuApi.EXTENDED_RESOURCE and spec.gpu_models == (MODEL,)
