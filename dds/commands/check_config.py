"""`dds check-config`: is this setup ready for `dds serve`? Everything it can check before a start, and how to fix
what is wrong.

    dds check-config --config dds.yaml                              # the settings, TLS files, node-groups file
    dds check-config --config dds.yaml --kubeconfig ~/.kube/config  # and the cluster
    dds check-config --kubeconfig ~/.kube/config                    # with the cluster's own dds-settings ConfigMap

Without a cluster: the settings (file, DDS_* variables), the fabric choice, the metrics endpoint's protection, the TLS
files (they belong together) and their certificates' expiry, and a --node-groups file. With a cluster also: the
apiserver answers and accepts the credentials, the CRDs DDS reads are served (Cluster API's; the CDI operator's with
fabric composability-request), RBAC allows what DDS will do (SelfSubjectAccessReviews: as the kubeconfig's user, so
run it with DDS's ServiceAccount credentials, or --in-cluster from DDS's pod, to check DDS's own RBAC), the opted-in
MachineSets' annotations, and the fabric answers (its pools, read-only).

Exit codes: 0 nothing wrong (warnings allowed), 2 a settings or file problem, 3 the cluster cannot be reached or
logged in to, 4 the cluster is not ready for DDS (the worst problem found decides).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import ValidationError

from dds.commands.failures import (EXIT_CLUSTER_NOT_READY, EXIT_NO_CLUSTER, EXIT_OK, EXIT_USAGE, Failure,
                                   cluster_failures, invalid_settings, settings_problems)
from dds.config import Settings

CERTIFICATE_WARNING_DAYS = 30

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    area: str  # settings, tls, node-groups, cluster, crds, rbac, machinesets, fabric
    level: str  # ok, warn, fail
    message: str
    fix: str = ""
    exit_code: int = EXIT_OK  # what a failure makes the command exit with


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("check-config", help="check settings, certificates and (with a kubeconfig) the "
                                   "cluster before `dds serve`, and say how to fix what is wrong",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="YAML settings file (default with a cluster: its dds-settings)")
    parser.add_argument("--kubeconfig", type=Path, help="also check the cluster of this kubeconfig")
    parser.add_argument("--in-cluster", action="store_true", default=None,
                        help="also check the cluster this pod runs in, as its ServiceAccount")
    parser.add_argument("--cluster-settings", metavar="NAMESPACE/NAME",
                        help="with a cluster and no --config: the settings ConfigMap (default dds-system/dds-settings)")
    parser.add_argument("--node-groups", dest="node_groups_file", type=Path, help="also check this node-groups file")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    findings = check(args, now=time.time())
    if args.json:
        json.dump({"findings": [asdict(f) for f in findings], "exit_code": exit_code(findings)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(findings))
    return exit_code(findings)


def exit_code(findings: list[Finding]) -> int:
    """The first failure's kind decides: settings before the cluster (a cluster check on wrong settings is moot)."""
    codes = [f.exit_code for f in findings if f.level == FAIL]
    for code in (EXIT_USAGE, EXIT_NO_CLUSTER, EXIT_CLUSTER_NOT_READY):
        if code in codes:
            return code
    return EXIT_OK


