"""`dds plan`: what DDS would do with a cluster, and why, without doing any of it.

    dds plan --snapshot examples/snapshot-demo.json
    dds plan --snapshot cluster.yaml --policy spread --json
    dds plan --snapshot cluster.yaml --remove worker-3        # as if CA asked to delete worker-3 (case 3)
    dds plan --kubeconfig ~/.kube/config                       # the live cluster, read-only, with its dds-settings
    dds plan --kubeconfig ~/.kube/config --config dds.yaml     # ... with these settings instead

Prints the scale-up plan (per pending pod: fits now / after N GPUs on a node / needs a node / unschedulable, the score,
the rejected options) and the scale-down plan (idle GPUs to detach, nodes to remove or keep). --json prints both plans
as JSON instead. The snapshot file format is documented in dds/commands/snapshot_file.py. Policy and solver default to
the settings (--config, DDS_POLICY, DDS_BATCH_SOLVER). Exit codes: 0 planned, 2 bad flags or an unreadable snapshot,
3 the cluster cannot be reached or logged in to, 4 it refuses a read (RBAC) or lacks a CRD (dds/commands/failures.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import ValidationError

from dds.config import FabricBackend, Settings
from dds.planner import plan_scale_down, plan_scale_up, render_scale_down, render_scale_up
from dds.planner.batch import SOLVERS
from dds.model.plan import PlannerConfig
from dds.planner.render import plan_to_dict
from dds.planner.scoring import POLICIES
from dds.planner.memos import PlannerMemos
from dds.model.snapshot import Snapshot
from dds.commands.failures import EXIT_USAGE, Failure, cluster_failures, report
from dds.commands.snapshot_file import SnapshotFormatError, load_snapshot

# Where the snapshot comes from. A provider reads the parsed flags and returns a Snapshot, or raises UsageError.
SnapshotProvider = Callable[[argparse.Namespace], Snapshot]


class UsageError(Exception):
    """Bad flags or an unreadable input: reported on stderr, exit code 2."""


def snapshot_from_file(args: argparse.Namespace) -> Snapshot:
    path: Path = args.snapshot
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read snapshot {path}: {exc.strerror or exc}") from exc
    try:
        return load_snapshot(text, str(path))
    except SnapshotFormatError as exc:
        raise UsageError(str(exc)) from exc


def snapshot_from_cluster(args: argparse.Namespace) -> Snapshot:
    """What DDS itself would plan on: the cluster's nodes, pods and MachineSet groups, and the fabric's pools, devices
    and operations in flight, read with the same code (dds/controller/observe.py) from one LIST of each kind, decoded
    as the watch cache decodes them (dds/kube/cache.py). Read-only: every request is a GET (the fabric's state store is
    wrapped so nothing is written back, even where a backend would normally create or advance its state), and nothing
    is planned into action. Idleness is unknown to a one-shot reader (DDS measures it across loops), so no GPU counts
    as idle yet."""
    import time

    from dds.app import cel_limits
    from dds.controller.idle import IdleTracker
    from dds.controller.observe import ClusterObserver
    from dds.kube.cache import cluster_cache
    from dds.kube.controller_ports import KubeClusterReader
    from dds.kube.preflight import check_reachable, connect
    from dds.kube.machinesets import MachineSetLister
    from dds.model.events import LogEventRecorder
    from dds.groups.sources import MachineSetSource
    from dds.groups.catalog import NodeGroupCatalog

    settings = _settings(args)
    api = None
    try:
        with cluster_failures(lambda: api.configuration.host if api is not None else "the apiserver"):
            api = connect(settings.kubeconfig, settings.in_cluster)
            check_reachable(api)
            catalog = NodeGroupCatalog(source=MachineSetSource(MachineSetLister(api, settings.machineset_namespaces),
                                                                settings.node_group_namespaces),
                                       events=LogEventRecorder())
            if not catalog.refresh():
                raise UsageError(f"cannot read the node groups: {catalog.last_error}")
            cache = None
            if settings.watch_cache:  # off: the model-object LISTs DDS used before the cache (the scale benchmark's)
                cache = cluster_cache(api, settings.machineset_namespaces)
                cache.list_once()
            fabric = read_only_fabric(settings, api)
            try:
                observer = ClusterObserver(KubeClusterReader(api, settings.machineset_namespaces, cache), fabric,
                                           catalog.groups, time.time, IdleTracker(), settings.gpu_label, cache=cache,
                                           cel_limits=cel_limits(settings))
                observation = observer.observe()
            finally:
                fabric.close()
    except (UsageError, Failure):
        raise
    except Exception as exc:  # not a cluster problem dds/kube/preflight.py names: a fabric backend unreachable, ...
        raise UsageError(f"cannot read the cluster: {exc}") from exc
    pending = set(observation.unschedulable_since)
    # Only pods the scheduler has found unschedulable are planned for, as DDS does.
    pods = tuple(p for p in observation.snapshot.pods if p.node_name or p.key in pending)
    from dataclasses import replace

    snapshot = replace(observation.snapshot, pods=pods)
    if args.save_snapshot is not None:
        from dds.commands.snapshot_file import dump_snapshot

        args.save_snapshot.write_text(dump_snapshot(snapshot))
    return snapshot


class ReadOnlyStore:
    """A fabric state store that reads the real one and keeps every write in memory: the backend may create or advance
    its state as it always does (a simulated manager with no state yet creates it), and the cluster never sees it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._version = 0

    def describe(self) -> str:
        return f"{self._inner.describe()} (read-only)"

    def load(self) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        return self._inner.load()  # a missing ConfigMap (or namespace) reads as nothing stored

    def save(self, document: dict[str, Any], expected_version: Optional[str]) -> str:
        self._version += 1
        return f"read-only-{self._version}"


