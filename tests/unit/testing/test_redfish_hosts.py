"""The servers' side of the Redfish e2e variant (harness/redfish_hosts.py): which GPUs a host's device plugin would
publish, the CXL memory a host's kubelet would count, and servers racked while the emulator runs."""

from __future__ import annotations

import requests

from dds.model.cxl import cxl_memory_of, gpus_of
from harness.redfish_emulator import EmulatedSystem, EmulatorConfig, RedfishEmulator
from harness.redfish_hosts import composed_gpus, devices_shown


def test_only_composed_blocks_are_published():
    states = {"GPU-001": ("Composed", "n1"), "GPU-002": ("Composing", "n1"), "GPU-003": ("Failed", "n1"),
              "GPU-004": ("ComposedAndAvailable", "n2"), "GPU-005": ("Unused", None)}
    assert composed_gpus(states) == {"n1": 1, "n2": 1}


def test_a_system_registered_later_is_served_and_registered_once():
    with RedfishEmulator(EmulatorConfig(systems=[], gpus={"default": {"A30": 1}})) as emulator:
        assert emulator.add_system(EmulatedSystem(id="worker-1", name="worker-1", host_name="worker-1"))
        assert not emulator.add_system(EmulatedSystem(id="worker-1", name="worker-1", host_name="other"))
        members = requests.get(f"{emulator.url}/redfish/v1/Systems", timeout=5).json()["Members"]
        assert members.count({"@odata.id": "/redfish/v1/Systems/worker-1"}) == 1  # beside the DMTF mockup's own
        system = requests.get(f"{emulator.url}/redfish/v1/Systems/worker-1", timeout=5).json()
        assert system["HostName"] == "worker-1" and system["Links"]["ResourceBlocks"] == []


def test_a_server_shows_its_gpus_and_the_cxl_memory_bound_to_it_by_chunk_size():
    shown = devices_shown(2, [16384, 16384, 8192])
    assert shown == {"GPU": 2, "cxl-memory-16Gi": 2, "cxl-memory-8Gi": 1}
    assert (gpus_of(shown), cxl_memory_of(shown)) == (2, 40 * 2**30)  # as DDS's visibility hook counts them
    assert devices_shown(0, []) == {"GPU": 0}
