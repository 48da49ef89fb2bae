"""A node group declaring attachable CXL memory: parsed from the same annotations, refused with a clear error when
malformed, and advertised at its maximum on the spec-fixed template CA simulates with."""

from __future__ import annotations

import pytest

from dds.groups.schema import GroupInput, parse_group
from dds.model.groups import SourceRef
from dds.provider.gen.k8s import core_v1_pb2
from dds.provider.template import template_node_bytes

from .conftest import annotations

MAX_MEM = "dds.cdi.dev/max-cxl-memory-per-node"
CHUNK = "dds.cdi.dev/cxl-memory-chunk"
GIB = 2**30


def parse(overrides):
    return parse_group(GroupInput(id="MachineSet/default/gpu-workers", annotations=annotations(overrides), replicas=1,
                                  source=SourceRef(kind="MachineSet", name="gpu-workers", namespace="default")))


def test_a_group_declares_cxl_memory_next_to_its_gpu_slots():
    spec, errors = parse({MAX_MEM: "128Gi", CHUNK: "16Gi"})
    assert errors == ()
    assert (spec.max_cxl_memory, spec.cxl_memory_chunk, spec.max_cxl_chunks) == (128 * GIB, 16 * GIB, 8)
    assert spec.max_gpus_per_node == 4
    assert spec.node_allocatable(1, 2).memory == (64 + 32) * GIB


def test_a_group_without_the_keys_takes_no_cxl_memory():
    spec, errors = parse({})
    assert errors == () and (spec.max_cxl_memory, spec.max_cxl_chunks) == (0, 0)
    assert spec.template_allocatable().memory == 64 * GIB


@pytest.mark.parametrize("overrides, key, fragment", [
    pytest.param({MAX_MEM: "lots", CHUNK: "16Gi"}, MAX_MEM, "'lots' is not a memory quantity such as 256Gi",
                 id="bad-max"),
    pytest.param({MAX_MEM: "128Gi", CHUNK: "0"}, CHUNK, "'0' is not a positive memory quantity", id="zero-chunk"),
    pytest.param({MAX_MEM: "128Gi"}, CHUNK, "missing; dds.cdi.dev/max-cxl-memory-per-node needs the size",
                 id="max-without-chunk"),
    pytest.param({CHUNK: "16Gi"}, CHUNK, "a chunk size attaches nothing without dds.cdi.dev/max-cxl-memory-per-node",
                 id="chunk-without-max"),
    pytest.param({MAX_MEM: "100Gi", CHUNK: "16Gi"}, MAX_MEM, "'100Gi' is not a whole number of '16Gi' chunks",
                 id="max-not-whole-chunks"),
    pytest.param({"dds.cdi.dev/max-cxl-memory": "128Gi"}, "dds.cdi.dev/max-cxl-memory",
                 "did you mean dds.cdi.dev/max-cxl-memory-per-node?", id="typo"),
])
def test_malformed_cxl_memory_is_refused_naming_the_key(overrides, key, fragment):
    spec, errors = parse(overrides)
    assert spec is None
    assert [(e.key, fragment in e.message) for e in errors] == [(key, True)], [e.describe() for e in errors]


def test_the_spec_fixed_template_advertises_max_memory_as_well_as_max_gpus():
    spec, _ = parse({MAX_MEM: "128Gi", CHUNK: "16Gi"})
    node = core_v1_pb2.Node.FromString(template_node_bytes(spec, "nvidia.com/gpu.product"))
    assert node.status.allocatable["memory"].string == str((64 + 128) * GIB)
    assert node.status.capacity["memory"].string == str((64 + 128) * GIB)
    assert node.status.allocatable["nvidia.com/gpu"].string == "4"
