"""CXL memory as fabric devices: a pool's memory is chunks, each a device whose model names its size.

`cxl-memory-16Gi` is one 16 GiB chunk of a CXL Type 3 device's memory, attachable to one host (DMTF models it as a
`MemoryChunks` resource of a `MemoryDomain`, bound to a host by a Connection). Naming the size in the model keeps every
fabric operation (attach N of a model, detach by id, pools counting free devices per model) as it is for GPUs, and lets
a node's memory be computed from its devices alone. A node group attaches chunks of its `cxl-memory-chunk` size
(`cxl_model`); everything that counts GPUs skips these models (`is_cxl_model`).
"""

from __future__ import annotations

from typing import Mapping, Optional

from dds.model.quantity import QuantityError, human_amount, to_int

CXL_MODEL_PREFIX = "cxl-memory-"
_UNITS = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def cxl_model(chunk_bytes: int) -> str:
    """The device model of one chunk of `chunk_bytes` bytes: `cxl-memory-16Gi` (the largest whole binary unit)."""
    if chunk_bytes <= 0:
        raise ValueError(f"a CXL memory chunk has a positive size, not {chunk_bytes}")
    for unit, size in _UNITS:
        if chunk_bytes % size == 0:
            return f"{CXL_MODEL_PREFIX}{chunk_bytes // size}{unit}"
    return f"{CXL_MODEL_PREFIX}{chunk_bytes}"


def is_cxl_model(model: str) -> bool:
    return model.startswith(CXL_MODEL_PREFIX)


def chunk_bytes(model: str) -> Optional[int]:
    """The size of one chunk of `model` in bytes; None for a model that is not CXL memory or whose size does not read
    as a positive memory quantity."""
    if not is_cxl_model(model):
        return None
    try:
        size = to_int(model[len(CXL_MODEL_PREFIX):])
    except (QuantityError, ValueError):
        return None
    return size if size > 0 else None


def cxl_memory_of(devices_by_model: Mapping[str, int]) -> int:
    """Bytes of CXL memory in a count of devices by model (a node's online devices, a pool's free ones)."""
    return sum(count * (chunk_bytes(model) or 0) for model, count in devices_by_model.items() if is_cxl_model(model))


def gpus_of(devices_by_model: Mapping[str, int]) -> int:
    """The GPUs in a count of devices by model: every model but CXL memory."""
    return sum(count for model, count in devices_by_model.items() if not is_cxl_model(model))


def memory_text(amount: int) -> str:
    """Bytes of memory as people read them: 16 GiB."""
    return human_amount("memory", amount)


def chunks_text(chunks: int, chunk_bytes: int) -> str:
    """`2 CXL memory chunks of 16 GiB (32 GiB)`: how plans, Events and logs name an amount of CXL memory."""
    noun = "chunk" if chunks == 1 else "chunks"
    return f"{chunks} CXL memory {noun} of {memory_text(chunk_bytes)} ({memory_text(chunks * chunk_bytes)})"
