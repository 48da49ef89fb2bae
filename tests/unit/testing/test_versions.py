"""Kubernetes profiles (harness/versions.py, hack/versions*.env): which control plane and cluster-autoscaler a run uses,
selected by DDS_K8S_PROFILE, with a clear error for a profile hack/ does not pin."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness import versions


def test_every_profile_pins_a_cluster_autoscaler_of_its_own_kubernetes_minor():
    names = versions.known_profiles()
    assert {"1.35", "1.36"} <= set(names)
    for name in names:
        profile = versions.load_profile(name)
        assert profile.minor == versions.minor_of(profile.autoscaler_version), name
        assert f"{profile.minor[0]}.{profile.minor[1]}" == name


def test_the_default_and_compat_profiles_are_pinned_and_differ():
    default, compat = versions.default_profile_name({}), versions.compat_profile_name()
    assert default in versions.known_profiles() and compat in versions.known_profiles()
    assert default != compat
    assert versions.load_profile(default).minor > versions.load_profile(compat).minor


def test_the_environment_selects_the_profile():
    assert versions.active_profile({"DDS_K8S_PROFILE": "1.35"}).kubernetes_version == "v1.35.4"
    profile = versions.active_profile({"DDS_K8S_PROFILE": "1.36"})
    assert (profile.kubernetes_version, profile.autoscaler_version) == ("v1.36.3", "1.36.1")
    assert profile.at_least(1, 36) and not versions.load_profile("1.35").at_least(1, 36)


def test_an_unknown_profile_names_the_known_ones():
    with pytest.raises(versions.VersionsError, match=r"no Kubernetes profile '1\.20'.*known profiles: 1\.35, 1\.36"):
        versions.active_profile({"DDS_K8S_PROFILE": "1.20"})


@pytest.mark.parametrize("text, minor", [("v1.36.3", (1, 36)), ("1.35.2", (1, 35)), ("v1.37.0-alpha.1", (1, 37))])
def test_minor_of_reads_kubernetes_and_autoscaler_versions(text, minor):
    assert versions.minor_of(text) == minor


def test_minor_of_refuses_what_is_no_version():
    with pytest.raises(ValueError, match="not a Kubernetes version: 'latest'"):
        versions.minor_of("latest")


def test_the_build_script_refuses_an_unknown_profile_naming_the_known_ones(tmp_path):
    # Nothing is built: the profile is checked before any build step (a private cache keeps the real one untouched).
    done = subprocess.run(["bash", str(versions.HACK / "build-binaries.sh"), "1.20"], capture_output=True, text=True,
                          env={**os.environ, "DDS_BIN_CACHE": str(tmp_path)}, timeout=60)
    assert done.returncode == 1
    assert "no Kubernetes profile '1.20'" in done.stderr and "known profiles: 1.35 1.36" in done.stderr
    assert not (tmp_path / "k8s-1.20").exists()
