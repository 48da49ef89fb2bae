"""hack/build-binaries.sh takes the CDI operator's source from DDS_CRO_SOURCE, like cluster-autoscaler's from
DDS_CA_SOURCE: its build_cro_manager function run alone, with the Go steps recorded instead of run (what Go builds is
tests/e2e's to show), on a directory laid out as the upstream archive, and refusing what is not one."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "hack" / "build-binaries.sh"


def build_cro_manager(tmp_path: Path, source: Path) -> subprocess.CompletedProcess:
    """The script's own function, with `run` recording each Go step and making the binary it would build."""
    program = f"""
set -euo pipefail
eval "$(sed -n '/^build_cro_manager() {{/,/^}}/p' {SCRIPT})"
die() {{ echo "error: $*" >&2; exit 1; }}
building() {{ echo "building $*"; }}
built() {{ echo "built $*"; }}
run() {{ local name="$1"; shift; echo "ran in $PWD: $*"; if [[ "$1" == go && "$2" == build ]]; then
  touch "$out.tmp/cro-manager"; chmod +x "$out.tmp/cro-manager"; fi; }}
cache={tmp_path / 'cache'} repo={ROOT} CRO_COMMIT=38251b7aaaaaaaaaaaaa CRO_SOURCE_ARCHIVE=none.tar.gz CRO_SOURCE_SHA256=0
DDS_CRO_SOURCE={source}
build_cro_manager
"""
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)


def upstream_layout(root: Path) -> Path:
    operator = root / "composable-resource-operator"
    for folder in ("config/crd/bases", "config/rbac", "config/webhook", "cmd"):
        (operator / folder).mkdir(parents=True)
    (operator / "go.mod").write_text("module github.com/CoHDI/composable-resource-operator\n")
    (operator / "config/crd/bases/cro.yaml").write_text("kind: CustomResourceDefinition\n")
    (operator / "config/rbac/role.yaml").write_text("kind: ClusterRole\n")
    (operator / "config/webhook/manifests.yaml").write_text("kind: ValidatingWebhookConfiguration\n")
    (root / "cluster-api-provider-metal3-api").mkdir()
    return root


def test_a_directory_source_is_copied_and_built_with_its_config(tmp_path: Path) -> None:
    source = upstream_layout(tmp_path / "checkout")
    done = build_cro_manager(tmp_path, source)
    assert done.returncode == 0, done.stderr
    release = tmp_path / "cache" / "cro-manager-38251b7"
    assert (release / "cro-manager").exists() and (release / "config/webhook/manifests.yaml").exists()
    assert (release / "config/crd/bases/cro.yaml").exists() and (release / "config/rbac/role.yaml").exists()
    assert "go build" in done.stdout and str(source) not in done.stdout.split("ran in ")[1]  # built in a copy
    assert not (source / "composable-resource-operator" / "go.sum").exists()


def test_a_source_that_is_not_the_operator_is_refused_naming_the_variable(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = build_cro_manager(tmp_path, empty)
    assert done.returncode == 1 and f"DDS_CRO_SOURCE {empty} holds no composable-resource-operator/" in done.stderr
    missing = build_cro_manager(tmp_path, tmp_path / "nope")
    assert missing.returncode == 1 and "DDS_CRO_SOURCE=/path/to/an-archive-or-directory" in missing.stderr


def test_an_archive_with_another_checksum_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "cro.tar.gz"
    archive.write_bytes(b"not the pinned archive")
    done = build_cro_manager(tmp_path, archive)
    assert done.returncode == 1 and "set DDS_CRO_SOURCE_SHA256 for an archive of your own" in done.stderr