def read_only_fabric(settings: Settings, api: Any) -> Any:
    """The settings' fabric backend as DDS would build it, with its state store read-only (see ReadOnlyStore). A store
    that keeps writes is not enough for a backend whose queries drive unfinished operations on a real service: the
    Redfish fabric is built read-only too, so a planned block in its log is never composed by `dds plan`."""
    from dds.config import FabricBackend
    from dds.fabric.factory import REDFISH_LOG_SUFFIX, build_fabric, require_pools
    from dds.fabric.redfish import RedfishFabric
    from dds.fabric.simulated import SimulatedFabric
    from dds.fabric.state_configmap import ConfigMapFabricStateStore

    name = settings.simulated_fabric.state_configmap
    if settings.fabric == FabricBackend.SIMULATED:
        store = ReadOnlyStore(ConfigMapFabricStateStore(api, settings.namespace, name))
        return SimulatedFabric(settings.simulated_fabric, clock=time_now, store=store)
    if settings.fabric == FabricBackend.REDFISH:
        store = ReadOnlyStore(ConfigMapFabricStateStore(api, settings.namespace, name + REDFISH_LOG_SUFFIX))
        return RedfishFabric(settings.redfish, clock=time_now, store=store, pools=require_pools(settings),
                             read_only=True)  # never drives a planned operation: nothing reaches the service
    # composability-request: its state is the ComposabilityRequests themselves, which queries only read.
    return build_fabric(settings, clock=time_now, api_client=api)


def time_now() -> float:
    import time  # imported here like the rest of the live-cluster path: `dds plan --snapshot` needs none of it

    return time.time()


