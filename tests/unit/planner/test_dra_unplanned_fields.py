"""Claim fields beyond "N devices of a class matching selectors" (issue 27, part 5): each is planned correctly or
refused with a reason (an Event with reason ClaimNotPlanned, the same sentence in `dds plan`), never dropped and the
claim planned as a plain request for whole GPUs.

| field | what DDS does |
|---|---|
| `exactly.adminAccess` | refused: admin access reaches devices already in use; no attach serves it |
| `exactly.tolerations` | planned: they only widen which tainted devices may be allocated; attached GPUs carry none |
| `exactly.capacity.requests` | planned as a filter on a whole GPU's capacity; refused on devices several allocations share |
| partitions (devices consuming a slice's `sharedCounters`) | a request only partitions serve is refused |
"""

from __future__ import annotations

from dataclasses import replace

from dds.kube.decode import device_requests, resource_slice
from dds.planner import plan_scale_up, render_scale_up
from dds.model.dra_devices import DRIVER, gpu_device
from dds.planner.dra import claim_demand, lower_claims, partitions_of
from dds.model.dra_records import DeviceTaintInfo, DraDevice
from dds.model.plan import Verdict
from dds.planner.refusals import CLAIM_NOT_PLANNED, NO_MATCHING_DEVICE
from tests.unit.planner.test_dra import (A30, A100, CLASS, GREEDY, claim, decision, dra_node, dra_pod, model_is,
                                         request, snapshot_with)
from tests.unit.planner.test_dra_vendor import (NVIDIA, NVIDIA_CLASS, VENDOR, nvidia_gpu, nvidia_request,
                                                nvidia_slice, vendor_group, vendor_node, vendor_snapshot)

CLASSES = {CLASS.name: CLASS}


def planned(snapshot, pod: str = "train"):
    plan = plan_scale_up(lower_claims(snapshot), GREEDY)
    return plan, decision(plan, pod)


# --- decoding: nothing is dropped -----------------------------------------------------------------------------------

def test_every_exact_request_field_is_decoded() -> None:
    (req,) = device_requests({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DRIVER, "adminAccess": True,
        "tolerations": [{"key": "dds.cdi.dev/detaching", "operator": "Exists", "effect": "NoSchedule"}],
        "capacity": {"requests": {"memory": "40Gi", "example.com/bandwidth": "10"}}}}]}})
    assert req.admin_access
    assert req.tolerations == (DeviceTaintInfo("dds.cdi.dev/detaching", "", "NoSchedule", "Exists"),)
    assert dict(req.capacity) == {"memory": 40 * 2**30, "example.com/bandwidth": 10}


def test_shared_counters_shared_devices_and_taints_of_a_slice_are_decoded() -> None:
    decoded = resource_slice({"metadata": {"name": "s"}, "spec": {
        "driver": NVIDIA, "pool": {"name": "w1", "generation": 1}, "nodeName": "w1",
        "sharedCounters": [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}],
        "devices": [{"name": "gpu-0-mig-1g", "allowMultipleAllocations": True,
                     "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}],
                     "taints": [{"key": "example.com/unhealthy", "value": "ecc", "effect": "NoSchedule"}]}]}})
    (device,) = decoded.devices
    assert decoded.shared_counters == ("gpu-0-counters",)
    assert device.allow_multiple_allocations and device.consumes_counters == ("gpu-0-counters",)
    assert device.taints == (DeviceTaintInfo("example.com/unhealthy", "ecc", "NoSchedule"),)


# --- adminAccess: refused -------------------------------------------------------------------------------------------

def test_admin_access_is_refused_not_planned_as_a_gpu() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", replace(request(), admin_access=True))],
                             nodes=[dra_node("w1", gpus=0)])
    plan, train = planned(snapshot)
    assert plan.attaches == () and plan.new_nodes == ()
    assert train.refusal == CLAIM_NOT_PLANNED and "adminAccess" in train.reason
    assert (f"pod default/train: {train.verdict.value}: ResourceClaim default/c request 'gpu' asks for adminAccess"
            in render_scale_up(plan))


# --- tolerations: planned (they do not change what an attach gives) ------------------------------------------------

def test_tolerations_are_planned_like_the_same_request_without_them() -> None:
    tolerating = replace(request("gpu", model_is("A100")),
                         tolerations=(DeviceTaintInfo("example.com/maintenance", operator="Exists"),))
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", tolerating)], nodes=[dra_node("w1", gpus=0)])
    plan, train = planned(snapshot)
    assert train.verdict == Verdict.FITS_AFTER_GPUS and train.refusal is None
    assert [(a.node, a.model, a.count) for a in plan.attaches] == [("w1", "A100", 1)]


# --- capacity requests: a filter on a whole GPU, refused on shared devices ----------------------------------------

