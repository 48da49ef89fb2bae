"""The DRA devices DDS publishes for the GPUs it attaches: their driver, names, pools and attributes.

Shared by the ResourceSlice writer (dds/kube/resourceslices.py) and the planner's "what would N attaches of `model`
bring" (dds/planner/dra.py), so the two cannot disagree; plain data and pure functions, hence here in the model.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping

from dds.model.dra_records import DraDevice
from dds.model.groups import DDS_DRA_DRIVER
from dds.model.quantity import to_int

DRIVER = DDS_DRA_DRIVER  # the DRA driver name DDS publishes attached GPUs under (simulated fabric, pool mode)
DEVICE_CLASS = DDS_DRA_DRIVER  # the DeviceClass in manifests/dra/ selecting them

# Memory of the GPU models the simulated fabric and the demo use, published as the device's `memory` capacity. A model
# missing here is published without it (a selector reading it then fails with an error, as upstream does).
MODEL_MEMORY: Mapping[str, str] = MappingProxyType({"A30": "24Gi", "A40": "48Gi", "A100": "80Gi", "H100": "80Gi",
                                                    "H200": "141Gi", "L4": "24Gi", "L40S": "48Gi", "T4": "16Gi",
                                                    "V100": "32Gi"})
PRODUCT_PREFIX = "NVIDIA"
POOL_PREFIX = "fabric-"  # a pool slice's pool name: fabric-<fabric pool> (node-local pools are named by node)


def device_name(fabric_id: str) -> str:
    """A fabric device id as a DRA device name (a DNS label): "default/A30-003" -> "default-a30-003"."""
    name = re.sub(r"[^a-z0-9-]+", "-", fabric_id.lower()).strip("-")
    return name[:63].rstrip("-") or "gpu"


def gpu_device(model: str, fabric_id: str, pool: str, driver: str = DRIVER) -> DraDevice:
    """The device DDS publishes for an attached GPU: the ResourceSlice writer and the planner's "what would N attaches
    of `model` bring" both build it here, so they cannot disagree."""
    attributes = {f"{driver}/model": model, f"{driver}/productName": f"{PRODUCT_PREFIX} {model}",
                  f"{driver}/deviceID": fabric_id}
    memory = MODEL_MEMORY.get(model)
    capacity = {f"{driver}/memory": to_int(memory)} if memory else {}
    return DraDevice(name=device_name(fabric_id), driver=driver, pool=pool, attributes=attributes, capacity=capacity)


def dra_pool_name(fabric_pool: str) -> str:
    """The pool of a fabric pool's slots in pool mode (dds/planner/dra.py "pool mode")."""
    return f"{POOL_PREFIX}{fabric_pool}"
