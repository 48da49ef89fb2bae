"""`dds --version` and `dds completion bash|zsh`: the script completes what the parser has, checked by running it in a
real bash."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dds import __version__
from dds.cli import main


def test_dds_dash_dash_version_prints_the_version(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"dds {__version__}\n"


def script(capsys, shell: str) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def complete(script_text: str, *words: str) -> list[str]:
    """What bash offers after `dds WORDS...` (the last word is the one being completed)."""
    line = " ".join(("dds",) + words)
    program = (f"{script_text}\nCOMP_WORDS=(dds {' '.join(repr(w) for w in words)}); COMP_CWORD={len(words)}; "
               f"COMP_LINE={line!r}; _dds; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_subcommands_flags_and_choices(capsys) -> None:
    text = script(capsys, "bash")
    assert {"serve", "plan", "simulate", "certs", "check-config", "completion"} <= set(complete(text, ""))
    assert complete(text, "pl") == ["plan"]
    assert complete(text, "serve", "--log-f") == ["--log-format"]
    assert complete(text, "serve", "--log-format", "") == ["text", "json"]
    assert complete(text, "plan", "--policy", "s") == ["spread"]
    assert complete(text, "completion", "") == ["bash", "zsh"]


def test_zsh_gets_the_bash_script_through_bashcompinit(capsys) -> None:
    bash, zsh = script(capsys, "bash"), script(capsys, "zsh")
    assert zsh.startswith("#compdef dds\nautoload -U +X bashcompinit && bashcompinit\n") and zsh.endswith(bash)
