"""`dds` command line: serve, plan, simulate, certs, check-config, uninstall, completion, version (also `dds --version`).
Exit codes: dds/commands/failures.py (2 for bad flags or files, with a clear message)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

# Each module registers its own subcommand (owned next to the code it drives).
COMMAND_MODULES = ("serve", "plan", "simulate", "certs", "check_config", "uninstall", "completion")


def build_parser() -> argparse.ArgumentParser:
    from dds import __version__

    parser = argparse.ArgumentParser(prog="dds", description="Dynamic Device Scaling for the Kubernetes cluster-autoscaler")
    parser.add_argument("--version", action="version", version=f"dds {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"dds.commands.{name}")
        module.register(sub)
    return parser


def _version(_: argparse.Namespace) -> int:
    from dds import __version__

    print(__version__)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `dds plan | head`: the reader stopped reading, nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return 0
    except KeyboardInterrupt:  # Ctrl-C in a command that runs a while (simulate): no traceback for it
        print(f"dds {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
