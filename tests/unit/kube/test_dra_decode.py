"""resource.k8s.io/v1 JSON -> the planner's DRA records, and the ResourceSlice devices DDS writes read back alike."""

from __future__ import annotations

from dds.kube import decode
from dds.kube.resourceslices import slice_devices, slice_name
from dds.model.dra_devices import DRIVER, gpu_device
from dds.model.dra_records import ALL, AllocatedDeviceInfo, PodClaimRef

CLAIM = {
    "metadata": {"name": "train-gpu", "namespace": "demo"},
    "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 2,
                                    "selectors": [{"cel": {"expression": "device.driver != ''"}}]}},
        {"name": "all", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}},
        {"name": "either", "firstAvailable": [{"name": "a", "deviceClassName": DRIVER}]},
    ]}},
    "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "w1", "device": "default-a30-000"}]}},
        "reservedFor": [{"resource": "pods", "name": "train", "uid": "u1"}]},
}


def test_a_claim_is_decoded_with_its_requests_and_allocation() -> None:
    claim = decode.resource_claim(CLAIM)
    assert claim.key == "demo/train-gpu"
    gpu, every, either = claim.requests
    assert (gpu.count, gpu.selectors, gpu.allocation_mode) == (2, ("device.driver != ''",), "ExactCount")
    assert every.allocation_mode == ALL and either.first_available
    assert claim.allocated == (AllocatedDeviceInfo("gpu", DRIVER, "w1", "default-a30-000"),)
    assert claim.reserved_for == ("train",)


def test_an_unallocated_claim_has_no_allocation() -> None:
    assert decode.resource_claim({**CLAIM, "status": {}}).allocated is None


def test_a_template_carries_the_claim_spec() -> None:
    template = decode.resource_claim_template({"metadata": {"name": "one", "namespace": "demo"},
                                               "spec": {"spec": CLAIM["spec"]}})
    assert [r.name for r in template.requests] == ["gpu", "all", "either"]


def test_the_slice_dds_writes_decodes_to_the_device_the_planner_assumes() -> None:
    devices = slice_devices("w1", [("default/A30-000", "A30")])
    obj = {"metadata": {"name": slice_name("w1")},
           "spec": {"driver": DRIVER, "nodeName": "w1", "pool": {"name": "w1", "generation": 3,
                                                                   "resourceSliceCount": 1}, "devices": devices}}
    decoded = decode.resource_slice(obj)
    assert (decoded.name, decoded.node_name, decoded.pool, decoded.pool_generation) == ("w1.gpu.dds.cdi.dev", "w1",
                                                                                        "w1", 3)
    assert decoded.devices == (gpu_device("A30", "default/A30-000", "w1"),)
    assert devices[0]["capacity"] == {"memory": {"value": "24Gi"}}


def test_a_device_class_keeps_its_selectors() -> None:
    cls = decode.device_class({"metadata": {"name": DRIVER},
                               "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    assert cls.selectors == (f'device.driver == "{DRIVER}"',)


def test_pod_claims_name_the_claim_made_from_a_template() -> None:
    pod = {"metadata": {"name": "train", "namespace": "demo"},
           "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one"},
                                                         {"name": "shared", "resourceClaimName": "team"}]},
           "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x7k"}]}}
    info = decode.pod_info(pod)
    assert info.resource_claims == (PodClaimRef("gpu", None, "one", "train-gpu-x7k"),
                                    PodClaimRef("shared", "team", None, None))
    assert [r.resolved_name for r in info.resource_claims] == ["train-gpu-x7k", "team"]
    assert info.unsupported == ()
