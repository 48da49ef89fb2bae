"""DDS's settings as the cluster holds them: the `settings.yaml` key of the ConfigMap the manifests and the chart
install (`dds-system/dds-settings`), so a workstation command plans with the settings the running DDS uses."""

from __future__ import annotations

from typing import Optional

from kubernetes import client

from dds.kube.errors import ApiError, api_errors

SETTINGS_KEY = "settings.yaml"
DEFAULT_SETTINGS_CONFIGMAP = "dds-system/dds-settings"


def read_settings_yaml(api: client.ApiClient, namespace: str, name: str) -> Optional[str]:
    """The ConfigMap's settings.yaml; None when the ConfigMap does not exist. A ConfigMap without the key is a
    ValueError naming the keys it has."""
    try:
        with api_errors():
            found = client.CoreV1Api(api).read_namespaced_config_map(name, namespace, _request_timeout=15)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise exc.__cause__ or exc
    data = found.data or {}
    if SETTINGS_KEY not in data:
        raise ValueError(f"ConfigMap {namespace}/{name} has no key {SETTINGS_KEY} (it has: "
                         f"{', '.join(sorted(data)) or 'none'})")
    return data[SETTINGS_KEY]
