"""The snapshot file format, `dds plan`, and the benchmark's smoke ladder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dds.cli import main
from dds.commands.snapshot_file import SnapshotFormatError, dump_snapshot, load_snapshot
from tests.bench import planner as bench
from tests.unit.planner.builders import demo_snapshot, make_node, make_pod, make_snapshot, same_host, term

DEMO = Path(__file__).resolve().parents[3] / "examples" / "snapshot-demo.json"


def test_dump_then_load_gives_the_same_snapshot() -> None:
    snapshot = make_snapshot([make_node("w1", gpus=2, detaching=["w1-gpu-1"], gpus_idle_since=5.0)],
                             [make_pod("p", gpus=1, affinity=[term("zone", "In", "a")], ports=[80],
                                       anti_affinity=[same_host(app="p")]), make_pod("b", node="w1")],
                             upcoming={"gpu": 2})
    loaded = load_snapshot(dump_snapshot(snapshot), "s.json")
    assert (loaded.nodes, loaded.pods, loaded.pools, loaded.now, dict(loaded.upcoming_nodes)) == \
        (snapshot.nodes, snapshot.pods, snapshot.pools, snapshot.now, dict(snapshot.upcoming_nodes))
    original, again = snapshot.groups[0], loaded.groups[0]
    assert again.model_copy(update={"source": original.source}) == original


@pytest.mark.parametrize("document, message", [
    pytest.param({"nodes": [{"name": "n", "allocatable": {"cpu": "lots"}}]}, "nodes[0].allocatable.cpu",
                 id="bad-quantity"),
    pytest.param({"pods": [{"name": "p", "nodeAffinity": [{"matchExpressions": [
        {"key": "zone", "operator": "Near"}]}]}]}, "pods[0].nodeAffinity[0].matchExpressions[0].operator",
                 id="bad-operator"),
    pytest.param({"nodes": [{"name": "n", "taints": [{"key": "k", "effect": "Sometimes"}]}]},
                 "nodes[0].taints[0].effect", id="bad-taint-effect"),
    pytest.param({"pods": [{"name": "p", "node": "ghost"}]}, "pods[0].node: 'ghost'", id="unknown-node"),
    pytest.param({"nodes": [{"name": "n", "group": "nope"}]}, "nodes[0].group", id="unknown-group"),
    pytest.param({"pods": [{"name": "p", "priorty": 5}]}, "unknown key(s) 'priorty'", id="typo-key"),
    pytest.param({"groups": [{"id": "g", "minSize": 3, "maxSize": 1, "cpu": "8", "memory": "1Gi",
                              "maxGpusPerNode": 4}]}, "groups[0]", id="group-validation"),
    pytest.param({"pods": [{"namespace": "x"}]}, "pods[0].name: required", id="missing-name"),
])
def test_bad_snapshots_name_the_field(document, message) -> None:
    with pytest.raises(SnapshotFormatError) as error:
        load_snapshot(json.dumps(document), "bad.json")
    assert message in str(error.value)
    assert str(error.value).startswith("bad.json: ")


def test_yaml_snapshots_are_read() -> None:
    snapshot = load_snapshot("now: 5\nnodes:\n  - name: n\n    allocatable: {cpu: '2', memory: 1Gi}\n", "s.yaml")
    assert snapshot.nodes[0].allocatable.milli_cpu == 2000


def test_dds_plan_explains_the_demo(capsys) -> None:
    assert main(["plan", "--snapshot", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert "pod demo/gpu-pending: fits-after-gpus: fits on worker-1 after 1 A30 GPU" in out
    assert "attach 1 A30 GPU from pool cdi-pool to worker-1" in out
    assert "scale-down plan:" in out


def test_dds_plan_json(capsys) -> None:
    assert main(["plan", "--snapshot", str(DEMO), "--json", "--policy", "spread"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scale_up"]["policy"] == "spread"
    assert data["scale_up"]["decisions"][0]["verdict"] == "fits-after-gpus"
    assert data["scale_up"]["gpus"] == 1 and data["scale_down"]["removals"] == []



def test_plan_text_says_which_way_scores_go_and_shows_units(capsys) -> None:
    assert main(["plan", "--snapshot", str(DEMO)]) == 0
    assert "(score: best-fit's score of a placement; the higher score wins)" in capsys.readouterr().out


def test_dds_plan_case3_candidate(capsys) -> None:
    assert main(["plan", "--snapshot", str(DEMO), "--remove", "worker-2"]) == 0
    assert "keep worker-2: CA asked to remove it; it stays: pod demo/gpu-busy-2 fits no other node" in \
        capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    pytest.param([], "give --snapshot FILE", id="no-snapshot"),
    pytest.param(["--snapshot", "/nonexistent/s.json"], "cannot read snapshot", id="missing-file"),
])
def test_dds_plan_usage_errors(args, message, capsys) -> None:
    assert main(["plan", *args]) == 2
    assert message in capsys.readouterr().err


def test_dds_plan_takes_a_snapshot_provider(capsys) -> None:
    from dds.commands import plan as command
    from dds.cli import build_parser

    args = build_parser().parse_args(["plan"])
    assert command.run(args, provider=lambda _: demo_snapshot()) == 0
    assert "default/train" in capsys.readouterr().out


def test_example_is_the_talks_demo() -> None:
    snapshot = load_snapshot(DEMO.read_text(), str(DEMO))
    assert [len(n.devices) for n in snapshot.nodes] == [1, 1]
    assert snapshot.pools[0].free == {"A30": 6}
    assert [p.name for p in snapshot.pending_pods()] == ["gpu-pending"]


def test_benchmark_quick_ladder(capsys) -> None:
    assert bench.main(["--quick"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("bench ")]
    assert len(lines) == len(bench.CASES) * len(bench.QUICK_NODES) * len(bench.QUICK_PENDING)
    assert all("p50_ms=" in line and "p99_ms=" in line and "naive_ratio=" in line for line in lines)


@pytest.mark.parametrize("args, message", [
    pytest.param(["--snapshot", str(DEMO), "--kubeconfig", "k"], "--snapshot plans on a file", id="snapshot+kubeconfig"),
    pytest.param(["--snapshot", str(DEMO), "--in-cluster"], "--snapshot plans on a file", id="snapshot+in-cluster"),
    pytest.param(["--snapshot", str(DEMO), "--save-snapshot", "s.json"], "--save-snapshot writes what was read",
                 id="save+snapshot"),
    pytest.param(["--kubeconfig", "k", "--config", "c.yaml", "--cluster-settings", "a/b"], "give one",
                 id="config+cluster-settings"),
    pytest.param(["--snapshot", str(DEMO), "--cluster-settings", "a/b"], "reads a live cluster's ConfigMap",
                 id="cluster-settings+snapshot"),
])
def test_conflicting_flags_are_refused_not_ignored(args, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s.json").exists()


def test_an_explicit_kubeconfig_beats_the_shipped_in_cluster_setting(tmp_path) -> None:
    from dds.config import Settings

    shipped = tmp_path / "settings.yaml"
    shipped.write_text("in_cluster: true\nfabric: simulated\n")
    settings = Settings.load(shipped, kubeconfig=tmp_path / "kubeconfig")
    assert settings.in_cluster is False and settings.kubeconfig == tmp_path / "kubeconfig"
    assert Settings.load(shipped).in_cluster is True
    assert Settings.load(shipped, kubeconfig=tmp_path / "k", in_cluster=True).in_cluster is True


@pytest.mark.parametrize("key", ["minSize", "maxSize", "cpu", "memory", "maxGpusPerNode"])
def test_a_groups_required_keys_are_named_as_the_file_writes_them(key: str, tmp_path, capsys) -> None:
    """The five keys snapshot_file.py's docstring calls required, each named in camelCase when missing."""
    group = {"id": "g", "minSize": 0, "maxSize": 3, "cpu": "8", "memory": "32Gi", "maxGpusPerNode": 4}
    del group[key]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"groups": [group]}))
    assert main(["plan", "--snapshot", str(path)]) == 2
    assert f"groups[0].{key}: Field required" in capsys.readouterr().err
