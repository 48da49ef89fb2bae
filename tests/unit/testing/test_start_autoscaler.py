"""start_autoscaler: the real binary when DDS_CLUSTER_AUTOSCALER names one, the stand-in otherwise."""

from __future__ import annotations

import stat

import pytest

from dds.testing.autoscaler import AutoscalerTimings, format_go_duration, start_autoscaler


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


def test_without_a_binary_the_stand_in_runs(tmp_path, monkeypatch, provider):
    _, port = provider
    monkeypatch.delenv("DDS_CLUSTER_AUTOSCALER", raising=False)
    cloud_config = tmp_path / "cloud-config.yaml"
    cloud_config.write_text(f"address: 127.0.0.1:{port}\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n")
    handle = start_autoscaler(kubeconfig, cloud_config, tmp_path / "ca", scan_interval=0.1)
    try:
        assert handle.kind == "stand-in" and handle.running()
    finally:
        handle.stop()
    assert (tmp_path / "ca" / "ca-standin.log").exists()
    assert (tmp_path / "ca" / "ca-standin-calls.jsonl").read_text().strip().endswith('"status": "OK"}')


def test_a_binary_that_is_not_executable_is_an_error(tmp_path, monkeypatch):
    binary = tmp_path / "cluster-autoscaler"
    binary.write_text("")
    binary.chmod(stat.S_IRUSR)
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    with pytest.raises(FileNotFoundError, match="DDS_CLUSTER_AUTOSCALER=.*not an executable"):
        start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config", tmp_path / "ca")


def test_the_real_binary_gets_ca_flags_and_its_version_is_read(tmp_path, monkeypatch):
    binary = tmp_path / "cluster-autoscaler"
    binary.write_text("#!/bin/sh\necho \"I0101 main.go:250] Cluster Autoscaler 1.36.1\"\necho \"$@\" > args\n"
                      "exec sleep 60\n")
    binary.chmod(0o755)
    monkeypatch.setenv("DDS_CLUSTER_AUTOSCALER", str(binary))
    workdir = tmp_path / "ca"
    handle = start_autoscaler(tmp_path / "kubeconfig", tmp_path / "cloud-config.yaml", workdir,
                              max_node_provision_time=90)
    try:
        assert handle.kind == "cluster-autoscaler 1.36.1" and handle.running()
        cmdline = (workdir / "cluster-autoscaler.cmdline").read_text()
        for flag in ("--cloud-provider=externalgrpc", f"--cloud-config={tmp_path / 'cloud-config.yaml'}",
                     "--leader-elect=false", "--skip-nodes-with-system-pods=false",
                     "--max-node-provision-time=90s", "--address=127.0.0.1:"):
            assert flag in cmdline
    finally:
        handle.stop()
    assert not handle.running()
