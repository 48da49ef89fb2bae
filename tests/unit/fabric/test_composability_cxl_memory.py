"""The ComposabilityRequest backend refuses CXL memory with the reason: the CDI operator's CRDs accept `cxlmemory`,
but its fabric-manager clients attach GPUs only (dds/fabric/composability.py CXL_MEMORY_REFUSAL names the lines)."""

from __future__ import annotations

import pytest

from dds.config import ComposabilitySettings, PoolSpec
from dds.fabric.base import AttachRequest, ErrorCode, FabricError
from dds.fabric.composability import ComposabilityRequestFabric


def make(settings=None, devices=None):
    return ComposabilityRequestFabric(None, settings or ComposabilitySettings(),  # type: ignore[arg-type]
                                      [PoolSpec(name="default", devices=devices or {"A30": 4})], clock=lambda: 0.0)


def test_a_pool_listing_cxl_memory_is_refused_at_start_with_the_reason():
    with pytest.raises(ValueError, match=r"pool 'default' lists cxl-memory-16Gi: the CDI operator .* attaches GPUs "
                                         r"only: its CRDs accept cxlmemory"):
        make(devices={"A30": 4, "cxl-memory-16Gi": 8})


def test_a_cxlmemory_resource_type_is_refused_at_start_with_the_reason():
    with pytest.raises(ValueError, match=r"composability.resource_type 'cxlmemory': the CDI operator"):
        make(ComposabilitySettings(resource_type="cxlmemory"))


def test_a_memory_attach_is_refused_before_anything_is_written():
    with pytest.raises(FabricError) as refused:
        make().attach(AttachRequest(key="m", node="n1", pool="default", model="cxl-memory-16Gi", count=1))
    assert refused.value.code is ErrorCode.INVALID
    assert "cxl-memory-16Gi: the CDI operator (composable-resource-operator 38251b7) attaches GPUs only" in str(
        refused.value)
