"""Docs that cannot drift from the code: README.md and docs/*.md are read as a user would copy from them.

- A shell block marked runnable (`<!-- runnable -->` on the line before its opening fence) is run from the repository
  root with .venv/bin first on the PATH; its `make` lines are checked to name a Makefile target, not run (they install
  or build).
- Every other shell block and every inline code span is checked: each `dds` subcommand and flag it names exists in the
  command line parser.
- Every repository path the text names exists.
- Every settings file shown (a YAML block of DDS settings) uses only settings the Settings model has, and every
  `DDS_*` variable named is a setting's variable or one of the variables the tools read (docs/configuration.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from pydantic import BaseModel

from dds.cli import build_parser
from dds.config import Settings

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
RUNNABLE = "<!-- runnable -->"


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    text: str
    runnable: bool

    @property
    def id(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> Iterator[Block]:
    lines = document.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^\s*```(\w*)\s*$", lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip().startswith("```"))
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        yield Block(document, index + 1, opening.group(1), "\n".join(lines[index + 1:end]), before == RUNNABLE)
        index = end + 1


ALL_BLOCKS = [b for d in DOCUMENTS for b in blocks(d)]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.language in SHELLS]
RUNNABLE_BLOCKS = [b for b in SHELL_BLOCKS if b.runnable]


def commands(text: str) -> Iterator[str]:
    """The commands of a shell text: continuation lines joined, comments dropped, split at ; && || |."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        line = re.sub(r"(^|\s)#.*$", "", line)  # a comment (a # inside a word, like a URL fragment, stays)
        for part in re.split(r"\s*(?:;|&&|\|\||\|)\s*", line):
            if part.strip():
                yield part.strip()


def words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: read what is there
        return command.split()


# --- dds subcommands and flags ---

def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUBCOMMANDS = _subparsers()
TOP_FLAGS = {"--help", "-h", "--version"}


def dds_invocations(text: str) -> Iterator[list[str]]:
    """The words after `dds` (or .venv/bin/dds, python -m dds) wherever it is the command run."""
    for command in commands(text):
        found = words(command)
        for i, word in enumerate(found):
            if word in ("dds", ".venv/bin/dds") and (i == 0 or found[i - 1] in ("-m", "sudo", "exec", "<(dds")):
                yield found[i + 1:]
                break
            if word == "<(dds":  # source <(dds completion bash)
                yield found[i + 1:]
                break


def problems_of_invocation(rest: list[str]) -> list[str]:
    if not rest or rest[0] in TOP_FLAGS or rest[0].endswith(":"):
        return []  # `dds serve: ...` is a message DDS prints, not a command
    name = rest[0]
    if name.startswith("-") or not re.match(r"^[a-z][a-z-]*$", name):
        return [] if name in TOP_FLAGS else [f"dds {name}: not a subcommand or top-level flag"]
    if name not in SUBCOMMANDS:
        return [f"dds {name}: no such subcommand ({', '.join(SUBCOMMANDS)})"]
    known = {o for a in SUBCOMMANDS[name]._actions for o in a.option_strings}
    out = []
    for word in rest[1:]:
        flag = word.split("=", 1)[0].rstrip(",.)")
        if flag.startswith("--") and len(flag) > 2 and re.match(r"^--[a-z][a-z0-9-]*$", flag) and flag not in known:
            out.append(f"dds {name} {flag}: no such flag")
    return out


INLINE = [(d, m.group(1)) for d in DOCUMENTS for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", d.read_text())
          if re.match(r"^(\.venv/bin/)?dds [a-z-]", m.group(1))]


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if "dds" in b.text], ids=lambda b: b.id)
def test_every_dds_command_in_a_shell_block_exists(block: Block) -> None:
    problems = [p for rest in dds_invocations(block.text) for p in problems_of_invocation(rest)]
    assert not problems, f"{block.id}: {problems}"


@pytest.mark.parametrize("document, code", INLINE, ids=[f"{d.name}:{c[:40]}" for d, c in INLINE])
def test_every_dds_command_in_the_text_exists(document: Path, code: str) -> None:
    rest = words(code.removeprefix(".venv/bin/"))[1:]
    assert not problems_of_invocation(rest), f"{document.name}: `{code}`: {problems_of_invocation(rest)}"


# --- runnable blocks ---

