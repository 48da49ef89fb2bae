"""`dds completion bash|zsh`: a shell completion script for `dds`, made from the command line parser itself (so it
completes exactly the subcommands, flags and choices this version has).

    source <(dds completion bash)                       # this shell; add the line to ~/.bashrc to keep it
    dds completion zsh > "${fpath[1]}/_dds"             # zsh (or: source <(dds completion zsh) in ~/.zshrc)

zsh runs the bash script through its bashcompinit layer. Exit codes: 0 printed, 2 bad flags.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

SHELLS = ("bash", "zsh")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("completion", help="print a shell completion script (bash, zsh)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    # The subcommands registered with it, complete once the parser is built (this one may not be the last).
    parser.set_defaults(func=lambda args: run(args, subparsers))


def run(args: argparse.Namespace, subparsers: Any) -> int:
    script = bash_script(dict(subparsers.choices))
    if args.shell == "zsh":
        script = "#compdef dds\nautoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, end="")
    return 0


def _flags(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    """Every option string, and the choices of those that take one of a fixed set."""
    flags, choices = [], {}
    for action in parser._actions:
        flags += [o for o in action.option_strings if o.startswith("--")]
        if action.option_strings and action.choices:
            for option in action.option_strings:
                choices[option] = [str(c) for c in action.choices]
    return flags, choices


TOP_FLAGS = ("--help", "--version")


def bash_script(commands: dict[str, argparse.ArgumentParser]) -> str:
    top_flags = list(TOP_FLAGS)
    cases, choice_cases = [], []
    for name, sub in commands.items():
        flags, choices = _flags(sub)
        positional = [str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices]
        cases.append(f"    {name}) opts={shlex.quote(' '.join(flags))}; words_={shlex.quote(' '.join(positional))} ;;")
        for option, values in choices.items():
            choice_cases.append(f"    {name}:{option}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(values))} "
                                f"-- \"$cur\")); return ;;")
    return f"""# dds shell completion (`dds completion bash`), generated from dds's own parser.
_dds() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd="${{COMP_WORDS[1]}}"
  local opts="" words_=""
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W {shlex.quote(' '.join([*commands, *top_flags]))} -- "$cur")); return
  fi
  case "$cmd:$prev" in
{chr(10).join(choice_cases)}
  esac
  case "$cmd" in
{chr(10).join(cases)}
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  elif [[ -n "$words_" ]]; then
    COMPREPLY=($(compgen -W "$words_" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}}
complete -o default -F _dds dds
"""