def render(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{f.level.upper():<5} {f.area}: {f.message}")
        if f.fix and f.level != OK:
            lines.append(f"      to fix: {f.fix}")
    failed = sum(f.level == FAIL for f in findings)
    warned = sum(f.level == WARN for f in findings)
    lines.append(f"{failed} problem(s), {warned} warning(s)" if failed or warned else "no problem found")
    return "\n".join(lines)


def check(args: argparse.Namespace, now: float) -> list[Finding]:
    from dds.commands.plan import UsageError, _cluster_settings

    on_cluster = args.kubeconfig is not None or bool(args.in_cluster)
    try:
        config_text = _cluster_settings(args) if on_cluster and args.config is None else None
        settings = Settings.load(args.config, config_text=config_text, kubeconfig=args.kubeconfig,
                                 in_cluster=args.in_cluster, node_groups_file=args.node_groups_file)
    except ValidationError as exc:
        return [Finding("settings", FAIL, problem, "see docs/configuration.md for the setting", EXIT_USAGE)
                for problem in invalid_settings(exc)]
    except UsageError as exc:
        return [Finding("settings", FAIL, str(exc), "pass a readable YAML settings file with --config", EXIT_USAGE)]
    except (OSError, ValueError) as exc:
        return [Finding("settings", FAIL, settings_problems(exc), "pass a readable YAML settings file with --config, "
                        "and check the DDS_* variables", EXIT_USAGE)]
    except Failure as failure:
        return [Finding("cluster", FAIL, failure.message, failure.fix, failure.exit_code)]
    where = config_text[0] if config_text else (str(args.config) if args.config else "defaults and DDS_* variables")
    findings = [Finding("settings", OK, f"read from {where}")]
    findings += check_settings(settings)
    findings += check_certificates(settings, now)
    if settings.node_groups_file is not None:
        findings += check_node_groups_file(settings.node_groups_file)
    if on_cluster:
        findings += check_cluster(settings)
    return findings


def check_settings(settings: Settings) -> list[Finding]:
    from dds.fabric.factory import require_fabric_choice
    from dds.ops.http import check_metrics_settings

    out = []
    for name, check_one in (("fabric", require_fabric_choice), ("metrics", check_metrics_settings)):
        try:
            check_one(settings)
        except ValueError as exc:
            out.append(Finding("settings", FAIL, str(exc), "set it in the settings file (docs/configuration.md)",
                               EXIT_USAGE))
        else:
            if name == "fabric":
                out.append(Finding("settings", OK, f"fabric {settings.fabric.value}"))
                out += check_pools(settings)
    return out


def check_pools(settings: Settings) -> list[Finding]:
    from dds.fabric.factory import require_pools

    if settings.fabric is None or settings.fabric.value == "simulated":
        return []
    try:
        pools = require_pools(settings)
    except ValueError as exc:
        return [Finding("settings", FAIL, str(exc), "declare them in the settings file (docs/install.md)", EXIT_USAGE)]
    return [Finding("settings", OK, "pools: " + ", ".join(
        f"{p.name} ({', '.join(f'{n} {m}' for m, n in p.devices.items())})" for p in pools))]


def check_certificates(settings: Settings, now: float) -> list[Finding]:
    from cryptography import x509

    from dds.provider.server import ServerConfigError, load_tls_material

    if settings.insecure:
        return [Finding("tls", WARN, "insecure: plaintext gRPC, any caller may scale the cluster",
                        "for anything but a local test, make certificates with `dds certs` and set tls_cert, tls_key, "
                        "tls_ca")]
    try:
        load_tls_material(settings)
    except ServerConfigError as exc:
        return [Finding("tls", FAIL, str(exc), "`dds certs --out DIR --dns NAME` writes a matching set", EXIT_USAGE)]
    out = []
    for name, path in (("tls_cert", settings.tls_cert), ("tls_ca", settings.tls_ca)):
        for certificate in x509.load_pem_x509_certificates(Path(path).read_bytes()):
            out.append(_expiry(name, Path(path), certificate.not_valid_after_utc.timestamp(), now))
    return out


def _expiry(name: str, path: Path, not_after: float, now: float) -> Finding:
    days = (not_after - now) / 86400
    ends = time.strftime("%Y-%m-%d", time.gmtime(not_after))
    renew = "renew it (`dds certs`, or your issuer) and update the Secret; DDS re-reads it without a restart"
    if days < 0:
        return Finding("tls", FAIL, f"{name} {path} expired on {ends}", renew, EXIT_USAGE)
    if days < CERTIFICATE_WARNING_DAYS:
        return Finding("tls", WARN, f"{name} {path} expires on {ends}, in {days:.0f} day(s)", renew)
    return Finding("tls", OK, f"{name} {path} valid until {ends}")


def check_node_groups_file(path: Path) -> list[Finding]:
    from dds.groups.catalog import NodeGroupCatalog
    from dds.groups.sources import FileSource

    events = CollectedEvents()
    catalog = NodeGroupCatalog(source=FileSource(path), events=events)
    if not catalog.refresh():
        return [Finding("node-groups", FAIL, f"{path}: {catalog.last_error}", "fix the file (examples/node-groups.yaml "
                        "is a valid one)", EXIT_USAGE)]
    out = [Finding("node-groups", FAIL, f"{target}: {message}", "fix the entry (docs/configuration.md)", EXIT_USAGE)
           for target, message in events.invalid]
    out.append(Finding("node-groups", OK if catalog.groups() else WARN,
                       f"{path}: {len(catalog.groups())} group(s) served"))
    return out


class CollectedEvents:
    """The catalog's InvalidNodeGroup Events, kept to be printed rather than written to a cluster."""

    def __init__(self) -> None:
        self.invalid: list[tuple[str, str]] = []

    def emit(self, involved: Any, event_type: str, reason: str, message: str) -> None:
        if reason == "InvalidNodeGroup":
            self.invalid.append((involved.describe(), message))


def check_cluster(settings: Settings) -> list[Finding]:
    from dds.kube.preflight import (check_reachable, connect, crds_problem, denied, missing_kinds, needed_access,
                                    needed_kinds, permission_problem)

    try:
        with cluster_failures():
            api = connect(settings.kubeconfig, settings.in_cluster)
            check_reachable(api)
    except Failure as failure:
        return [Finding("cluster", FAIL, failure.message, failure.fix, failure.exit_code)]
    out = [Finding("cluster", OK, f"{api.configuration.host} answers and accepts the credentials")]
    steps: tuple[tuple[str, Callable[[], list[Finding]]], ...] = (
        ("crds", lambda: _problem_or_ok("crds", missing_kinds(api, needed_kinds(settings)),
                                        lambda missing: crds_problem(api, missing),
                                        "the CRDs DDS reads are served")),
        ("rbac", lambda: _problem_or_ok("rbac", denied(api, needed_access(settings)),
                                        lambda refused: permission_problem(refused, "the kubeconfig's user"),
                                        f"the kubeconfig's user may do all DDS does with these settings "
                                        f"({len(needed_access(settings))} requests checked)")),
        ("machinesets", lambda: check_machinesets(api, settings)),
        ("fabric", lambda: check_fabric(api, settings)),
    )
    for area, step in steps:
        try:
            with cluster_failures(lambda: api.configuration.host):
                out += step()
        except Failure as failure:
            out.append(Finding(area, FAIL, failure.message, failure.fix, failure.exit_code))
    return out


def _problem_or_ok(area: str, missing: list, problem_of: Callable[[list], Any], ok: str) -> list[Finding]:
    if not missing:
        return [Finding(area, OK, ok)]
    failure = Failure.of(problem_of(missing))
    return [Finding(area, FAIL, failure.message, failure.fix, failure.exit_code)]


def check_machinesets(api: Any, settings: Settings) -> list[Finding]:
    from dds.groups.catalog import NodeGroupCatalog
    from dds.groups.sources import MachineSetSource
    from dds.kube.machinesets import MachineSetLister

    events = CollectedEvents()
    catalog = NodeGroupCatalog(source=MachineSetSource(MachineSetLister(api, settings.machineset_namespaces),
                                                       settings.node_group_namespaces),
                               events=events)
    if not catalog.refresh():
        return [Finding("machinesets", FAIL, f"cannot read the MachineSets: {catalog.last_error}",
                        "check the Cluster API CRDs and RBAC above", EXIT_CLUSTER_NOT_READY)]
    out = [Finding("machinesets", FAIL, f"{target} is not served: {message}",
                   "fix its dds.cdi.dev/* annotations (docs/configuration.md \"Node group annotations\")", EXIT_CLUSTER_NOT_READY)
           for target, message in events.invalid]
    groups = catalog.groups()
    if groups:
        out.append(Finding("machinesets", OK, f"{len(groups)} node group(s) served: "
                           f"{', '.join(g.id for g in groups[:10])}{' ...' if len(groups) > 10 else ''}"))
    elif not events.invalid:
        out.append(Finding("machinesets", WARN, "no MachineSet is opted in: DDS would serve no node group",
                           "kubectl annotate machineset NAME -n NAMESPACE dds.cdi.dev/enabled=true (docs/install.md)"))
    return out


def check_fabric(api: Any, settings: Settings) -> list[Finding]:
    """The fabric answers: its pools, read as `dds plan` reads them (nothing written, nothing composed)."""
    from dds.commands.plan import read_only_fabric

    if settings.fabric is None:
        return []  # already a settings failure
    try:
        fabric = read_only_fabric(settings, api)
        try:
            pools = fabric.pools()
        finally:
            fabric.close()
    except Exception as exc:  # a fabric backend's failure, whatever it is, is what this check reports
        return [Finding("fabric", FAIL, f"fabric {settings.fabric.value} does not answer: {exc}",
                        "check the backend's settings section (docs/configuration.md) and that it is reachable from "
                        "here", EXIT_CLUSTER_NOT_READY)]
    described = ", ".join(f"{p.name} ({sum(p.free.values())} free)" for p in pools) or "none"
    level = OK if pools else WARN
    return [Finding("fabric", level, f"fabric {settings.fabric.value} answers; pools: {described}",
                    "" if pools else "declare the pools in the backend's section (docs/install.md)")]