def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_the_readme_opens_with_a_runnable_first_try() -> None:
    assert any(b.document.name == "README.md" for b in RUNNABLE_BLOCKS), "README.md has no runnable block"


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=lambda b: b.id)
def test_runnable_blocks_run(block: Block, tmp_path: Path) -> None:
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands(block.text):
        if command.startswith("make "):
            target = command.split()[1]
            assert target in make_targets(), f"{block.id}: make {target}: no such Makefile target"
            continue
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=environment, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{block.id}: `{command}` exited {done.returncode}:\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, f"{block.id}: `{command}`:\n{done.stderr[-2000:]}"


# --- repository paths ---

TOP = ("dds", "docs", "examples", "manifests", "charts", "hack", "harness", "tests", "protos")
PATH = re.compile(r"(?<![\w./@-])((?:\.\./)?(?:" + "|".join(TOP) + r")/[\w./-]*[\w/])")


def named_paths(document: Path) -> Iterator[tuple[str, str]]:
    text = document.read_text()
    for match in PATH.finditer(text):
        path = match.group(1)
        if path.startswith("../"):
            continue  # beside the repository (../shared/third_party): not part of it
        if re.match(r"[-.]?[<{*]", text[match.end():match.end() + 2]):  # hack/versions-<profile>.env: a pattern
            path += "*"
        yield document.name, path


PATHS = sorted({p for d in DOCUMENTS for p in named_paths(d)})


def exists(path: str) -> bool:
    # A module path may be named without its .py; a Python module path with dots (dds.kube) never matches PATH.
    return (ROOT / path).exists() or (ROOT / f"{path}.py").exists() or bool(list(ROOT.glob(path)))


@pytest.mark.parametrize("document, path", PATHS, ids=[f"{d}:{p}" for d, p in PATHS])
def test_every_path_named_exists(document: str, path: str) -> None:
    assert exists(path), f"{document} names {path}, which does not exist"


# --- settings ---

def setting_paths(model: type[BaseModel] = Settings, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out |= setting_paths(annotation, f"{prefix}{name}.")
    return out


SETTINGS = setting_paths()


def unknown_keys(data: dict[str, Any], model: type[BaseModel] = Settings, prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        key = str(key).replace("-", "_")
        field = model.model_fields.get(key)
        if field is None:
            out.append(prefix + key)
        elif isinstance(value, dict) and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += unknown_keys(value, field.annotation, f"{prefix}{key}.")
    return out


def settings_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """YAML blocks that are DDS settings files: mappings, not Kubernetes objects or node-group files, most of whose
    top-level keys are settings."""
    for block in ALL_BLOCKS:
        if block.language not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError:
            continue
        if not isinstance(data, dict) or {"apiVersion", "kind", "nodeGroups"} & set(data):
            continue
        keys = [str(k).replace("-", "_") for k in data]
        if keys and sum(k in Settings.model_fields for k in keys) * 2 >= len(keys):
            yield block.id, data


SETTINGS_DOCUMENTS = list(settings_documents())


def test_there_are_settings_files_to_check() -> None:
    assert SETTINGS_DOCUMENTS


@pytest.mark.parametrize("where, data", SETTINGS_DOCUMENTS, ids=[w for w, _ in SETTINGS_DOCUMENTS])
def test_every_settings_key_shown_exists(where: str, data: dict[str, Any]) -> None:
    assert not unknown_keys(data), f"{where}: not settings: {unknown_keys(data)}"


def tool_variables() -> set[str]:
    """The DDS_* variables the tools read (hack/, harness/, tests/, the Makefile): not settings, but real."""
    out: set[str] = set()
    files = [ROOT / "Makefile", *(p for top in ("hack", "harness", "tests") for p in (ROOT / top).rglob("*")
                                  if p.is_file() and p.suffix in (".py", ".sh", ".env", ".mk", ""))]
    for path in files:
        try:
            out |= set(re.findall(r"\bDDS_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
        except OSError:
            continue
    return out - {"DDS_"}


TOOL_VARIABLES = tool_variables()


def variable_setting(name: str) -> str:
    return name.removeprefix("DDS_").lower().replace("__", ".")


VARIABLES = sorted({(d.name, v) for d in DOCUMENTS for v in re.findall(r"\bDDS_[A-Z][A-Z0-9_]*[A-Z0-9]\b", d.read_text())})


@pytest.mark.parametrize("document, name", VARIABLES, ids=[f"{d}:{v}" for d, v in VARIABLES])
def test_every_dds_variable_named_is_read(document: str, name: str) -> None:
    setting = variable_setting(name)
    is_setting = setting in SETTINGS or any(s.startswith(setting + ".") for s in SETTINGS)
    assert is_setting or name in TOOL_VARIABLES, f"{document} names {name}: neither a setting nor read by a tool"
