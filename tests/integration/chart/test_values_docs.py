"""docs/install.md's table of the chart's values is hack/gen-values-docs.py's output: made from values.schema.json
(each value's description and type) and values.yaml (its default), so it lists exactly the values the chart accepts."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.integration.chart.tools import CHART, ROOT, script_module

GENERATOR = ROOT / "hack" / "gen-values-docs.py"


def generator() -> ModuleType:
    return script_module(GENERATOR, "gen_values_docs")


def test_the_values_table_of_the_install_guide_is_the_generators_output() -> None:
    result = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def value_paths(node: Any, path: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return set().union(*(value_paths(child, f"{path}.{key}" if path else key) for key, child in node.items()))
    return {path}


def test_every_value_of_values_yaml_has_a_row() -> None:
    gen = generator()
    documented = {row.path for row in gen.rows(gen.json.loads(gen.SCHEMA.read_text()), {})}
    for path in value_paths(yaml.safe_load((CHART / "values.yaml").read_text())):
        assert any(path == row or path.startswith(f"{row}.") for row in documented), f"{path}: no row"


def test_a_value_without_a_description_stops_the_generator() -> None:
    gen = generator()
    schema = {"type": "object", "properties": {"documented": {"type": "string", "description": "a value"},
                                               "forgotten": {"type": "boolean"}}}
    with pytest.raises(gen.UndocumentedValue, match="forgotten"):
        gen.rows(schema, {"documented": "x", "forgotten": False})
