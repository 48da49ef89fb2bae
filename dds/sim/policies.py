"""The ways of running a GPU cluster that `dds simulate` compares.

| policy                | GPUs move? | nodes added? | planner policy | starting GPUs per node            |
|-----------------------|------------|--------------|----------------|-----------------------------------|
| `node-only`           | no         | yes (CA)     | spread         | preconfigured; new nodes: group max |
| `best-fit`            | yes (DDS)  | yes          | best-fit       | preconfigured, as fabric devices  |
| `least-demand`        | yes (DDS)  | yes          | least-demand   | preconfigured, as fabric devices  |
| `spread`              | yes (DDS)  | yes          | spread         | preconfigured, as fabric devices  |
| `concentrated`        | yes (DDS)  | yes          | concentrated   | preconfigured, as fabric devices  |
| `static`              | no         | no           | spread         | preconfigured (KubeComp "even")   |
| `static-concentrated` | no         | no           | spread         | packed onto the fewest nodes      |
| `gang-unaware`        | yes (DDS)  | yes          | best-fit       | as best-fit; gangs planned pod by pod |

`node-only` is cluster-autoscaler without DDS: servers carry fixed GPUs and every shortfall adds a server of the group's
template (max GPUs); empty servers are removed after the group's node cooldown. The static baselines are KubeComp's:
GPUs fixed per node and never moved, no nodes added. Pods are bound by the same planner fit logic in every policy (the
planner's FITS_NOW choice); for the fixed-GPU baselines "spread" stands in for kube-scheduler's default LeastAllocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Mapping, Sequence


class Mode(str, Enum):
    DDS = "dds"  # attach-first: the planner attaches GPUs, adds nodes only when attaching cannot help
    NODE_ONLY = "node-only"  # CA alone: every shortfall adds a node; no attach
    STATIC = "static"  # fixed GPUs, fixed nodes


class Layout(str, Enum):
    PRECONFIGURED = "preconfigured"
    CONCENTRATED = "concentrated"


@dataclass(frozen=True)
class Policy:
    name: str
    mode: Mode
    planner_policy: str
    layout: Layout = Layout.PRECONFIGURED
    description: str = ""
    # False: the scale-up planner is not told which pods form gangs (the baseline for gang workloads; the scheduler
    # still starts a gang only whole, as coscheduling does).
    gang_aware: bool = True
    in_all: bool = True  # part of `--policies all` (the gang baseline is added by itself when a trace has gangs)

    @property
    def moves_gpus(self) -> bool:
        return self.mode == Mode.DDS


POLICIES: Mapping[str, Policy] = MappingProxyType({p.name: p for p in (
    Policy("node-only", Mode.NODE_ONLY, "spread", description="cluster-autoscaler alone: add a server per shortfall"),
    Policy("best-fit", Mode.DDS, "best-fit", description="DDS attach-first, best-fit node score"),
    Policy("least-demand", Mode.DDS, "least-demand", description="DDS attach-first, least-demand node score"),
    Policy("spread", Mode.DDS, "spread", description="DDS attach-first, spread GPUs over nodes"),
    Policy("concentrated", Mode.DDS, "concentrated", description="DDS attach-first, pack GPUs on few nodes"),
    Policy("static", Mode.STATIC, "spread", description="fixed preconfigured GPUs per node (KubeComp even)"),
    Policy("static-concentrated", Mode.STATIC, "spread", Layout.CONCENTRATED,
           description="fixed GPUs packed on the fewest nodes (KubeComp concentrated)"),
    Policy("gang-unaware", Mode.DDS, "best-fit", gang_aware=False, in_all=False,
           description="best-fit, planning gang pods one by one (the baseline for gang workloads)"),
)})
GANG_BASELINE = "gang-unaware"


def parse_policies(text: str) -> tuple[Policy, ...]:
    """`all`, or a comma-separated list of policy names (order kept, duplicates dropped)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no policy given; use 'all' or a comma-separated list of: " + ", ".join(POLICIES))
    if names == ["all"]:
        return tuple(p for p in POLICIES.values() if p.in_all)
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise ValueError(f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                         f"known: all, {', '.join(POLICIES)}")
    return tuple(POLICIES[name] for name in dict.fromkeys(names))


def policy_names(policies: Sequence[Policy]) -> tuple[str, ...]:
    return tuple(p.name for p in policies)
