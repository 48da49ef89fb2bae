"""Subcommands of the `dds` CLI: each module has `register(subparsers)` that adds its parser and sets `func`."""
