"""hack/gen-manifests.py, which writes manifests/ from the chart (docs/install.md "Chart and manifests"): a hand edit
of a generated file, or a file nothing generates beside them, fails its --check naming the command that fixes it, and
that command restores the file. Run on a copy of manifests/ (tests/integration/chart/test_chart.py checks the real one)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.chart.tools import ROOT, script_module

GENERATOR = ROOT / "hack" / "gen-manifests.py"


@pytest.fixture
def gen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = script_module(GENERATOR, "gen_manifests")
    copy = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", copy)
    monkeypatch.setattr(module, "MANIFESTS", copy)
    return module


def run(gen: ModuleType, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["gen-manifests.py", *args])
    return int(gen.main())


def test_a_hand_edit_fails_the_check_and_make_manifests_undoes_it(gen: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    deployment = gen.MANIFESTS / "dds" / "deployment.yaml"
    generated = deployment.read_text()
    deployment.write_text(generated.replace("replicas: 2", "replicas: 3"))
    assert run(gen, monkeypatch, "--check") == 1
    assert f"{deployment} is not its generator's output: run `make manifests`" in capsys.readouterr().err
    assert run(gen, monkeypatch) == 0
    assert deployment.read_text() == generated
    assert run(gen, monkeypatch, "--check") == 0


def test_a_file_nothing_generates_in_a_generated_directory_is_reported(gen: ModuleType,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    stray = gen.MANIFESTS / "dds" / "extra.yaml"
    stray.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\n")
    assert run(gen, monkeypatch, "--check") == 1
    assert f"{stray}: in a generated directory, not generated" in capsys.readouterr().err


def test_a_generated_file_its_kustomization_does_not_list_is_reported(gen: ModuleType,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    kustomization = gen.MANIFESTS / "dds" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("  - pdb.yaml\n", ""))
    assert run(gen, monkeypatch, "--check") == 1
    assert f"{gen.MANIFESTS / 'dds' / 'pdb.yaml'}: generated, not in its kustomization.yaml's resources" in \
        capsys.readouterr().err
