"""DDS's Helm chart (charts/dds) on a test control plane: `helm template` with the binary hack/build-tools.sh builds,
and the rendered objects applied with the admin token, as `helm install` would create them.

No kubelet or Deployment controller runs on the test control plane, so what the chart's Deployment would start is up
to the caller (tests/e2e/test_upgrade.py runs its replicas as `dds serve` processes and rolls them as the Deployment
controller would: harness/rollout.py); every other object (ServiceAccounts, RBAC, the admission policies, the Service,
the PodDisruptionBudget, the settings ConfigMap) is in the API as rendered.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from harness.install import RBAC_COLLECTIONS, AdminApi
from harness.versions import SHARED_PINS, active_profile, read_pins

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "dds"
# The Kubernetes version `helm template` assumes (Capabilities.KubeVersion, the chart's kubeVersion): the one the
# tests' control plane runs (DDS_K8S_PROFILE, harness/versions.py).
KUBE_VERSION = active_profile().kubernetes_version.lstrip("v")
SETTINGS_CONFIGMAP_KEY = "settings.yaml"

# Where each rendered kind is created (namespace filled from the object).
COLLECTIONS: Mapping[tuple[str, str], str] = {
    **RBAC_COLLECTIONS,
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"):
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


class ChartError(RuntimeError):
    """helm is missing or refused to render, or the apiserver refused a rendered object; the message says which."""


def tools_dir() -> Path:
    """Where hack/build-tools.sh caches helm and promtool (make setup)."""
    pins = read_pins(SHARED_PINS)
    cache = Path(os.environ.get("DDS_BIN_CACHE", Path.home() / ".cache" / "dds" / "bin"))
    return cache / f"tools-helm-{pins['HELM_VERSION']}-promtool-{pins['PROMETHEUS_VERSION']}"


def template(args: Sequence[str], release: str = "dds", namespace: str = "dds-system") -> str:
    """`helm template` of the chart with `args` (--set, -f): the text `helm install` applies, comments included."""
    helm = tools_dir() / "helm"
    if not os.access(helm, os.X_OK):
        raise ChartError(f"helm is not built ({helm} is missing): run `make setup` (or `bash hack/build-tools.sh`)")
    command = [str(helm), "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION,
               *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    if result.returncode != 0:
        raise ChartError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


def render(values: Mapping[str, str], release: str = "dds", namespace: str = "dds-system") -> list[dict[str, Any]]:
    """`helm template` of the chart with `--set key=value` for each of `values`: the objects `helm install` creates."""
    text = template([arg for key, value in values.items() for arg in ("--set", f"{key}={value}")], release, namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise ChartError(f"the render holds {len(found)} {kind} named {name}")
    return found[0]


def settings_of(objects: list[dict[str, Any]], configmap: str = "dds-settings") -> dict[str, Any]:
    """The settings.yaml the chart renders for DDS."""
    return yaml.safe_load(find(objects, "ConfigMap", configmap)["data"][SETTINGS_CONFIGMAP_KEY])


def install(plane: Any, objects: list[dict[str, Any]]) -> None:
    """Create (or replace) every rendered object on `plane` with the admin token, in the render's order."""
    admin = AdminApi(plane, Path(plane.workdir) / "pki" / "ca.crt", COLLECTIONS, ChartError)
    try:
        for obj in objects:
            admin.apply(obj)
    finally:
        admin.close()
