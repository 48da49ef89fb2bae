"""`dds certs`: mutual-TLS material for DDS and cluster-autoscaler, plus a ready cloud-config.

    dds certs --out ./tls --dns dds.dds-system.svc --ip 127.0.0.1

writes ca.crt/ca.key (the server CA), server.crt/server.key (SANs: every --dns and --ip), client-ca.crt/client-ca.key
(the client CA, DDS's tls_ca: key client-ca.crt of Secret dds-tls), client.crt/client.key (for cluster-autoscaler), cloud-config.yaml and secrets.yaml (the
Secrets `dds-tls` and `cluster-autoscaler-cloud-config` that manifests/ mount; `kubectl apply -f tls/secrets.yaml`).
Keys and secrets.yaml are written 0600. A folder that already holds a CA is refused unless --force (a new CA breaks
every certificate the old one signed); symlinks in it are never followed.

The cloud-config `address` defaults to the first --dns name (else the first --ip) and port 8086; CA checks that host
against the server certificate, so it must be one of the SANs. `--files-dir` is where CA will read the client files:
/config in manifests/ (the Secret's mount point), the output directory otherwise.

Exit codes: 0 when written, 2 for bad flags or a folder that already holds a CA (nothing is written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dds import certs

EXIT_USAGE = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("certs", help="write a CA, server and client certificates and a CA cloud-config",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output directory (created if missing)")
    parser.add_argument("--dns", action="append", default=[], metavar="NAME",
                        help="a DNS SAN of the server certificate (repeatable), e.g. dds.dds-system.svc")
    parser.add_argument("--ip", action="append", default=[], metavar="ADDRESS",
                        help="an IP SAN of the server certificate (repeatable), e.g. 127.0.0.1")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument("--address", help="cloud-config address host:port (default FIRST-SAN:8086)")
    parser.add_argument("--files-dir", help="where cluster-autoscaler reads the client files (default: --out)")
    parser.add_argument("--grpc-timeout", default=certs.DEFAULT_GRPC_TIMEOUT,
                        help=f"cloud-config grpc_timeout, a Go duration (default {certs.DEFAULT_GRPC_TIMEOUT})")
    parser.add_argument("--force", action="store_true",
                        help="replace a CA already in --out (every certificate it signed stops being trusted)")
    parser.add_argument("--namespace", default="dds-system",
                        help="namespace of both Secrets in secrets.yaml (default dds-system)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = _cloud_config_options(args)
        bundle = certs.generate_bundle(args.dns, args.ip, args.days)
    except ValueError as error:
        print(f"dds certs: {error}", file=sys.stderr)
        return EXIT_USAGE
    names = certs.SecretNames(dds_namespace=args.namespace, autoscaler_namespace=args.namespace)
    try:
        written = certs.write_bundle(args.out, bundle, options, names, force=args.force)
    except certs.ExistingCa as error:
        print(f"dds {error}", file=sys.stderr)
        return EXIT_USAGE
    for path in written:
        print(path)
    return 0


def _cloud_config_options(args: argparse.Namespace) -> certs.CloudConfigOptions:
    address = args.address or _default_address(args.dns, args.ip)
    host = _host_of(address)
    if host not in set(args.dns) | set(args.ip):
        raise ValueError(f"--address {address!r}: host {host!r} is not among the server SANs "
                         f"({', '.join(args.dns + args.ip) or 'none'}); cluster-autoscaler would reject the certificate")
    files_dir = args.files_dir or str(args.out.resolve())
    return certs.CloudConfigOptions(address=address, files_dir=files_dir, grpc_timeout=args.grpc_timeout)


def _default_address(dns_names: list[str], ips: list[str]) -> str:
    if dns_names:
        return f"{dns_names[0]}:{certs.DEFAULT_GRPC_PORT}"
    if ips:
        ip = ips[0]
        return f"[{ip}]:{certs.DEFAULT_GRPC_PORT}" if ":" in ip else f"{ip}:{certs.DEFAULT_GRPC_PORT}"
    raise ValueError("give at least one --dns or --ip for the server certificate")


def _host_of(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--address {address!r}: expected host:port")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
