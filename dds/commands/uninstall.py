"""`dds uninstall`: remove what DDS left on the cluster's Nodes, after DDS itself is stopped or deleted.

    dds uninstall --kubeconfig ~/.kube/config          # dry run: lists what it would remove, changes nothing
    dds uninstall --kubeconfig ~/.kube/config --yes    # removes it

On every Node: DDS's finalizer dds.cdi.dev/fabric-devices (a deleted Node would otherwise wait for DDS forever), its
taints, labels and annotations (all under dds.cdi.dev/). Nothing else: GPUs stay attached (the pods use them), the
MachineSets keep their annotations (opt a group out with `kubectl annotate machineset NAME dds.cdi.dev/enabled-`),
and DDS's own objects go with `kubectl delete -k manifests/` or `helm uninstall` (docs/install.md "Uninstall").
With --yes it refuses while DDS's leader Lease is renewed (DDS still runs and would put the marks back): stop DDS first.

Exit codes: 0 listed or removed, 2 bad flags or DDS still running, 3 and 4 as for `dds serve` (dds/commands/failures.py).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from dds.commands.failures import EXIT_USAGE, Failure, cluster_failures, report


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("uninstall", help="remove DDS's finalizer, taints and labels from the Nodes "
                                   "(dry run unless --yes)", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, help="the cluster DDS ran in")
    parser.add_argument("--in-cluster", action="store_true", help="the cluster this pod runs in")
    parser.add_argument("--yes", action="store_true", help="remove them (without it: only list them)")
    parser.add_argument("--namespace", default="dds-system", help="DDS's namespace, for its Lease (default dds-system)")
    parser.add_argument("--lease-name", default="dds-leader", help="DDS's leader Lease (default dds-leader)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except Failure as failure:
        return report("uninstall", failure)


def _run(args: argparse.Namespace) -> int:
    from dds.kube.preflight import check_reachable, connect
    from dds.kube.uninstall import footprints, lease_holder, remove_footprint

    if args.kubeconfig is None and not args.in_cluster:
        raise Failure("no cluster given", "pass --kubeconfig FILE or --in-cluster", EXIT_USAGE)
    api = None
    with cluster_failures(lambda: api.configuration.host if api is not None else "the apiserver"):
        api = connect(args.kubeconfig, args.in_cluster)
        check_reachable(api)
        found = footprints(api)
        holder = lease_holder(api, args.namespace, args.lease_name, datetime.datetime.now(datetime.timezone.utc))
        if not found:
            print("no Node carries anything of DDS's: nothing to remove")
            return 0
        if not args.yes:
            for footprint in found:
                print(footprint.describe())
            still = f" (note: DDS still runs, {holder} holds its Lease: stop it first)" if holder else ""
            print(f"dry run: nothing changed; `dds uninstall ... --yes` removes these from {len(found)} node(s){still}")
            return 0
        if holder:
            raise Failure(f"DDS still runs: {holder} renews the Lease {args.namespace}/{args.lease_name}, and would put "
                          "the marks back", f"stop DDS first (kubectl -n {args.namespace} scale deployment dds "
                          "--replicas=0, or helm uninstall), then run this again", EXIT_USAGE)
        for footprint in found:
            removed = remove_footprint(api, footprint.node)
            print(f"removed from {removed.describe()}" if removed is not None and not removed.empty
                  else f"node {footprint.node}: gone or already clean")
        return 0
