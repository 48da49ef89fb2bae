"""hack/build-binaries.sh on a cache whose binaries are all there (executables standing in for them, in a private
cache): nothing is built, `DDS_BINARIES=demo` asks only for what `make demo` runs, and a cache of the earlier layout
(kube-controller-manager in a folder of its own) is adopted rather than rebuilt. No Go runs in these tests: a `go` that
only fails comes first on `PATH`, so a missing binary's build stops at once, after its progress line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness import versions

SCRIPT = versions.HACK / "build-binaries.sh"


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _cache(root: Path, *, controller_manager: bool = True, cro_manager: bool = True, cluster_api: bool = True,
           earlier_layout: bool = False) -> Path:
    shared = versions.read_pins(versions.SHARED_PINS)
    _executable(root / f"etcd-{shared['ETCD_VERSION']}" / "etcd")
    _executable(root / f"kwok-{shared['KWOK_VERSION']}" / "kwok")
    if cro_manager:
        cro = root / f"cro-manager-{shared['CRO_COMMIT'][:7]}"
        _executable(cro / "cro-manager")
        (cro / "config" / "webhook").mkdir(parents=True)
        (cro / "config" / "webhook" / "manifests.yaml").write_text("")
        kueue = root / f"kueue-{shared['KUEUE_VERSION']}"
        _executable(kueue / "kueue")
        (kueue / "config" / "webhook").mkdir(parents=True)
        (kueue / "config" / "webhook" / "manifests.yaml").write_text("")
    if cluster_api:
        capi = root / f"cluster-api-{shared['CLUSTER_API_VERSION']}"
        _executable(capi / "cluster-api-manager")
        (capi / "config" / "webhook").mkdir(parents=True)
        (capi / "config" / "webhook" / "manifests.yaml").write_text("")
    for name in versions.known_profiles():
        profile = versions.load_profile(name)
        kubernetes = root / f"kubernetes-{profile.kubernetes_version}"
        _executable(kubernetes / "kube-apiserver")
        _executable(kubernetes / "kube-scheduler")
        if controller_manager:
            folder = root / f"kube-controller-manager-{profile.kubernetes_version}" if earlier_layout else kubernetes
            _executable(folder / "kube-controller-manager")
        _executable(root / f"cluster-autoscaler-{profile.autoscaler_version}" / "cluster-autoscaler")
    return root


def _run(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    failing_go = cache.parent / f"{cache.name}-no-go"
    _executable(failing_go / "go")
    (failing_go / "go").write_text("#!/bin/sh\necho 'no go in this test' >&2\nexit 1\n")
    base = {key: value for key, value in os.environ.items() if key not in ("DDS_BINARIES", "DDS_K8S_PROFILE")}
    base["PATH"] = f"{failing_go}:{base.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**base, "DDS_BIN_CACHE": str(cache), **env})


def test_a_warm_cache_builds_nothing_and_links_every_profile(tmp_path: Path) -> None:
    done = _run(_cache(tmp_path), "--all")
    assert done.returncode == 0, done.stderr
    assert "building" not in done.stderr
    default = versions.default_profile_name({})
    assert done.stdout.strip().splitlines()[-1] == str(tmp_path / f"k8s-{default}")
    for name in versions.known_profiles():
        for binary in ("etcd", "kwok", "kube-apiserver", "kube-scheduler", "kube-controller-manager",
                       "cluster-autoscaler", "cro-manager", "cluster-api-manager"):
            assert os.access(tmp_path / f"k8s-{name}" / binary, os.X_OK), (name, binary)


def test_the_demo_set_needs_neither_the_controller_manager_nor_the_operator(tmp_path: Path) -> None:
    cache = _cache(tmp_path, controller_manager=False, cro_manager=False)
    done = _run(cache, DDS_BINARIES="demo")
    assert done.returncode == 0, done.stderr
    assert "building" not in done.stderr
    # The whole set is asked for without it: a build starts (and fails here, without Go), naming what it builds.
    full = _run(cache)
    assert full.returncode != 0
    assert "building kubernetes-" in full.stderr and "(kube-controller-manager)" in full.stderr, full.stderr


def test_the_demo_set_builds_cluster_apis_manager(tmp_path: Path) -> None:
    """`make demo` runs Cluster API's own manager: a demo cache without it builds it (and fails here, without Go)."""
    done = _run(_cache(tmp_path, controller_manager=False, cro_manager=False, cluster_api=False), DDS_BINARIES="demo")
    assert done.returncode != 0
    assert "building cluster-api" in done.stderr and "building kubernetes-" not in done.stderr, done.stderr


def test_an_earlier_caches_controller_manager_is_adopted_not_rebuilt(tmp_path: Path) -> None:
    done = _run(_cache(tmp_path, earlier_layout=True), "--all")
    assert done.returncode == 0, done.stderr
    assert "building" not in done.stderr
    profile = versions.active_profile({})
    adopted = tmp_path / f"kubernetes-{profile.kubernetes_version}" / "kube-controller-manager"
    assert adopted.resolve() == (tmp_path / f"kube-controller-manager-{profile.kubernetes_version}" /
                                 "kube-controller-manager")


@pytest.mark.parametrize("setting, message", [({"DDS_BINARIES": "everything"}, "DDS_BINARIES must be all or demo"),
                                              ({"DDS_BUILD_JOBS": "0"}, "DDS_BUILD_JOBS must be a positive number")])
def test_a_bad_setting_is_refused_naming_it(tmp_path: Path, setting: dict[str, str], message: str) -> None:
    done = _run(_cache(tmp_path), **setting)
    assert done.returncode == 1 and message in done.stderr, done.stderr
