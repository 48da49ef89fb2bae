"""`dds serve`: the gRPC endpoint cluster-autoscaler's externalgrpc provider talks to.

Without a cluster (`--node-groups FILE`) DDS serves the file's groups; scale-ups are recorded and reported to CA as
in flight (nothing boots them), which is enough to check a CA setup against DDS:

    dds serve --listen 127.0.0.1:8086 --node-groups examples/node-groups.yaml --insecure

In a cluster (`--kubeconfig FILE` or `--in-cluster`) DDS serves the MachineSets opted in with `dds.cdi.dev/enabled`,
plans GPU attaches before nodes, drives the fabric and the MachineSets, and runs its control loop (dds/app.py):

    dds serve --config dds.yaml --kubeconfig ~/.kube/config

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 1 after losing the leader lease (restart as a standby),
2 for bad flags, settings or files (the kubeconfig included), 3 when the cluster cannot be reached or logged in to
(or --in-cluster outside a pod), 4 when the cluster is not ready for DDS (RBAC denies what it needs, a CRD is
missing). Each ends with one line saying what to do, JSON with --log-format json (dds/commands/failures.py).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import ValidationError

from dds import crashpoints
from dds.commands.failures import (EXIT_USAGE, Failure, cluster_failures, report, requested_log_format,
                                   settings_problems)
from dds.config import Settings
from dds.model.events import LogEventRecorder
from dds.nodes.memory import MemoryProvisioner
from dds.scaling.whole_nodes import AddNodesDecider, RemoveNodesDecider
from dds.scaling.instances import InstanceFactory, InstanceTracker, MemoryStateStore
from dds.provider.registry import Registry, StaticClusterView
from dds.provider.server import ProviderServer, ServerConfigError, build_server, check_tls_material
from dds.groups.sources import FileSource
from dds.groups.catalog import NodeGroupCatalog

log = logging.getLogger("dds.serve")


class UsageError(Exception):
    """Bad flags, settings or files: printed on stderr, exit code 2."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve cluster-autoscaler's externalgrpc CloudProvider API",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="YAML settings file (flags and DDS_* variables override it)")
    parser.add_argument("--listen", help="host:port to listen on (default 0.0.0.0:8086)")
    parser.add_argument("--node-groups", dest="node_groups_file", type=Path,
                        help="serve the node groups of this YAML file, without a cluster")
    parser.add_argument("--kubeconfig", type=Path, help="serve the cluster of this kubeconfig")
    parser.add_argument("--in-cluster", action="store_true", default=None,
                        help="serve the cluster DDS runs in (service account)")
    parser.add_argument("--metrics-listen", help="host:port of /metrics, /healthz, /readyz (default 127.0.0.1:8087; "
                        "any other address needs metrics_secure)")
    parser.add_argument("--leader-election", action="store_true", default=None,
                        help="campaign for the Lease; only the leader acts and answers cluster-autoscaler")
    parser.add_argument("--identity", help="leader-election identity (default: the host name and a random suffix)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext gRPC (no TLS); only for local testing")
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    parser.add_argument("--tls-ca", type=Path, help="CA that client certificates must be signed by (PEM)")
    parser.add_argument("--gpu-label", help="node label carrying the GPU model (default nvidia.com/gpu.product)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument("--log-format", choices=("text", "json"), help="text (default) or json, one object a line")
    parser.set_defaults(func=run)


def load_settings(args: argparse.Namespace) -> Settings:
    flags = {name: getattr(args, name, None) for name in
             ("listen", "node_groups_file", "insecure", "tls_cert", "tls_key", "tls_ca", "gpu_label", "log_level",
              "log_format", "kubeconfig", "in_cluster", "metrics_listen", "leader_election", "identity")}
    try:
        return Settings.load(args.config, **flags)
    except (ValidationError, OSError, ValueError) as exc:  # a bad value; an unreadable or malformed --config
        raise UsageError(settings_problems(exc)) from exc


def _arm_crashpoints() -> None:
    """DDS_CRASH_AT (dds/crashpoints.py, for the reliability campaign): a malformed value is a usage error now."""
    try:
        arming = crashpoints.arm_from_environment()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if arming.armed:
        log.warning("crash points armed (%s): this process SIGKILLs itself at %s", crashpoints.ENV,
                    ", ".join(f"{name} hit {hit}" for name, hit in arming.at_hit.items()))


def _configure_logging(settings: Settings) -> None:
    from dds.logs import configure

    try:
        configure(settings.log_level, settings.log_format)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


@dataclass
class NoClusterParts:
    registry: Registry
    scale_up: AddNodesDecider
    scale_down: RemoveNodesDecider


def no_cluster_parts(settings: Settings) -> NoClusterParts:
    """Groups from the file, no live nodes, instances in memory, nodes remembered only."""
    if settings.node_groups_file is None:
        raise UsageError("no node groups file given (--node-groups)")
    source = FileSource(settings.node_groups_file)
    catalog = NodeGroupCatalog(source=source, events=LogEventRecorder())
    if not catalog.refresh():
        raise UsageError(f"cannot serve node groups: {catalog.last_error}")
    if not catalog.groups():
        log.warning("%s defines no valid node group; serving none", settings.node_groups_file)
    tracker = InstanceTracker(MemoryStateStore())
    provisioner = MemoryProvisioner(clock=time.time)
    scale_up = AddNodesDecider(provisioner, tracker, InstanceFactory(clock=time.time))
    registry = Registry(catalog, StaticClusterView(), tracker, reconcilers=[scale_up.reconcile])
    return NoClusterParts(registry, scale_up, RemoveNodesDecider(provisioner))


def run_until_signalled(start: Callable[[], Any], stop: Callable[[], None],
                        stopped: Optional[threading.Event] = None) -> None:
    """`start()`, then wait for SIGTERM/SIGINT (or `stopped` being set from inside), then `stop()`."""
    stopped = stopped or threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stopped.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        start()
        stopped.wait()
    finally:
        stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_until_signalled(server: ProviderServer, stop: Optional[threading.Event] = None) -> None:
    run_until_signalled(server.start, server.stop, stop)


def run_cluster(settings: Settings, log_format: str = "text") -> int:
    """Check the settings, then the cluster (reachable, credentials, CRDs, RBAC: dds/kube/preflight.py), then build
    and run. A cluster problem met later, while starting, is reported the same way: one line, its exit code."""
    try:
        return _run_cluster(settings)
    except Failure as failure:
        return report("serve", failure, log_format)


def _run_cluster(settings: Settings) -> int:
    from dds.app import build_app
    from dds.config import FabricBackend
    from dds.fabric.factory import require_fabric_choice, require_pools
    from dds.kube.preflight import connect, require_for_serving
    from dds.ops.http import check_metrics_settings

    api = None
    try:
        with cluster_failures(lambda: api.configuration.host if api is not None else "the apiserver"):
            check_metrics_settings(settings)  # settings first: an unprotected /metrics is refused before any request
            if require_fabric_choice(settings) != FabricBackend.SIMULATED:
                require_pools(settings)  # a real fabric's pools are declared, never the simulation's default
            api = connect(settings.kubeconfig, settings.in_cluster)
            require_for_serving(api, settings)
            app = build_app(settings, api=api)
            run_until_signalled(app.start, app.stop, app.stopped)  # app.stopped is also set on losing the lease
    except ValueError as exc:  # bad fabric settings, bad listen address, simulated GPUs on real nodes
        raise Failure(str(exc), exit_code=EXIT_USAGE) from exc
    return app.exit_code


def run(args: argparse.Namespace) -> int:
    log_format = requested_log_format(args)
    try:
        settings = load_settings(args)
        log_format = settings.log_format
        _configure_logging(settings)
        _arm_crashpoints()
        check_tls_material(settings)  # before anything touches the cluster: no plaintext unless asked for
        if settings.node_groups_file is None:
            if settings.kubeconfig is None and not settings.in_cluster:
                raise UsageError("nothing to serve: pass --kubeconfig FILE or --in-cluster (a cluster's MachineSets), "
                                 "or --node-groups FILE (no cluster)")
            return run_cluster(settings, log_format)
        parts = no_cluster_parts(settings)
        server = build_server(settings, parts.registry, parts.scale_up, parts.scale_down)
    except (UsageError, ServerConfigError) as exc:
        return report("serve", Failure(str(exc), exit_code=EXIT_USAGE), log_format)
    except Failure as failure:
        return report("serve", failure, log_format)
    serve_until_signalled(server)
    return 0
