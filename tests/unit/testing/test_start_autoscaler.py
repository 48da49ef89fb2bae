"""start_autoscaler runs only the real cluster-autoscaler, of the pinned version and with externalgrpc: anything else
is refused with a message that says what is wrong and how to fix it, and nothing is left running."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from harness.autoscaler import (AutoscalerError, AutoscalerTimings, format_go_duration, pinned_version,
                                    start_autoscaler)

HELP_WITH_EXTERNALGRPC = "Cloud provider type. Available values: [externalgrpc]"


def fake_ca(directory: Path, version: str, help_text: str = HELP_WITH_EXTERNALGRPC) -> Path:
    """A shell script that answers --help like cluster-autoscaler and logs its version line when started."""
    binary = directory / "cluster-autoscaler"
    binary.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = --help ]; then echo '      --cloud-provider string  {help_text}' >&2; exit 0; fi\n"
        f"echo \"I0101 main.go:393] Cluster Autoscaler {version}\"\n"
        "echo \"$@\" > args\nexec sleep 60\n")
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("seconds, flag", [
    pytest.param(10, "10s", id="whole"), pytest.param(0.25, "250ms", id="fraction"),
    pytest.param(87600 * 3600, "315360000s", id="ca-default-cache-expiry"),
])
def test_go_duration_flags(seconds, flag):
    assert format_go_duration(seconds) == flag


def test_timings_become_ca_flags_only_when_set():
    flags = AutoscalerTimings.from_kwargs(scan_interval=1, scale_down_delay_after_failure=5).flags()
    assert "--scan-interval=1s" in flags and "--scale-down-delay-after-failure=5s" in flags
    assert not any(f.startswith("--scale-down-unready-time") for f in flags)


def test_unknown_timing_is_refused():
    with pytest.raises(TypeError, match="unknown autoscaler timing.*scan_intervall"):
        AutoscalerTimings.from_kwargs(scan_intervall=1)


def test_the_pinned_version_is_the_selected_kubernetes_profiles(monkeypatch):
    monkeypatch.setenv("DDS_K8S_PROFILE", "1.35")
    assert pinned_version() == "1.35.2"
    monkeypatch.setenv("DDS_K8S_PROFILE", "1.36")
    assert pinned_version() == "1.36.1"


def test_an_unknown_profile_is_an_error_naming_the_known_ones(monkeypatch):
    monkeypatch.setenv("DDS_K8S_PROFILE", "1.20")
    with pytest.raises(AutoscalerError, match=r"no Kubernetes profile '1\.20'.*known profiles: 1\.35, 1\.36"):
        pinned_version()


def test_no_binary_anywhere_is_an_error_naming_the_build_script(tmp_path, monkeypatch):
    monkeypatch.delenv("DDS_CLUSTER_AUTOSCALER", raising=False)
    with pytest.raises(AutoscalerError, match="binary cache.*not an executable.*hack/build-binaries.sh"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca", bin_dir=tmp_path)


def test_a_binary_that_is_not_executable_is_an_error(tmp_path, monkeypatch):
    binary = tmp_path / "cluster-autoscaler"
    binary.write_text("")
    binary.chmod(stat.S_IRUSR)
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    with pytest.raises(AutoscalerError, match="DDS_CLUSTER_AUTOSCALER.*not an executable"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca")


def test_a_binary_without_externalgrpc_is_refused_before_it_starts(tmp_path, monkeypatch):
    binary = fake_ca(tmp_path, pinned_version(), help_text="Cloud provider type. Available values: [aws,gce]")
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    with pytest.raises(AutoscalerError, match=r"without the externalgrpc provider \(it has: aws, gce\)"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca")
    assert not (tmp_path / "ca" / "cluster-autoscaler.log").exists()


def test_another_version_is_refused_and_stopped(tmp_path, monkeypatch):
    binary = fake_ca(tmp_path, "1.34.0")
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    with pytest.raises(AutoscalerError, match=rf"is cluster-autoscaler 1\.34\.0; the tests pin {pinned_version()}"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca")


def test_a_binary_of_another_minor_than_the_control_plane_is_refused_and_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("DDS_K8S_PROFILE", "1.35")
    binary = fake_ca(tmp_path, "1.35.2")
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    with pytest.raises(AutoscalerError, match=r"cluster-autoscaler 1\.35\.2 is for Kubernetes 1\.35, but the control "
                                              r"plane is Kubernetes v1\.36\.3.*DDS_K8S_PROFILE"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca",
                         control_plane_version="v1.36.3")


def test_the_same_minor_as_the_control_plane_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv("DDS_K8S_PROFILE", "1.36")
    binary = fake_ca(tmp_path, "1.36.1")
    handle = start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca", binary=binary,
                              control_plane_version="v1.36.3")
    try:
        assert handle.kind == "cluster-autoscaler 1.36.1" and handle.running()
    finally:
        handle.stop()


def test_the_pinned_binary_gets_ca_flags_and_names_its_version(tmp_path, monkeypatch):
    monkeypatch.delenv("DDS_CLUSTER_AUTOSCALER", raising=False)
    binary = fake_ca(tmp_path, pinned_version())
    workdir = tmp_path / "ca"
    handle = start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config.yaml", workdir, binary=binary,
                              max_node_provision_time=90)
    try:
        assert handle.kind == f"cluster-autoscaler {pinned_version()}" and handle.running()
        cmdline = (workdir / "cluster-autoscaler.cmdline").read_text()
        for flag in ("--cloud-provider=externalgrpc", f"--cloud-config={tmp_path / 'cloud-config.yaml'}",
                     "--leader-elect=false", "--skip-nodes-with-system-pods=false",
                     "--max-node-provision-time=90s", "--address=127.0.0.1:"):
            assert flag in cmdline
    finally:
        handle.stop()
    assert not handle.running()
