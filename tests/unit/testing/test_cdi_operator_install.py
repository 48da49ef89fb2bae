"""What harness/cdi_operator.py installs for the CDI operator, rendered from the operator's own config/ files (taken
from the pinned source archive, laid out as hack/build-binaries.sh caches them beside the binary)."""

from __future__ import annotations

import base64
import tarfile
from pathlib import Path

import pytest

from harness.cdi_operator import (MISSING_RBAC_RULES, OPERATOR_NAMESPACE, SERVICE_ACCOUNT, CdiOperator,
                                  CdiOperatorError, DeviceResourceType, FabricManagerAccess, FtiApi, OperatorRelease,
                                  missing_rbac)
from tests.unit.fabric.test_cdi_operator_crds import REPO, _pinned

CONFIG_PREFIX = "composable-resource-operator/config/"
WANTED = ("crd/bases/", "rbac/", "webhook/manifests.yaml")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A cache folder like `cro-manager-<commit>/`: the operator's config files and an executable in the binary's
    place (these tests read the install files only; the real binary runs in the integration tests)."""
    release = tmp_path / "cro-manager-test"
    archive = REPO.parent / "shared" / "third_party" / _pinned()["CRO_SOURCE_ARCHIVE"]
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            relative = member.name.removeprefix(CONFIG_PREFIX)
            if member.isfile() and relative != member.name and relative.startswith(WANTED):
                target = release / "config" / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    binary = release / "cro-manager"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    current = tmp_path / "current"
    current.mkdir()
    (current / "cro-manager").symlink_to(binary)
    return current


def _by_name(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}


def test_the_rbac_is_the_shipped_rbac_in_the_operator_namespace(bin_dir: Path) -> None:
    objects = _by_name(OperatorRelease.locate(bin_dir).rbac())
    account = objects[("ServiceAccount", SERVICE_ACCOUNT)]
    assert account["metadata"]["namespace"] == OPERATOR_NAMESPACE
    binding = objects[("ClusterRoleBinding", "composable-resource-operator-manager-rolebinding")]
    assert binding["roleRef"]["name"] == "composable-resource-operator-manager-role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}]
    role = objects[("ClusterRole", "composable-resource-operator-manager-role")]
    assert {"apiGroups": ["cro.hpsys.ibm.ie.com"], "resources": ["composabilityrequests/finalizers",
            "composableresources/finalizers"], "verbs": ["update"]} in role["rules"]
    leader = objects[("Role", "composable-resource-operator-leader-election-role")]
    assert leader["metadata"]["namespace"] == OPERATOR_NAMESPACE


def test_the_webhook_is_sent_to_the_local_operator_with_its_ca(bin_dir: Path) -> None:
    [configuration] = OperatorRelease.locate(bin_dir).validating_webhooks(b"--CA--")
    assert configuration["metadata"]["name"] == "composable-resource-operator-validating-webhook-configuration"
    [webhook] = configuration["webhooks"]
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-cro-hpsys-ibm-ie-com-v1alpha1-composabilityrequest",
        "caBundle": base64.b64encode(b"--CA--").decode()}
    assert webhook["failurePolicy"] == "Fail"  # as shipped


def test_the_operators_crds_come_from_its_release(bin_dir: Path) -> None:
    names = {crd["metadata"]["name"] for crd in OperatorRelease.locate(bin_dir).crds()}
    assert names == {"composabilityrequests.cro.hpsys.ibm.ie.com", "composableresources.cro.hpsys.ibm.ie.com"}


def test_a_missing_build_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(CdiOperatorError, match="no executable cro-manager .*hack/build-binaries.sh"):
        OperatorRelease.locate(tmp_path)


def test_device_plugin_mode_needs_the_cluster_id() -> None:
    fabric = FabricManagerAccess(endpoint="127.0.0.1:1", ca_file=Path("/nonexistent"), tenant_id="t", username="u",
                                 password="p", client_id="c", client_secret="s", realm="r")
    with pytest.raises(CdiOperatorError, match="DEVICE_PLUGIN mode needs .*cluster_id"):
        CdiOperator(None, fabric, device_resource_type=DeviceResourceType.DEVICE_PLUGIN)  # type: ignore[arg-type]


def test_the_cluster_manager_api_is_chosen_by_its_emulator_and_needs_a_cluster_id(tmp_path: Path) -> None:
    from harness.cluster_manager import ClusterManagerEmulator
    from harness.fabric_manager import FabricManagerEmulator

    with ClusterManagerEmulator({"A100": 1}, state_dir=tmp_path / "cm") as cm, \
            FabricManagerEmulator({"A100": 1}, state_dir=tmp_path / "fm") as fm:
        assert (FabricManagerAccess.of(cm).api, FabricManagerAccess.of(cm).cluster_id) == (FtiApi.CM, cm.cluster_uuid)
        assert (FabricManagerAccess.of(fm).api, FabricManagerAccess.of(fm).cluster_id) == (FtiApi.FM, "")
    no_cluster = FabricManagerAccess(endpoint="127.0.0.1:1", ca_file=Path("/nonexistent"), tenant_id="t",
                                     username="u", password="p", client_id="c", client_secret="s", realm="r",
                                     api=FtiApi.CM)
    with pytest.raises(CdiOperatorError, match="cluster-manager API .*needs .*cluster_id"):
        CdiOperator(None, no_cluster)  # type: ignore[arg-type]


def test_the_shipped_role_grants_what_device_plugin_mode_reads_through_the_cluster_manager(bin_dir: Path) -> None:
    """DEVICE_PLUGIN + CM: the node's OpenShift Machine (unstructured Get), its BareMetalHost (through the cache),
    nvidia-smi in the driver pod, the GPU operator's DaemonSets restarted. None of it is in MISSING_RBAC_RULES."""
    shipped = [rule for obj in OperatorRelease.locate(bin_dir).rbac() if obj["kind"] == "ClusterRole"
               for rule in obj.get("rules", [])]
    needed = [("machine.openshift.io", "machines", "get"), ("metal3.io", "baremetalhosts", "get"),
              ("metal3.io", "baremetalhosts", "list"), ("metal3.io", "baremetalhosts", "watch"),
              ("", "pods/exec", "create"), ("apps", "daemonsets", "update")]
    assert [n for n in needed if not _granted(shipped, *n)] == []


def _granted(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
               and verb in rule.get("verbs", []) and not rule.get("resourceNames") for rule in rules)


def test_the_extra_grant_holds_only_what_the_shipped_role_lacks(bin_dir: Path) -> None:
    """When an operator version grants these itself, this fails: drop the rule from MISSING_RBAC_RULES."""
    shipped = [rule for obj in OperatorRelease.locate(bin_dir).rbac() if obj["kind"] == "ClusterRole"
               for rule in obj.get("rules", [])]
    already = [(group, resource, verb) for rule in MISSING_RBAC_RULES for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"] if _granted(shipped, group, resource, verb)]
    assert not already
    role, binding = missing_rbac()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}]
