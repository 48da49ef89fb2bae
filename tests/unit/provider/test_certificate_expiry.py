"""dds_certificate_expiry_seconds: the notAfter of the server certificate and the client CA, read from their files at
each scrape, so a renewed Secret shows without a restart (the DDSCertificateExpiresSoon alert reads it)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from cryptography import x509
from prometheus_client import REGISTRY

from dds.cli import main
from dds.config import Settings
from dds.provider.server import publish_certificate_expiry


def certs(out: Path, days: int) -> Path:
    assert main(["certs", "--out", str(out), "--dns", "dds.local", "--days", str(days)]) == 0
    return out


def not_after(path: Path) -> float:
    return min(c.not_valid_after_utc.timestamp() for c in x509.load_pem_x509_certificates(path.read_bytes()))


def scraped(certificate: str) -> float:
    value = REGISTRY.get_sample_value("dds_certificate_expiry_seconds", {"certificate": certificate})
    assert value is not None, f"no dds_certificate_expiry_seconds{{certificate={certificate!r}}}"
    return value


def test_each_certificate_is_published_and_a_renewal_shows_without_a_restart(tmp_path: Path) -> None:
    first = certs(tmp_path / "first", days=30)
    mounted = tmp_path / "mounted"
    shutil.copytree(first, mounted)
    publish_certificate_expiry(Settings(tls_cert=mounted / "server.crt", tls_key=mounted / "server.key",
                                        tls_ca=mounted / "ca.crt"))
    assert scraped("server") == not_after(first / "server.crt")
    assert scraped("client_ca") == not_after(first / "ca.crt")

    renewed = certs(tmp_path / "renewed", days=90)
    shutil.copy(renewed / "server.crt", mounted / "server.crt")
    assert scraped("server") == not_after(renewed / "server.crt") > not_after(first / "server.crt")

    (mounted / "ca.crt").write_text("not a certificate")  # a Secret being swapped in: NaN, not a stale date
    assert math.isnan(scraped("client_ca"))
