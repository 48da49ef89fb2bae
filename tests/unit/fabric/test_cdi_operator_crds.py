"""manifests/crds/composability ships the CDI operator's own CRDs, byte for byte: DDS's composability backend and the
operator must agree on one schema, and the copy must not drift from the operator version hack/versions.env pins."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VERSIONS = REPO / "hack" / "versions.env"
SHIPPED = REPO / "manifests" / "crds" / "composability"
UPSTREAM_BASES = "composable-resource-operator/config/crd/bases/"


def _pinned() -> dict[str, str]:
    pins = {}
    for line in VERSIONS.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            pins[key.strip()] = value.strip()
    return pins


def _upstream_crds() -> dict[str, bytes]:
    pins = _pinned()
    archive = REPO.parent / "shared" / "third_party" / pins["CRO_SOURCE_ARCHIVE"]
    assert archive.is_file(), f"the operator's source archive {archive} is missing (see shared/third_party/README.md)"
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert digest == pins["CRO_SOURCE_SHA256"], f"{archive}: sha256 {digest}, hack/versions.env pins another"
    with tarfile.open(archive) as tar:
        return {Path(member.name).name: tar.extractfile(member).read()  # type: ignore[union-attr]
                for member in tar.getmembers()
                if member.isfile() and member.name.startswith(UPSTREAM_BASES) and member.name.endswith(".yaml")}


def test_the_shipped_crds_are_the_pinned_operators_own_files():
    upstream = _upstream_crds()
    shipped = {path.name: path.read_bytes() for path in SHIPPED.glob("*.yaml") if path.name != "kustomization.yaml"}
    assert sorted(shipped) == sorted(upstream)
    drifted = [name for name in upstream if shipped[name] != upstream[name]]
    assert not drifted, (f"{drifted} differ from the operator's config/crd/bases at {_pinned()['CRO_COMMIT']}: copy "
                         f"them again from the source archive into charts/dds/files/crds, unmodified, and run "
                         f"`make manifests`")
