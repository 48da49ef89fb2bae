"""The servers' side of the Redfish e2e variant (harness/redfish_hosts.py): which GPUs a host's device plugin would
publish, and servers racked while the emulator runs."""

from __future__ import annotations

import requests

from harness.redfish_emulator import EmulatedSystem, EmulatorConfig, RedfishEmulator
from harness.redfish_hosts import composed_gpus


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