def choose_provider(args: argparse.Namespace) -> SnapshotProvider:
    """The snapshot source the flags ask for: a snapshot file, or the live cluster of a kubeconfig."""
    if args.snapshot is not None:
        return snapshot_from_file
    if args.kubeconfig is not None or args.in_cluster:
        return snapshot_from_cluster
    raise UsageError("give --snapshot FILE (JSON or YAML; see dds/commands/snapshot_file.py) or --kubeconfig FILE")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("plan", help="show what DDS would do with a cluster snapshot, and why",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snapshot", type=Path, metavar="FILE", help="cluster snapshot, .json or .yaml")
    parser.add_argument("--kubeconfig", type=Path, help="plan on this cluster as it is now (read-only)")
    parser.add_argument("--in-cluster", action="store_true", default=None, help="plan on the cluster DDS runs in")
    parser.add_argument("--save-snapshot", type=Path, metavar="FILE",
                        help="with --kubeconfig: also write the snapshot read (to replay with --snapshot)")
    parser.add_argument("--config", type=Path, help="DDS settings file (policy, solver, fabric backend, namespaces); "
                        "default on a live cluster: its ConfigMap dds-system/dds-settings")
    parser.add_argument("--cluster-settings", metavar="NAMESPACE/NAME",
                        help="with --kubeconfig: read the settings from this ConfigMap (key settings.yaml) instead of "
                        "dds-system/dds-settings")
    parser.add_argument("--policy", choices=POLICIES, help="node scoring policy (default: settings, best-fit)")
    parser.add_argument("--solver", choices=SOLVERS, help="batch solver (default: settings, auto)")
    parser.add_argument("--remove", default="", metavar="NODES",
                        help="comma-separated nodes CA asked to delete (case 3)")
    parser.add_argument("--no-new-nodes", action="store_true", help="plan GPUs only (as for case 2)")
    parser.add_argument("--no-node-removal", action="store_true", help="never remove nodes (CA owns removal)")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.set_defaults(func=run)


def refuse_conflicts(args: argparse.Namespace) -> None:
    """Flags that cannot both be meant: refused rather than one silently ignored."""
    from_cluster = args.kubeconfig is not None or bool(args.in_cluster)
    if args.snapshot is not None and from_cluster:
        raise UsageError("--snapshot plans on a file, --kubeconfig/--in-cluster on a live cluster: give one")
    if args.save_snapshot is not None and not from_cluster:
        raise UsageError("--save-snapshot writes what was read from a live cluster: use it with --kubeconfig or "
                         "--in-cluster" + (" (not --snapshot)" if args.snapshot is not None else ""))
    if args.cluster_settings is not None and args.config is not None:
        raise UsageError("--config FILE and --cluster-settings NAMESPACE/NAME both give the settings: give one")
    if args.cluster_settings is not None and not from_cluster:
        raise UsageError("--cluster-settings reads a live cluster's ConfigMap: use it with --kubeconfig or --in-cluster")


def _settings(args: argparse.Namespace) -> Settings:
    """The settings, read once per command: --config FILE, else on a live cluster its own dds-settings ConfigMap (as
    the running DDS reads them), else the defaults; DDS_* variables and flags override them."""
    cached = getattr(args, "resolved_settings", None)
    if cached is not None:
        return cached
    config_text = _cluster_settings(args) if args.config is None else None
    try:
        settings = Settings.load(args.config, config_text=config_text, policy=args.policy, batch_solver=args.solver,
                                 kubeconfig=getattr(args, "kubeconfig", None),
                                 in_cluster=getattr(args, "in_cluster", None))
    except (ValidationError, ValueError, OSError) as exc:
        raise UsageError(f"bad settings: {exc}") from exc
    args.resolved_settings = settings
    return settings


def _cluster_settings(args: argparse.Namespace) -> Optional[tuple[str, str]]:
    """(where, YAML) of the live cluster's settings ConfigMap; None without a live cluster."""
    if getattr(args, "kubeconfig", None) is None and not getattr(args, "in_cluster", None):
        return None
    from dds.kube.preflight import check_reachable, connect
    from dds.kube.settings_source import DEFAULT_SETTINGS_CONFIGMAP, read_settings_yaml

    where = args.cluster_settings or DEFAULT_SETTINGS_CONFIGMAP
    namespace, _, name = where.partition("/")
    if not namespace or not name:
        raise UsageError(f"--cluster-settings {where!r}: expected NAMESPACE/NAME")
    api = None
    try:
        with cluster_failures(lambda: api.configuration.host if api is not None else "the apiserver"):
            api = connect(args.kubeconfig, bool(args.in_cluster))
            check_reachable(api)  # first: a cluster that does not answer is named as such, with its address
            text = read_settings_yaml(api, namespace, name)
    except ValueError as exc:  # the ConfigMap has no settings.yaml
        raise UsageError(str(exc)) from exc
    if text is None:
        raise UsageError(f"the cluster has no ConfigMap {where} with DDS's settings (DDS is not installed there, or "
                         f"elsewhere): pass --config FILE, or --cluster-settings NAMESPACE/NAME")
    return f"ConfigMap {where}", text


def planner_config(args: argparse.Namespace) -> PlannerConfig:
    settings = _settings(args)
    if settings.batch_solver not in SOLVERS:
        raise UsageError(f"batch solver {settings.batch_solver!r} is not one of {', '.join(SOLVERS)}")
    return PlannerConfig(policy=settings.policy, batch_solver=settings.batch_solver,
                         solver_time_budget_seconds=settings.solver_time_budget_seconds,
                         allow_new_nodes=not args.no_new_nodes, node_removal_enabled=not args.no_node_removal,
                         cdi_operator=settings.fabric == FabricBackend.COMPOSABILITY_REQUEST)


PLAN_SCHEMA = "dds.plan/v1"


def plan_document(up: Any, down: Any) -> dict[str, Any]:
    """`dds plan --json` (schema: docs/plan-json.md). `scaleUp`/`scaleDown` are the names before the fields were all
    snake_case, kept as aliases of the same objects for scripts written against them (deprecated)."""
    scale_up, scale_down = plan_to_dict(up), plan_to_dict(down)
    return {"schema": PLAN_SCHEMA, "scale_up": scale_up, "scale_down": scale_down,
            "scaleUp": scale_up, "scaleDown": scale_down}


def run(args: argparse.Namespace, provider: Optional[SnapshotProvider] = None) -> int:
    try:
        refuse_conflicts(args)
        config = planner_config(args)
        snapshot = (provider or choose_provider(args))(args)
    except UsageError as exc:
        return report("plan", Failure(str(exc), exit_code=EXIT_USAGE))
    except Failure as failure:
        return report("plan", failure)
    candidates = [name.strip() for name in args.remove.split(",") if name.strip()]
    memos = PlannerMemos()  # both plans are made on the one snapshot: what the first derives, the second reuses
    up = plan_scale_up(snapshot, config, memos=memos)
    down = plan_scale_down(snapshot, config, candidates or None, memos=memos)
    if args.json:
        json.dump(plan_document(up, down), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_scale_up(up))
        print()
        print(render_scale_down(down))
    return 0
