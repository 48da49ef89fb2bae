"""Who may have node groups, and what a group may ask for: the administrator's grants (settings
`node_group_namespaces`, dds/config.py NamespaceGrant) against what a MachineSet's annotations ask.

Annotations are written by whoever may edit a MachineSet; a MachineSet is a group only in a namespace the
administrator lists, and only within what that namespace is granted:

| a MachineSet asking for                                   | refused unless the namespace's grant says       | reason                     |
|-----------------------------------------------------------|-------------------------------------------------|----------------------------|
| anything, in a namespace not in node_group_namespaces     | (the namespace listed)                          | namespace-not-allowed      |
| dds.cdi.dev/fabric-pool P (default "default")             | pools lists P, or "*"                           | pool-not-allowed           |
| dds.cdi.dev/force-detach: "true"                          | force_detach: true                              | force-detach-not-allowed   |
| a gpu-/node-idle-cooldown shorter than the floor (incl. 0) | min_idle_cooldown_seconds at or below it       | cooldown-below-floor       |

A refusal is a GroupConfigError like a malformed key: an InvalidNodeGroup Event on the MachineSet naming the setting
that would allow it, `dds_node_group_config_errors_total{reason}`, and the group is not served (dds/groups/catalog.py).
Groups of a YAML file (node_groups_file) are the administrator's own and are not checked here.
"""

from __future__ import annotations

from typing import Mapping, Optional

from dds.config import NamespaceGrant
from dds.groups.schema import GroupConfigError, GroupInput
from dds.model import groups as g
from dds.model.groups import NodeGroupSpec

NAMESPACE_NOT_ALLOWED = "namespace-not-allowed"
POOL_NOT_ALLOWED = "pool-not-allowed"
FORCE_DETACH_NOT_ALLOWED = "force-detach-not-allowed"
COOLDOWN_BELOW_FLOOR = "cooldown-below-floor"

ANY_POOL = "*"
SETTING = "node_group_namespaces"


def namespace_refusal(item: GroupInput, grants: Mapping[str, NamespaceGrant]) -> Optional[GroupConfigError]:
    """The refusal of a MachineSet whose namespace the administrator did not list; None when it is listed."""
    namespace = item.source.namespace
    if namespace in grants:
        return None
    listed = ", ".join(sorted(grants)) or "none"
    return GroupConfigError(
        item.source, item.id, g.ANN_ENABLED,
        f"namespace {namespace} may not have node groups (the administrator's setting {SETTING} lists: {listed}); "
        f"ask whoever deploys DDS to add {namespace} with the pools it may use", NAMESPACE_NOT_ALLOWED)


def grant_refusals(spec: NodeGroupSpec, grant: NamespaceGrant) -> tuple[GroupConfigError, ...]:
    """What a parsed group asks for beyond its namespace's grant, one error per knob (each naming the setting)."""
    namespace = spec.source.namespace
    where = f"{SETTING}.{namespace}"

    def refuse(key: str, message: str, reason: str) -> GroupConfigError:
        return GroupConfigError(spec.source, spec.id, key, message, reason)

    errors = []
    if ANY_POOL not in grant.pools and spec.fabric_pool not in grant.pools:
        errors.append(refuse(g.ANN_FABRIC_POOL,
                             f"pool {spec.fabric_pool} is not one namespace {namespace} may draw from "
                             f"({where}.pools: {', '.join(grant.pools)})", POOL_NOT_ALLOWED))
    if spec.force_detach and not grant.force_detach:
        errors.append(refuse(g.ANN_FORCE_DETACH,
                             f"detaching GPUs in use needs the administrator's {where}.force_detach: true",
                             FORCE_DETACH_NOT_ALLOWED))
    for key, seconds in ((g.ANN_GPU_IDLE_COOLDOWN, spec.gpu_idle_cooldown_seconds),
                         (g.ANN_NODE_IDLE_COOLDOWN, spec.node_idle_cooldown_seconds)):
        if seconds < grant.min_idle_cooldown_seconds:
            errors.append(refuse(key, f"{seconds:g}s is shorter than the {grant.min_idle_cooldown_seconds:g}s "
                                      f"namespace {namespace} may set ({where}.min_idle_cooldown_seconds)",
                                 COOLDOWN_BELOW_FLOOR))
    return tuple(errors)
