"""Rendered objects checked by a real apiserver without being stored: server-side apply with dryRun=All.

Shared by the manifests' and the chart's tests, so both are held to the same check: every field is validated against
the served schema (a misspelt field is an error, not dropped) and a kind nobody serves is named, not skipped."""
from __future__ import annotations

from typing import Any

from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError


def dry_run_apply(dynamic: DynamicClient, objects: list[dict[str, Any]], field_manager: str) -> list[str]:
    """One line per object the apiserver would refuse; empty when it accepts them all."""
    problems = []
    for obj in objects:
        try:
            resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        except ResourceNotFoundError:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: the apiserver serves no "
                            f"{obj['apiVersion']} {obj['kind']} (is its CRD installed?)")
            continue
        try:
            dynamic.server_side_apply(resource, body=obj, namespace=obj["metadata"].get("namespace"),
                                      field_manager=field_manager, dry_run="All")
        except DynamicApiError as error:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {error.status} {error.summary()}")
    return problems
