"""Kubernetes API access (the only layer that imports the kubernetes client)."""