def test_a_capacity_request_picks_the_models_with_enough_of_it() -> None:
    wants_40gi = replace(request(), capacity={"memory": 40 * 2**30})  # an A30 has 24Gi, an A100 80Gi
    demand = claim_demand(claim("c", wants_40gi), CLASSES, (A30, A100))
    assert demand.refusal is None and demand.models == frozenset({"A100"}) and demand.gpus == 1
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", wants_40gi)], nodes=[dra_node("w1", gpus=0)])
    plan, _ = planned(snapshot)
    assert [(a.model, a.count) for a in plan.attaches] == [("A100", 1)]


def test_a_capacity_no_gpu_has_enough_of_is_no_matching_device() -> None:
    wants_200gi = replace(request(), capacity={"memory": 200 * 2**30})
    demand = claim_demand(claim("c", wants_200gi), CLASSES, (A30,))
    assert demand.refusal_reason == NO_MATCHING_DEVICE
    assert "request capacity request `memory >= 200Gi` is false for an attachable A30" in demand.refusal


def test_a_capacity_the_device_does_not_have_never_matches() -> None:
    demand = claim_demand(claim("c", replace(request(), capacity={"example.com/bandwidth": 1})), CLASSES, (A30,))
    assert demand.refusal and "fails with no capacity example.com/bandwidth on the device" in demand.refusal


def test_a_capacity_request_on_a_shared_device_is_refused() -> None:
    shared = replace(gpu_device("A100", "pool-a/A100-000", "w1"), allow_multiple_allocations=True)
    wants_10gi = replace(request(), capacity={"memory": 10 * 2**30})
    demand = claim_demand(claim("c", wants_10gi), CLASSES, (shared,))
    assert demand.refusal_reason == CLAIM_NOT_PLANNED
    assert "memory: 10Gi" in demand.refusal and "shares of one" in demand.refusal


# --- partitionable devices: a request only partitions serve is refused ---------------------------------------------

def mig(index: int, parent: int, uuid: str) -> DraDevice:
    device = nvidia_gpu(index, uuid, kind="mig")
    return replace(device, name=f"gpu-{parent}-mig-1g-{index}", consumes_counters=(f"gpu-{parent}-counters",))


def test_a_request_only_partitions_serve_is_refused_as_such() -> None:
    whole = replace(nvidia_gpu(0, "w1-gpu-0"), consumes_counters=("gpu-0-counters",))
    partition = mig(1, 0, "w1-gpu-0-mig-1")
    slices = [replace(nvidia_slice("w1", whole, partition), shared_counters=("gpu-0-counters",))]
    mig_class = replace(NVIDIA_CLASS, name="mig.nvidia.com",
                        selectors=(f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'",))
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", replace(nvidia_request(),
                                                                            device_class="mig.nvidia.com"))],
                               slices=slices, nodes=[vendor_node("w1", gpus=1), vendor_node("w2")])
    snapshot = replace(snapshot, dra=replace(snapshot.dra, classes=snapshot.dra.classes + (mig_class,)))
    assert [d.name for d in partitions_of(slices, [VENDOR])] == [partition.name]  # the whole GPU is no partition
    plan, train = planned(snapshot)
    assert plan.attaches == () and train.refusal == CLAIM_NOT_PLANNED
    assert "served by partitions of a GPU" in train.reason and "gpu-0-counters" in train.reason


def test_a_whole_gpu_of_a_partitionable_driver_is_planned() -> None:
    whole = replace(nvidia_gpu(0, "w1-gpu-0"), consumes_counters=("gpu-0-counters",))
    slices = [replace(nvidia_slice("w1", whole, mig(1, 0, "w1-gpu-0-mig-1")), shared_counters=("gpu-0-counters",))]
    snapshot = vendor_snapshot([dra_pod("train", "c")], [claim("c", nvidia_request())], slices=slices,
                               groups=[vendor_group(models=())])
    _, train = planned(snapshot)
    assert train.refusal is None and train.verdict in (Verdict.FITS_NOW, Verdict.FITS_AFTER_GPUS)


def test_first_available_and_constraints_are_not_planned_either() -> None:
    first = claim_demand(claim("c", replace(request(), first_available=True)), CLASSES, (A30,))
    constrained = claim_demand(replace(claim("c"), constraints=1), CLASSES, (A30,))
    assert first.refusal_reason == constrained.refusal_reason == CLAIM_NOT_PLANNED
    assert "firstAvailable" in first.refusal and "constraints" in constrained.refusal


def test_the_event_reason_of_an_unplanned_claim_is_claim_not_planned() -> None:
    snapshot = snapshot_with([dra_pod("train", "c")], [claim("c", replace(request(), admin_access=True))])
    lowered = next(p for p in lower_claims(snapshot).pods if p.name == "train")
    assert lowered.dra_refusal_reason == CLAIM_NOT_PLANNED
