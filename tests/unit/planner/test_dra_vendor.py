"""DRA with a GPU vendor's driver (NVIDIA's gpu.nvidia.com): a group says which driver its GPUs come under and where a
device shows the model and the memory; claims selecting the vendor's devices are planned GPU by GPU against devices
in the vendor's shape, learnt from the vendor's slices in the cluster or described by the group, never guessed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dds.model.groups import (ANN_DRA_DEVICE_ATTRIBUTES, ANN_DRA_DRIVER, ANN_DRA_MODEL_ATTRIBUTE, ANN_DRA_MODELS,
                              ANN_GPU_API, DRA_GPU_RESOURCE, DraDriverConfig, DraModelDescription,
                              NodeGroupSpec, dra_gpu_resource)
from dds.planner import plan_scale_down, plan_scale_up
from dds.planner.dra import lower_claims, lower_observed
from dds.model.dra_records import (AllocatedDeviceInfo, DeviceClassInfo, DeviceRequestInfo, DraDevice, DraState,
                                   ResourceClaimInfo, ResourceSliceInfo)
from dds.model.plan import Verdict
from dds.planner.refusals import NO_MATCHING_DEVICE
from tests.unit.planner.builders import make_pod, make_pool, make_snapshot
from tests.unit.planner.test_dra import (CLASS, GREEDY, claim, decision, dra_group, dra_node, dra_pod, model_is,
                                         request)
from tests.unit.planner.test_dra_groups import parse

NVIDIA = "gpu.nvidia.com"
# NVIDIA's DeviceClass (k8s-dra-driver-gpu, templates/deviceclass-gpu.yaml): whole GPUs of its driver.
NVIDIA_CLASS = DeviceClassInfo(NVIDIA, (f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'",))
A100_NAME = "NVIDIA A100-SXM4-80GB"
A30_NAME = "NVIDIA A30"
VENDOR = DraDriverConfig(driver=NVIDIA, device_attributes={"type": "gpu"})


def product_is(name: str) -> str:
    return f"device.attributes['{NVIDIA}'].productName == '{name}'"


def nvidia_request(*selectors: str, count: int = 1) -> DeviceRequestInfo:
    return request("gpu", *selectors, count=count, device_class=NVIDIA)


def nvidia_gpu(index: int, uuid: str, product: str = A100_NAME, memory_gib: int = 80, kind: str = "gpu") -> DraDevice:
    """A device as NVIDIA's kubelet plugin publishes a whole GPU (cmd/gpu-kubelet-plugin/deviceinfo.go)."""
    attributes = {"type": kind, "uuid": uuid, "productName": product, "brand": "Nvidia", "architecture": "Ampere",
                  "driverVersion": "550.54.15", "index": index, "minor": index}
    return DraDevice(name=f"gpu-{index}", driver=NVIDIA, pool="", attributes={f"{NVIDIA}/{k}": v
                                                                              for k, v in attributes.items()},
                     capacity={f"{NVIDIA}/memory": memory_gib * 2**30})


def nvidia_slice(node: str, *devices: DraDevice) -> ResourceSliceInfo:
    return ResourceSliceInfo(name=f"{node}-{NVIDIA}-x1", driver=NVIDIA, pool=node, pool_generation=1, node_name=node,
                             devices=tuple(replace(d, pool=node) for d in devices))


def vendor_group(id: str = "gpu", config: DraDriverConfig = VENDOR, **kwargs) -> NodeGroupSpec:
    spec = dra_group(id, **kwargs).model_dump(exclude={"gpu_resource", "dra"})
    return NodeGroupSpec.model_validate({**spec, "dra": config})


def vendor_node(name: str, gpus: int = 0, model: str = "A100", group: str = "gpu"):
    return replace(dra_node(name, gpus=gpus, model=model, group=group), gpu_resource=dra_gpu_resource(NVIDIA))


def vendor_snapshot(pods, claims=(), slices=None, nodes=None, groups=None, pools=None):
    nodes = nodes if nodes is not None else [vendor_node("w1", gpus=1), vendor_node("w2")]
    snapshot = make_snapshot(nodes, pods, groups=groups or [vendor_group(models=())],
                             pools=pools or [make_pool(A30=4, A100=2)])
    # w1's A100 (fabric device w1-gpu-0, the GPU UUID the operator gave it) as NVIDIA's driver publishes it.
    slices = slices if slices is not None else [nvidia_slice("w1", nvidia_gpu(0, "w1-gpu-0"))]
    return replace(snapshot, dra=DraState(claims=tuple(claims), slices=tuple(slices), classes=(NVIDIA_CLASS, CLASS)))


