"""Kubernetes API access: the only package that imports the kubernetes client (an import-linter contract). Other layers
hold an `ApiClient` to pass back in, and read the apiserver's errors as `dds.kube.errors.ApiError`."""

from kubernetes.client import ApiClient  # the handle other layers pass around without importing the client

__all__ = ["ApiClient"]
