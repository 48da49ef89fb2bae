"""Kubernetes API access (the only layer that imports the kubernetes client)."""

from kubernetes.client import ApiClient  # the handle other layers pass around without importing the client

__all__ = ["ApiClient"]
