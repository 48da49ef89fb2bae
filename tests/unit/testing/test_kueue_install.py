"""What harness/kueue.py installs for Kueue, rendered from a config/ folder laid out as hack/build-binaries.sh caches it
(a few objects in the shape of Kueue v0.17.0's config/components; the real files run in tests/e2e/test_kueue.py)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import versions
from harness.kueue import (NAMESPACE, SERVICE_ACCOUNT, WEBHOOK_HOST, WEBHOOK_SECRET, WEBHOOK_SERVICE, KueueError,
                           KueueRelease, SecretVolume, configuration, webhook_service)

PORT = 19443
CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "workloads.kueue.x-k8s.io"}, "spec": {"group": "kueue.x-k8s.io"}}
CONVERSION_PATCH = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": "workloads.kueue.x-k8s.io"},
                    "spec": {"conversion": {"strategy": "Webhook", "webhook": {
                        "clientConfig": {"service": {"namespace": "system", "name": "webhook-service",
                                                     "path": "/convert"}},
                        "conversionReviewVersions": ["v1"]}}}}


def _webhook(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
            "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "None"}


SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": ["kube-system", "kueue-system"]}]}


def _write(path: Path, *documents: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(documents))


def _release(root: Path, webhook_patch: dict[str, Any]) -> Path:
    folder = root / f"kueue-{versions.read_pins(versions.SHARED_PINS)['KUEUE_VERSION']}"
    config = folder / "config"
    _write(config / "crd" / "bases" / "workloads.yaml", CRD)
    _write(config / "crd" / "patches" / "webhook_in_workloads.yaml", CONVERSION_PATCH)
    _write(config / "crd" / "kustomization.yaml", {"resources": ["bases/workloads.yaml"],
                                                   "patches": [{"path": "patches/webhook_in_workloads.yaml"}]})
    _write(config / "rbac" / "all.yaml",
           {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "controller-manager",
                                                                       "namespace": "system"}},
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "manager-rolebinding"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "manager-role"},
            "subjects": [{"kind": "ServiceAccount", "name": "controller-manager", "namespace": "system"}]})
    _write(config / "rbac" / "kustomization.yaml", {"resources": ["all.yaml"]})
    _write(config / "webhook" / "manifests.yaml",
           {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [_webhook("mjob.kb.io", "/mutate-batch-v1-job"), _webhook("mpod.kb.io", "/mutate--v1-pod")]})
    _write(config / "webhook" / "kustomization.yaml",
           {"resources": ["manifests.yaml"], "patches": [{"patch": yaml.safe_dump(webhook_patch)}]})
    _write(config / "internalcert" / "secret.yaml",
           {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook-server-cert", "namespace": "system"}})
    _write(config / "internalcert" / "kustomization.yaml", {"resources": ["secret.yaml"]})
    (folder / "kueue").write_text("#!/bin/sh\nexit 1\n")
    (folder / "kueue").chmod(0o755)
    return root


POD_SELECTOR_PATCH = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                      "metadata": {"name": "mutating-webhook-configuration"},
                      "webhooks": [{"name": "mpod.kb.io", "namespaceSelector": SELECTOR}]}


def test_every_webhook_and_conversion_goes_to_the_webhook_service_on_this_instances_port(tmp_path: Path) -> None:
    release = KueueRelease.locate(_release(tmp_path, POD_SELECTOR_PATCH))
    [crd] = release.crds(PORT)
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "service": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "path": "/convert", "port": PORT}}
    [mutating] = release.webhooks(PORT)
    assert mutating["metadata"]["name"] == "kueue-mutating-webhook-configuration"  # the name Kueue injects its CA into
    by_name = {webhook["name"]: webhook for webhook in mutating["webhooks"]}
    assert {w["clientConfig"]["service"]["port"] for w in by_name.values()} == {PORT}
    assert by_name["mpod.kb.io"]["namespaceSelector"] == SELECTOR and "namespaceSelector" not in by_name["mjob.kb.io"]
    assert webhook_service()["spec"] == {"type": "ExternalName", "externalName": WEBHOOK_HOST}


def test_a_webhook_patch_the_harness_cannot_merge_is_refused(tmp_path: Path) -> None:
    patch = {**POD_SELECTOR_PATCH, "webhooks": [{"name": "mpod.kb.io", "failurePolicy": "Ignore"}]}
    release = KueueRelease.locate(_release(tmp_path, patch))
    with pytest.raises(KueueError, match="merges only namespaceSelector and objectSelector"):
        release.webhooks(PORT)


def test_the_rbac_and_secret_are_installed_in_kueues_namespace_with_its_prefix(tmp_path: Path) -> None:
    release = KueueRelease.locate(_release(tmp_path, POD_SELECTOR_PATCH))
    account, binding = release.rbac()
    assert (account["metadata"]["name"], account["metadata"]["namespace"]) == (SERVICE_ACCOUNT, NAMESPACE)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == "kueue-manager-role"
    assert release.webhook_secret()["metadata"] == {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}


def test_the_configuration_makes_kueue_certify_the_service_the_webhooks_name(tmp_path: Path) -> None:
    config = configuration(PORT, 18081, tmp_path)
    assert config["internalCertManagement"] == {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                                "webhookSecretName": WEBHOOK_SECRET}
    assert config["webhook"] == {"port": PORT, "host": WEBHOOK_HOST, "certDir": str(tmp_path)}
    assert config["integrations"]["frameworks"] == ["batch/job"] and config["namespace"] == NAMESPACE


def test_a_release_without_its_binary_names_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(KueueError, match="hack/build-binaries.sh"):
        KueueRelease.locate(tmp_path)


class _Answer:
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code, self.body = status_code, body

    def json(self) -> dict[str, Any]:
        return self.body


class _SecretApi:
    """The admin API as SecretVolume uses it: one GET of the Secret, absent until `data` is set."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def request(self, method: str, path: str, ok: tuple[int, ...] = ()) -> _Answer:
        assert method == "GET" and path.endswith(f"/secrets/{WEBHOOK_SECRET}")
        return _Answer(200, {"data": self.data}) if self.data else _Answer(404, {"kind": "Status"})

    def close(self) -> None:
        pass


def test_the_secret_volume_writes_each_key_once_it_exists_and_again_when_it_changes(tmp_path: Path) -> None:
    api = _SecretApi()
    volume = SecretVolume(api, NAMESPACE, WEBHOOK_SECRET, tmp_path)  # type: ignore[arg-type]
    volume.sync()
    assert list(tmp_path.iterdir()) == []
    api.data = {"tls.crt": base64.b64encode(b"cert 1").decode(), "tls.key": base64.b64encode(b"key 1").decode()}
    volume.sync()
    assert (tmp_path / "tls.crt").read_bytes() == b"cert 1" and (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    api.data["tls.crt"] = base64.b64encode(b"cert 2").decode()  # rotated
    volume.sync()
    assert (tmp_path / "tls.crt").read_bytes() == b"cert 2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]
