"""The chart as it is published: `helm package` makes the archive, `helm lint --strict` and `helm template` accept the
archive itself; Chart.yaml carries the metadata a chart index shows (home, sources, maintainers, the images its
defaults run); NOTES.txt tells what was installed, how to check it, where the metrics and the Events are."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import Any

import yaml

from tests.integration.chart.tools import CHART, KUBE_VERSION, run, set_args

VALUES = {"fabric.backend": "simulated"}


def chart_yaml() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def package(tmp_path: Path) -> Path:
    result = run("helm", "package", str(CHART), "--destination", str(tmp_path))
    meta = chart_yaml()
    archive = tmp_path / f"{meta['name']}-{meta['version']}.tgz"
    assert archive.is_file(), result.stdout
    return archive


def test_the_packaged_chart_lints_and_renders(tmp_path: Path) -> None:
    archive = package(tmp_path)
    lint = run("helm", "lint", str(archive), "--strict", "--kube-version", KUBE_VERSION, *set_args(VALUES))
    assert "0 chart(s) failed" in lint.stdout, lint.stdout
    rendered = run("helm", "template", "dds", str(archive), "--namespace", "dds-system", "--kube-version",
                   KUBE_VERSION, *set_args(VALUES)).stdout
    assert any(doc and doc["kind"] == "Deployment" for doc in yaml.safe_load_all(rendered))
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames()}
    # What the templates read at render time travels with them.
    assert {"values.schema.json", "files/prometheus-rules.yaml", "files/dashboard.json",
            "templates/NOTES.txt"} <= names


def test_chart_yaml_says_where_the_project_is_and_which_images_its_defaults_run() -> None:
    meta = chart_yaml()
    assert meta["home"].startswith("https://") and meta["sources"] and meta["maintainers"]
    assert meta["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    images = {entry["name"]: entry["image"] for entry in yaml.safe_load(meta["annotations"]["artifacthub.io/images"])}
    autoscaler = values["clusterAutoscaler"]["image"]
    assert images == {"dds": f"{values['image']['repository']}:{meta['appVersion']}",
                      "cluster-autoscaler": f"{autoscaler['repository']}:{autoscaler['tag']}"}


def rendered_notes(tmp_path: Path, values: dict[str, str]) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` renders no NOTES, and `helm install --dry-run` needs a
    cluster: a copy of the chart renders the same text (tpl, the release's context) into a ConfigMap instead."""
    chart = tmp_path / "dds"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        "  notes: {{ tpl (.Files.Get \"files/NOTES.txt\") . | toJson }}\n")
    rendered = run("helm", "template", "dds", str(chart), "--namespace", "dds-system", "--kube-version", KUBE_VERSION,
                   "--show-only", "templates/notes-under-test.yaml", *set_args(values)).stdout
    return str(yaml.safe_load(rendered)["data"]["notes"])


def test_the_notes_say_what_was_installed_how_to_check_it_and_where_metrics_and_events_are(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path, {**VALUES, "serviceMonitor.enabled": "true", "prometheusRule.enabled": "true",
                                      "serviceMonitor.scrapeClass": "sa-token",
                                      "clusterAutoscaler.cloudConfigSecret": "cloud-config"})
    assert "release dds in namespace dds-system" in notes
    assert "Deployment dds" in notes and "Deployment cluster-autoscaler" in notes
    assert "kubectl -n dds-system rollout status deployment/dds" in notes
    assert "kubectl -n dds-system get lease dds-leader" in notes
    assert "dds-metrics-reader" in notes and "scrape class sa-token" in notes
    assert "ServiceMonitor cluster-autoscaler" in notes and "PrometheusRule dds" in notes
    assert "kubectl get events -A --field-selector source=dds" in notes
    assert chart_yaml()["home"] in notes
    plain = rendered_notes(tmp_path / "plain", {**VALUES, "clusterAutoscaler.enabled": "false"})
    assert "cluster-autoscaler" not in plain and "port-forward deployment/dds" in plain
