"""Where node groups come from: Cluster API MachineSets and MachineDeployments opted in with
`dds.cdi.dev/enabled: "true"` (a MachineSet only when no MachineDeployment owns it), or a YAML file
with the same annotations (no cluster). Both are read through one parser (dds/groups/schema.py `parse_group`); the
catalog that serves them to cluster-autoscaler is dds/groups/catalog.py. A MachineSet is a group only within what the
administrator grants its namespace (dds/groups/access.py); a file is the administrator's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

import yaml

from dds.config import NamespaceGrant
from dds.groups.access import grant_refusals, namespace_refusal
from dds.groups.schema import GroupConfigError, GroupInput, parse_group
from dds.kube.machinesets import MachineSetLister, MachineSetObject, MachineSetReadError
from dds.model import groups as g
from dds.model.groups import NodeGroupSpec, SourceRef


@dataclass(frozen=True)
class SourceRead:
    groups: tuple[NodeGroupSpec, ...]
    errors: tuple[GroupConfigError, ...] = ()


class SourceUnavailable(Exception):
    """The source could not be read at all (not one bad group): keep what was read before."""


class NodeGroupSource(Protocol):
    kind: str  # label value of the config-error metric: "machineset" | "file"

    def read(self) -> SourceRead: ...


# --- MachineSets ---

def group_input_from_machineset(machineset: MachineSetObject) -> GroupInput:
    source = SourceRef(kind=machineset.kind, name=machineset.name, namespace=machineset.namespace,
                       api_version=machineset.api_version, uid=machineset.uid)
    return GroupInput(id=machineset.group_id, annotations=machineset.annotations, source=source,
                      replicas=machineset.replicas, template_taints=machineset.template_taints)


def opted_in(annotations: Mapping[str, str]) -> bool:
    return str(annotations.get(g.ANN_ENABLED, "")).strip().lower() == "true"


class MachineSetSource:
    """The opted-in MachineSets and MachineDeployments of the namespaces in `grants` (settings
    node_group_namespaces), each within its namespace's grant; an opted-in one anywhere else is refused, not ignored,
    so its owner is told why.

    A MachineDeployment's group scales the MachineDeployment. A MachineSet it owns is never a group of its own (its
    controller sets that MachineSet's replicas, as cluster-autoscaler's clusterapi provider also skips it). Cluster API
    copies a MachineDeployment's annotations to its MachineSets, so the MachineSets of an opted-in MachineDeployment
    carry the opt-in too: they are passed over in silence; one opted in by itself is refused with the reason."""

    kind = "machineset"

    def __init__(self, lister: MachineSetLister, grants: Mapping[str, NamespaceGrant]) -> None:
        self._lister = lister
        self._grants = dict(grants)

    def read(self) -> SourceRead:
        try:
            machinesets = self._lister.list()
        except MachineSetReadError as exc:
            raise SourceUnavailable(str(exc)) from exc
        inputs, refused = [], []
        deployments = {(m.namespace, m.name) for m in machinesets
                       if m.kind == "MachineDeployment" and opted_in(m.annotations)}
        for machineset in machinesets:
            if not opted_in(machineset.annotations):
                continue
            if machineset.owner_deployment:
                if (machineset.namespace, machineset.owner_deployment) not in deployments:
                    refused.append(_deployment_owned(machineset))
                continue
            item = group_input_from_machineset(machineset)
            refusal = namespace_refusal(item, self._grants)
            if refusal is None:
                inputs.append(item)
            else:
                refused.append(refusal)
        result = _parse_all(inputs, admit=lambda spec: grant_refusals(spec, self._grants[spec.source.namespace]))
        return SourceRead(result.groups, tuple(refused) + result.errors)


def _deployment_owned(machineset: MachineSetObject) -> GroupConfigError:
    """A MachineSet a MachineDeployment owns cannot be a node group: its controller sets the MachineSet's replicas, so
    every scale DDS wrote would be undone. Its MachineDeployment can."""
    source = group_input_from_machineset(machineset).source
    deployment = f"{machineset.namespace}/{machineset.owner_deployment}"
    return GroupConfigError(source, machineset.group_id, g.ANN_ENABLED,
                            f"this MachineSet is owned by MachineDeployment {deployment}, whose controller sets its "
                            f"replicas (a scale written here would be undone); put {g.ANN_ENABLED} and the group's "
                            f"annotations on MachineDeployment {deployment} instead (DDS then scales the "
                            f"MachineDeployment), and remove them from this MachineSet")


# --- YAML file ---

class FileSource:
    """`nodeGroups:` entries with `id`, optional `replicas` and `annotations` (see examples/node-groups.yaml)."""

    kind = "file"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> SourceRead:
        try:
            document = yaml.safe_load(self.path.read_text())
        except OSError as exc:
            raise SourceUnavailable(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise SourceUnavailable(f"{self.path}: not valid YAML: {exc}") from exc
        entries = (document or {}).get("nodeGroups") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise SourceUnavailable(f"{self.path}: the top level must be a mapping with a `nodeGroups` list")
        inputs: list[GroupInput] = []
        errors: list[GroupConfigError] = []
        for index, entry in enumerate(entries):
            parsed = self._entry(index, entry)
            if isinstance(parsed, GroupConfigError):
                errors.append(parsed)
            else:
                inputs.append(parsed)
        result = _parse_all(inputs)
        return SourceRead(result.groups, tuple(errors) + result.errors)

    def _entry(self, index: int, entry: Any) -> GroupInput | GroupConfigError:
        source = SourceRef(kind="File", name=f"{self.path}#nodeGroups[{index}]")
        if not isinstance(entry, dict):
            return GroupConfigError(source, "", f"nodeGroups[{index}]", "must be a mapping with id and annotations")
        group_id = str(entry.get("id") or "").strip()
        unknown = sorted(set(entry) - {"id", "replicas", "annotations"})
        if unknown:
            return GroupConfigError(source, group_id, f"nodeGroups[{index}].{unknown[0]}",
                                    "unknown key; an entry has id, replicas and annotations")
        annotations = entry.get("annotations") or {}
        if not isinstance(annotations, dict):
            return GroupConfigError(source, group_id, f"nodeGroups[{index}].annotations", "must be a mapping")
        replicas = entry.get("replicas")
        if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0):
            return GroupConfigError(source, group_id, f"nodeGroups[{index}].replicas",
                                    f"{replicas!r} is not a whole number >= 0")
        return GroupInput(id=group_id, annotations={str(k): _scalar(v) for k, v in annotations.items()},
                          source=SourceRef(kind="File", name=f"{self.path}#{group_id or index}"), replicas=replicas)


def _scalar(value: Any) -> str:
    # YAML turns `true` and `4` into bool and int; annotations are strings, so normalise to what a user would write.
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _parse_all(inputs: Iterable[GroupInput],
               admit: Callable[[NodeGroupSpec], tuple[GroupConfigError, ...]] = lambda spec: ()) -> SourceRead:
    """Every input parsed; a valid one is then checked by `admit` (what its source allows it to ask for)."""
    groups: list[NodeGroupSpec] = []
    errors: list[GroupConfigError] = []
    seen: set[str] = set()
    for item in inputs:
        spec, problems = parse_group(item)
        if spec is not None:
            problems = admit(spec)
            spec = None if problems else spec
        if spec is not None and spec.id in seen:
            problems = (GroupConfigError(item.source, item.id, "id", "defined twice; the first definition is used"),)
            spec = None
        errors.extend(problems)
        if spec is not None:
            seen.add(spec.id)
            groups.append(spec)
    return SourceRead(tuple(sorted(groups, key=lambda s: s.id)), tuple(errors))