def on_w1(name: str) -> ResourceClaimInfo:
    return claim(name, allocated=(AllocatedDeviceInfo("gpu", NVIDIA, "w1", "gpu-0"),))


# --- the group's annotations ----------------------------------------------------------------------------------------

def test_a_vendor_driver_group_is_parsed_with_nvidias_names_by_default() -> None:
    spec, errors = parse(**{ANN_GPU_API: "dra-node-local", ANN_DRA_DRIVER: NVIDIA,
                            ANN_DRA_MODELS: f"A100={A100_NAME}:80Gi, A30={A30_NAME}",
                            ANN_DRA_DEVICE_ATTRIBUTES: "type=gpu"})
    assert errors == ()
    assert (spec.dra.driver, spec.dra.device_class, spec.dra.model_attribute, spec.dra.memory_capacity,
            spec.dra.device_id_attribute) == (NVIDIA, NVIDIA, "productName", "memory", "uuid")
    assert spec.dra.models == {"A100": DraModelDescription(value=A100_NAME, memory=80 * 2**30),
                               "A30": DraModelDescription(value=A30_NAME)}
    assert spec.gpu_resource == dra_gpu_resource(NVIDIA) == f"dra.dds.cdi.dev/{NVIDIA}"
    assert not spec.publishes_own_slices  # the vendor's driver writes the node's slice, DDS only reads it


def test_dds_own_driver_stays_the_default() -> None:
    spec, errors = parse(**{ANN_GPU_API: "dra-node-local"})
    assert errors == () and spec.dra == DraDriverConfig() and spec.dra.own
    assert (spec.gpu_resource, spec.dra.model_attribute, spec.publishes_own_slices) == (DRA_GPU_RESOURCE, "model",
                                                                                      True)


@pytest.mark.parametrize("annotations, key, words", [
    pytest.param({ANN_DRA_DRIVER: NVIDIA}, ANN_DRA_DRIVER, "node capacity, not DRA devices", id="extended-resource"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_DRA_DRIVER: "Gpu_Nvidia"}, ANN_DRA_DRIVER, "DNS subdomain",
                 id="driver-name"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_DRA_MODEL_ATTRIBUTE: "productName"}, ANN_DRA_MODEL_ATTRIBUTE,
                 "own driver gpu.dds.cdi.dev in one shape", id="shape-of-dds-own-driver"),
    pytest.param({ANN_GPU_API: "dra-pool", ANN_DRA_DRIVER: NVIDIA, "capacity.cluster-autoscaler.kubernetes.io/"
                  "gpu-count": "0"}, ANN_DRA_DRIVER, "slots DDS publishes under its own driver", id="pool-mode"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_DRA_DRIVER: NVIDIA, ANN_DRA_MODELS: "A100"}, ANN_DRA_MODELS,
                 "MODEL=VALUE[:MEMORY]", id="models-entry"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_DRA_DRIVER: NVIDIA, ANN_DRA_MODELS: "A100=x:lots"},
                 ANN_DRA_MODELS, "'A100=x:lots'", id="models-memory"),
    pytest.param({ANN_GPU_API: "dra-node-local", ANN_DRA_DRIVER: NVIDIA, ANN_DRA_MODEL_ATTRIBUTE: "product name"},
                 ANN_DRA_MODEL_ATTRIBUTE, "C identifier", id="attribute-name"),
])
def test_a_malformed_dra_driver_setting_is_a_group_configuration_error(annotations, key, words) -> None:
    spec, errors = parse(**annotations)
    assert spec is None
    assert [e.key for e in errors] == [key] and words in errors[0].message


# --- claims planned against the vendor's devices --------------------------------------------------------------------

def test_a_claim_by_product_name_is_planned_onto_the_vendor_group_with_one_attach() -> None:
    # w1's only GPU, learnt from its slice as an A100 (its uuid is the fabric device's id), is held by a running pod.
    snapshot = vendor_snapshot([dra_pod("busy", "b", node="w1"), dra_pod("train", "c")],
                               [on_w1("b"), claim("c", nvidia_request(product_is(A100_NAME)))])
    lowered = lower_claims(snapshot)
    train = next(p for p in lowered.pods if p.name == "train")
    assert train.dra_refusal is None
    plan = plan_scale_up(lowered, GREEDY)
    assert decision(plan, "train").verdict == Verdict.FITS_AFTER_GPUS and decision(plan, "train").gpus_added == 1
    assert [(a.model, a.count) for a in plan.attaches] == [("A100", 1)]


