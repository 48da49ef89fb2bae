"""A small kustomize renderer for the subset manifests/ uses (no kubectl or kustomize binary in the test environment);
harness/rbac.py applies the RBAC it renders, tests/integration/ops/test_manifests.py checks the rest.

Supported: `resources:` entries that are YAML files or directories holding a kustomization.yaml (recursively),
`images:` (name -> newName/newTag/digest on every container and initContainer image of the rendered workloads, with
outer kustomizations applied last, as kustomize does), and `patches:` with an inline JSON6902 `patch` (ops add and
replace; `-` appends to a list) on a `target` chosen by kind and name. Anything else in a kustomization is an error, so the
manifests cannot start using a feature this renderer would silently ignore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}


class RenderError(Exception):
    pass


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise RenderError(f"{directory}: no kustomization.yaml (kustomize needs one in every directory it is given)")


def render(directory: Path) -> list[dict[str, Any]]:
    path = kustomization_file(directory)
    kustomization = yaml.safe_load(path.read_text()) or {}
    unsupported = set(kustomization) - SUPPORTED_KEYS
    if unsupported:
        raise RenderError(f"{path}: keys {sorted(unsupported)} are not supported by the test renderer")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects += render(target)
        elif target.is_file():
            objects += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]
        else:
            raise RenderError(f"{path}: resource {entry!r} does not exist")
    for image in kustomization.get("images", []):
        _set_image(objects, image)
    for patch in kustomization.get("patches", []):
        _apply_patch(objects, patch, path)
    _check_unique(objects, path)
    return objects


def _set_image(objects: list[dict[str, Any]], image: dict[str, str]) -> None:
    for obj in objects:
        spec = (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            name, tag = _split(container["image"])
            if name != image["name"]:
                continue
            new_name = image.get("newName", name)
            if "digest" in image:
                container["image"] = f"{new_name}@{image['digest']}"
            else:
                container["image"] = f"{new_name}:{image.get('newTag', tag)}"


def _split(reference: str) -> tuple[str, str]:
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:  # no tag (a registry port is not a tag)
        return reference, "latest"
    return name, tag


def _check_unique(objects: list[dict[str, Any]], path: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise RenderError(f"{path}: {key} appears twice (kustomize rejects duplicate resources)")
        seen.add(key)


def _apply_patch(objects: list[dict[str, Any]], patch: dict[str, Any], path: Path) -> None:
    target = patch.get("target") or {}
    matched = [o for o in objects
               if o["kind"] == target.get("kind") and o["metadata"]["name"] == target.get("name")]
    if not matched:
        raise RenderError(f"{path}: patch target {target} matches no resource")
    for op in yaml.safe_load(patch["patch"]):
        if op["op"] not in ("add", "replace"):
            raise RenderError(f"{path}: JSON patch op {op['op']!r} is not supported by the test renderer")
        for obj in matched:
            *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            node: Any = obj
            for key in parents:
                node = node[int(key)] if isinstance(node, list) else node[key]
            if isinstance(node, list):
                node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
            else:
                node[last] = op["value"]
