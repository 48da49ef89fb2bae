"""`dds check-config`: what is wrong with a setup before `dds serve` meets it, each with what to do, and an exit code
for scripts. The cluster half against a real apiserver is tests/integration/kube/test_check_config.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from dds.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DDS_FABRIC", "DDS_LOG_FORMAT", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tls(tmp_path: Path) -> Path:
    out = tmp_path / "tls"
    assert main(["certs", "--out", str(out), "--dns", "dds.local", "--days", "365"]) == 0
    return out


def settings_file(tmp_path: Path, tls: Path, **extra: object) -> str:
    path = tmp_path / "dds.yaml"
    path.write_text(yaml.safe_dump({"fabric": "simulated", "tls_cert": str(tls / "server.crt"),
                                    "tls_key": str(tls / "server.key"), "tls_ca": str(tls / "ca.crt"), **extra}))
    return str(path)


def findings(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict]]:
    code = main(["check-config", "--json", *args])
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == code
    return code, out["findings"]


def test_a_sound_setup_has_no_problem(tmp_path: Path, tls: Path, capsys) -> None:
    code = main(["check-config", "--config", settings_file(tmp_path, tls), "--node-groups",
                 str(ROOT / "examples" / "node-groups.yaml")])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("no problem found"), out
    assert "OK    tls: tls_cert" in out and "valid until" in out and "1 group(s) served" in out


def test_a_bad_setting_is_named_with_exit_2(tmp_path: Path, tls: Path, capsys) -> None:
    code, found = findings(capsys, "--config", settings_file(tmp_path, tls, policy="best-fitt"))
    assert code == 2
    assert [f["message"] for f in found if f["level"] == "fail"] == \
        ["policy: Value error, unknown policy 'best-fitt'; one of best-fit, least-demand, concentrated, spread"]


def test_no_fabric_and_no_tls_are_both_reported_with_their_fixes(capsys) -> None:
    code = main(["check-config"])
    out = capsys.readouterr().out
    assert code == 2
    assert "FAIL  settings: fabric is not set" in out and "FAIL  tls: tls_cert is not set" in out
    assert "to fix: `dds certs --out DIR --dns NAME` writes a matching set" in out and "2 problem(s)" in out


def test_certificates_expiring_soon_warn_and_expired_ones_fail(tmp_path: Path, tls: Path) -> None:
    from dds.cli import build_parser
    from dds.commands.check_config import check, exit_code

    args = build_parser().parse_args(["check-config", "--config", settings_file(tmp_path, tls)])
    soon = check(args, now=time.time() + 350 * 86400)
    assert {f.level for f in soon if f.area == "tls"} == {"warn"} and exit_code(soon) == 0
    assert "in 15 day(s)" in next(f.message for f in soon if f.area == "tls")
    late = check(args, now=time.time() + 400 * 86400)
    assert {f.level for f in late if f.area == "tls"} == {"fail"} and exit_code(late) == 2
    assert "renew it" in next(f.fix for f in late if f.area == "tls")


def test_insecure_is_a_warning(tmp_path: Path, capsys) -> None:
    path = tmp_path / "dds.yaml"
    path.write_text("fabric: simulated\ninsecure: true\n")
    code, found = findings(capsys, "--config", str(path))
    assert code == 0 and [f["message"] for f in found if f["level"] == "warn"] == \
        ["insecure: plaintext gRPC, any caller may scale the cluster"]


def test_a_bad_node_group_in_the_file_is_reported(tmp_path: Path, tls: Path, capsys) -> None:
    groups = tmp_path / "groups.yaml"
    text = (ROOT / "examples" / "node-groups.yaml").read_text()
    document = yaml.safe_load(text)
    broken = {**document["nodeGroups"][0], "id": "MachineSet/default/broken"}
    broken["annotations"] = {**broken["annotations"],
                             "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "many"}
    document["nodeGroups"].append(broken)
    groups.write_text(yaml.safe_dump(document))
    code, found = findings(capsys, "--config", settings_file(tmp_path, tls), "--node-groups", str(groups))
    assert code == 2
    assert any(f["area"] == "node-groups" and f["level"] == "fail" and "broken" in f["message"] for f in found), found


def test_an_unreachable_cluster_is_exit_3(tmp_path: Path, tls: Path, capsys) -> None:
    from tests.unit.reliability.test_cluster_failures import UNREACHABLE

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(UNREACHABLE))
    code, found = findings(capsys, "--config", settings_file(tmp_path, tls), "--kubeconfig", str(kubeconfig))
    assert code == 3
    assert [f["area"] for f in found if f["level"] == "fail"] == ["cluster"]