def test_a_model_no_device_describes_is_refused_saying_so() -> None:
    # The pool holds A30s, but no NVIDIA device in the cluster shows one and the group maps none: DDS does not guess
    # what NVIDIA's driver would call it.
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(product_is(A30_NAME)))])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    train = decision(plan, "train")
    assert plan.attaches == () and plan.new_nodes == () and train.refusal == NO_MATCHING_DEVICE
    assert (f"DDS cannot describe A30 as a {NVIDIA} device: no {NVIDIA} device in the cluster has the uuid of a "
            f"fabric A30, and dds.cdi.dev/dra-models has no entry for A30") in train.reason
    assert (f"request selector `{product_is(A30_NAME)}` is false for an attachable A100 as a {NVIDIA} device"
            in train.reason)


def test_the_groups_mapping_describes_a_model_no_device_shows_yet() -> None:
    config = replace_config(models={"A30": DraModelDescription(value=A30_NAME, memory=24 * 2**30)})
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(product_is(A30_NAME)))],
                               groups=[vendor_group(config=config, models=())], nodes=[vendor_node("w2")])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w2", "A30", 1)]


def test_a_published_device_of_the_mapped_name_teaches_the_shape_without_a_fabric_id() -> None:
    # An A30 on a node DDS does not manage (no fabric id): its productName is what the mapping names A30, so its
    # capacity is learnt; the mapping's own memory (wrong here on purpose) is not used.
    config = replace_config(models={"A30": DraModelDescription(value=A30_NAME, memory=1)})
    slices = [nvidia_slice("other", nvidia_gpu(0, "GPU-aaaa", product=A30_NAME, memory_gib=24))]
    memory = f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('20Gi')) >= 0"
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(memory))], slices=slices,
                               groups=[vendor_group(config=config, models=())], nodes=[vendor_node("w2")],
                               pools=[make_pool(A30=2)])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert [(a.model, a.count) for a in plan.attaches] == [("A30", 1)]


def test_memory_capacity_selectors_pick_the_models_with_enough_memory() -> None:
    config = replace_config(models={"A30": DraModelDescription(value=A30_NAME, memory=24 * 2**30)})
    memory = f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('40Gi')) >= 0"
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(memory, count=2))],
                               groups=[vendor_group(config=config, models=())])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    # The A100's 80Gi learnt from w1's slice: w1's free A100 and one more attached beside it.
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w1", "A100", 1)]
    small = replace(snapshot, dra=replace(snapshot.dra, claims=(claim("c", nvidia_request(
        f"device.capacity['{NVIDIA}'].memory.isLessThan(quantity('40Gi'))")),)))
    assert [(a.node, a.model, a.count) for a in plan_scale_up(lower_claims(small), GREEDY).attaches] == [
        ("w2", "A30", 1)]


def test_a_mig_device_does_not_teach_a_whole_gpus_shape() -> None:
    # NVIDIA lists MIG devices with the parent's productName; with type=gpu required, only whole GPUs count.
    mig = replace(nvidia_gpu(1, "MIG-1", product=A30_NAME, memory_gib=6, kind="mig"), name="gpu-0-mig-1")
    config = replace_config(models={"A30": DraModelDescription(value=A30_NAME)})
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(
        f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('20Gi')) >= 0"))],
        slices=[nvidia_slice("other", mig)], groups=[vendor_group(config=config, models=())],
        nodes=[vendor_node("w2")], pools=[make_pool(A30=2)])
    train = decision(plan_scale_up(lower_claims(snapshot), GREEDY), "train")
    # The described A30 has no memory (the mapping gives none): the selector fails with an error, never a fit.
    assert train.refusal == NO_MATCHING_DEVICE and "fails with" in train.reason


def test_the_vendors_published_gpus_are_the_nodes_and_allocated_ones_kept() -> None:
    # The fabric reports w1's A100, NVIDIA's driver lists it plus a GPU the fabric does not know (built in): both are
    # w1's GPUs, the allocated one is in use and never detached.
    slices = [nvidia_slice("w1", nvidia_gpu(0, "w1-gpu-0"), nvidia_gpu(1, "GPU-builtin"))]
    snapshot = vendor_snapshot([dra_pod("busy", "b", node="w1")], [on_w1("b")], slices=slices,
                               nodes=[replace(vendor_node("w1", gpus=1), gpus_idle_since=0.0)])
    lowered = lower_claims(snapshot)
    (w1,) = lowered.nodes
    assert w1.allocatable.get(dra_gpu_resource(NVIDIA)) == 2
    assert [d.in_claim for d in w1.devices] == [True]
    assert plan_scale_down(lowered, GREEDY).detaches == ()
    busy = next(p for p in lowered.pods if p.name == "busy")
    assert busy.containers[-1].requests.get(dra_gpu_resource(NVIDIA)) == 1


