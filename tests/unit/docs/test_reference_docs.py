"""The README and docs/ as a user reads them: every setting, annotation, flag and metric the code has is documented,
the annotation table is the one dds/groups/schema.py holds, and every relative link and anchor resolves.

These fail when code grows a setting, flag or metric that nobody wrote down, or when a doc links to a heading that
was renamed.
"""

from __future__ import annotations

import argparse
import re
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Optional, get_args, get_origin

import pytest
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel

from dds import metrics
from dds.cli import build_parser
from dds.config import Settings
from dds.model import groups
from dds.groups import schema

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
OPERATIONS = ROOT / "docs" / "operations.md"
RELIABILITY = ROOT / "docs" / "reliability.md"
LINKED_DOCS = (README, CONFIGURATION, OPERATIONS, RELIABILITY)


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --- settings ---

def _model_of(annotation: Any) -> Optional[type[BaseModel]]:
    candidates = (annotation, *get_args(annotation))
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def setting_leaves(defaults: BaseModel, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path, env var, default) for every scalar setting, walking the default values (a section's own defaults
    may differ from its model's: detach_latency is a LatencySpec with other numbers); a list of models (pools) counts
    as one setting."""
    for name, field in type(defaults).model_fields.items():
        if field.exclude:
            continue  # config_file: the --config argument, not a setting
        path = f"{prefix}{name}"
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            yield from setting_leaves(value, f"{path}.")
        else:
            yield path, "DDS_" + path.replace(".", "__").upper(), value


def section_of(path: str) -> tuple[str, str]:
    """("simulated_fabric", "faults.seed") for "simulated_fabric.faults.seed"; ("", "listen") at the top level."""
    head, _, rest = path.partition(".")
    return (head, rest) if rest else ("", head)


def table_row(document: str, heading: str, key: str) -> str:
    section = document[document.index(heading):]
    following = re.search(r"\n#{1,3} ", section[len(heading):])
    section = section[:len(heading) + following.start()] if following else section
    rows = [line for line in section.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(rows) == 1, f"docs/configuration.md, {heading}: expected one row for `{key}`, found {len(rows)}"
    return rows[0]


def shown_default(default: Any) -> Optional[str]:
    """How a scalar default is written in the tables; None when the row words it (none, computed, a list)."""
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, Enum):
        return f"`{default.value}`"
    if isinstance(default, (int, float, str)):
        return f"`{default}`" if default != "" else '`""`'
    if default == []:
        return "`[]`"
    return None


LEAVES = sorted(setting_leaves(Settings.model_construct()))


@pytest.mark.parametrize("path, env, default", LEAVES, ids=[leaf[0] for leaf in LEAVES])
def test_every_setting_has_a_row_with_its_env_var_and_default(path: str, env: str, default: Any) -> None:
    section, key = section_of(path)
    heading = f"### `{section}`" if section else "### Top level"
    row = table_row(text(CONFIGURATION), heading, key)
    assert f"`{env}`" in row, f"the row of {path} does not name {env}: {row}"
    expected = shown_default(default)
    if expected is not None:
        assert expected in row, f"the row of {path} does not show its default {expected}: {row}"


def test_every_nested_section_is_listed_at_the_top_level() -> None:
    for name, field in Settings.model_fields.items():
        if _model_of(field.annotation) is not None and get_origin(field.annotation) is not list:
            row = table_row(text(CONFIGURATION), "### Top level", name)
            assert f"`DDS_{name.upper()}__*`" in row


# --- annotations ---

def test_the_annotation_table_is_the_one_in_schema_py() -> None:
    table = [line for line in (schema.__doc__ or "").splitlines() if line.startswith("|")]
    assert len(table) > 10
    documented = text(CONFIGURATION)
    assert "\n".join(table) in documented, "docs/configuration.md must carry dds/groups/schema.py's table unchanged"


def annotation_keys() -> list[str]:
    keys = [value for name, value in vars(groups).items() if name.startswith("ANN_") and not name.endswith("_PREFIX")]
    keys += [value for name, value in vars(schema).items() if name.startswith("CAP_") and isinstance(value, str)]
    return sorted(set(keys))


@pytest.mark.parametrize("key", annotation_keys())
def test_every_annotation_key_is_explained(key: str) -> None:
    assert f"`{key}`" in text(CONFIGURATION)


@pytest.mark.parametrize("option", sorted(v.removeprefix(groups.ANN_OPTIONS_PREFIX) for k, v in vars(schema).items()
                                          if k.startswith("OPT_")))
def test_every_autoscaling_option_is_explained(option: str) -> None:
    assert f"| `{option}` |" in text(CONFIGURATION)


# --- commands ---

def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


FLAGS = sorted((command, flag) for command, sub in subcommands().items() if command != "version"
               for action in sub._actions for flag in action.option_strings if flag not in ("-h", "--help"))


@pytest.mark.parametrize("command, flag", FLAGS, ids=[f"{c} {f}" for c, f in FLAGS])
def test_every_flag_is_in_its_command_section(command: str, flag: str) -> None:
    document = text(CONFIGURATION)
    heading = f"### `dds {command}`"
    section = document[document.index(heading):]
    following = re.search(r"\n#{1,3} ", section[len(heading):])
    section = section[:len(heading) + following.start()] if following else section
    assert re.search(rf"`{re.escape(flag)}[ `]", section), f"{flag} is not documented under {heading}"


# --- metrics ---

def exported_names() -> list[str]:
    names = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            names.append(value._name + ("_total" if value._type == "counter" else ""))
    return sorted(names)


@pytest.mark.parametrize("name", exported_names())
@pytest.mark.parametrize("document", [README, OPERATIONS], ids=["README", "operations"])
def test_every_metric_is_listed(document: Path, name: str) -> None:
    assert f"| `{name}`" in text(document) or f"/ `{name}` |" in text(document), f"{name} missing in {document.name}"


# --- links ---

def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    cleaned = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return cleaned.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in text(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


LINKS = sorted({(doc.name, target) for doc in LINKED_DOCS
                for target in re.findall(r"\]\(([^)\s]+)\)", text(doc)) if not re.match(r"[a-z]+:", target)})


@pytest.mark.parametrize("document, target", LINKS, ids=[f"{d}->{t}" for d, t in LINKS])
def test_relative_links_and_anchors_resolve(document: str, target: str) -> None:
    source = next(doc for doc in LINKED_DOCS if doc.name == document)
    file_part, _, anchor = target.partition("#")
    linked = (source.parent / file_part).resolve() if file_part else source
    assert linked.exists(), f"{document} links to {target}: {linked} does not exist"
    if anchor:
        assert anchor in anchors(linked), f"{document} links to {target}: no such heading in {linked.name}"


@pytest.mark.parametrize("document", [README, OPERATIONS], ids=["README", "operations"])
def test_no_metric_is_listed_that_dds_does_not_export(document: Path) -> None:
    listed = set(re.findall(r"^\| `(dds_[a-z_]+)`", text(document), re.MULTILINE))
    listed |= set(re.findall(r"/ `(dds_[a-z_]+)` \|", text(document)))
    assert listed, f"no metrics table in {document.name}"
    assert listed <= set(exported_names()), f"{document.name} lists metrics DDS does not export: " \
                                             f"{sorted(listed - set(exported_names()))}"


def labels_column(document: Path, name: str) -> set[str]:
    """The labels a metrics table row of `document` gives `name`: the `labels` column's backticked names, less what
    parentheses say about their values."""
    lines = text(document).splitlines()
    index = next((i for i, line in enumerate(lines) if line.startswith("|")
                  and (f"| `{name}`" in line or f"/ `{name}` |" in line)), None)
    assert index is not None, f"{name} missing in {document.name}"
    header = next(lines[i] for i in range(index, -1, -1) if not lines[i - 1].startswith("|"))
    column = [c.strip() for c in header.split("|")].index("labels")
    cell = lines[index].split("|")[column]
    while re.search(r"\([^()]*\)", cell):
        cell = re.sub(r"\([^()]*\)", "", cell)
    return set(re.findall(r"`([a-z_]+)`", cell))


@pytest.mark.parametrize("name", exported_names())
@pytest.mark.parametrize("document", [README, OPERATIONS], ids=["README", "operations"])
def test_every_metric_row_names_its_labels(document: Path, name: str) -> None:
    metric = next(v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)
                  and v._name + ("_total" if v._type == "counter" else "") == name)
    assert labels_column(document, name) == set(metric._labelnames), f"{name} in {document.name}"
