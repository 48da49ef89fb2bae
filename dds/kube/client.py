"""One way to get an API client: a kubeconfig file, or the in-cluster service account."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kubernetes import client, config


def api_client(kubeconfig: Optional[Path] = None, in_cluster: bool = False) -> client.ApiClient:
    if in_cluster:
        config.load_incluster_config()
        return client.ApiClient()
    if kubeconfig is None:
        raise ValueError("no cluster: pass --kubeconfig or --in-cluster")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)