def test_a_fabric_naming_devices_otherwise_maps_the_gpu_uuid_to_its_device() -> None:
    # The ComposabilityRequest backend names a device by its ComposableResource; the operator's device_id, which
    # NVIDIA's slice shows as uuid, is the GPU UUID.
    node = replace(vendor_node("w1", gpus=1), gpus_idle_since=0.0)
    node = replace(node, devices=(replace(node.devices[0], id="cr-0"),))
    snapshot = vendor_snapshot([dra_pod("busy", "b", node="w1"), dra_pod("train", "c")],
                               [on_w1("b"), claim("c", nvidia_request(product_is(A100_NAME)))],
                               slices=[nvidia_slice("w1", nvidia_gpu(0, "GPU-0a1b"))], nodes=[node])
    lowered = lower_claims(snapshot, fabric_ids={"GPU-0a1b": "cr-0"})
    assert [d.in_claim for d in lowered.nodes[0].devices] == [True]
    assert [(a.model, a.count) for a in plan_scale_up(lowered, GREEDY).attaches] == [("A100", 1)]
    unmapped = lower_claims(snapshot)  # without the map DDS cannot tell the A100 apart: it neither guesses
    assert "DDS cannot describe A100" in next(p for p in unmapped.pods if p.name == "train").dra_refusal


def test_a_free_published_gpu_serves_a_claim_without_an_attach() -> None:
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request(product_is(A100_NAME)))])
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert decision(plan, "train").verdict == Verdict.FITS_NOW and decision(plan, "train").node == "w1"
    assert plan.attaches == ()


# --- DDS's own driver unchanged, and kept apart from the vendor's ---------------------------------------------------

def test_each_drivers_claims_go_to_its_own_groups_nodes() -> None:
    groups = [dra_group("dds", models=()), vendor_group("nv", models=())]
    nodes = [dra_node("d1", gpus=0, group="dds"), vendor_node("n1", gpus=0, group="nv")]
    snapshot = vendor_snapshot([dra_pod("ours", "a"), dra_pod("theirs", "b", )],
                               [claim("a", request("gpu", model_is("A30"))),
                                claim("b", nvidia_request(product_is(A100_NAME)))],
                               slices=[nvidia_slice("elsewhere", nvidia_gpu(0, "GPU-x"))], nodes=nodes, groups=groups,
                               pools=[make_pool(A30=4, A100=2)])
    config = replace_config(models={"A100": DraModelDescription(value=A100_NAME, memory=80 * 2**30)})
    snapshot = replace(snapshot, groups=(groups[0], vendor_group("nv", config=config, models=())))
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    assert sorted((a.node, a.model, a.count) for a in plan.attaches) == [("d1", "A30", 1), ("n1", "A100", 1)]


def test_a_claim_of_another_device_class_is_told_the_groups_class() -> None:
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", request("gpu", model_is("A100")))])
    train = next(p for p in lower_claims(snapshot).pods if p.name == "train")
    assert train.dra_refusal.endswith("; DDS node groups take GPUs through DeviceClass gpu.nvidia.com, not "
                                      "gpu.dds.cdi.dev")


def test_dds_own_driver_is_judged_as_before_without_groups() -> None:
    # The observer's call without groups (and a snapshot without DRA groups): DDS's own devices only.
    pods = (dra_pod("train", "c"),)
    state = DraState(claims=(claim("c", request("gpu", model_is("A30"))),), classes=(CLASS,))
    (lowered,) = lower_observed(pods, state, {"A30", "A100"}, "nvidia.com/gpu.product")
    assert lowered.dra_refusal is None
    assert lowered.containers[-1].requests.get(DRA_GPU_RESOURCE) == 1
    vendor_claim = replace(state, claims=(claim("c", nvidia_request(product_is(A100_NAME))),),
                           classes=(CLASS, NVIDIA_CLASS))
    (refused,) = lower_observed(pods, vendor_claim, {"A100"}, "nvidia.com/gpu.product")
    assert refused.dra_refusal and "DeviceClass gpu.nvidia.com selector" in refused.dra_refusal


def test_extended_resource_pods_are_untouched_next_to_vendor_groups() -> None:
    snapshot = vendor_snapshot([make_pod("p", gpus=1)], slices=[])
    assert lower_claims(snapshot).pods == snapshot.pods


def replace_config(**fields) -> DraDriverConfig:
    return DraDriverConfig.model_validate({**VENDOR.model_dump(), **fields})
