"""pytest fixtures for tests against the real control plane; tests/conftest.py registers this plugin for every test
folder (integration, e2e).

- `control_plane` (session): one ControlPlane (etcd, kube-apiserver, kube-scheduler, kwok, the CRDs DDS uses, and
  Cluster API's own manager with the harness's kwok infrastructure provider: harness/capi_stack.py) for the whole run,
  in a pytest tmp dir (its logs under <tmp>/control-plane*/logs), stopped at the end of the session whatever happened.
  When the binaries cannot be built or the control plane cannot start, every test that needs it ERRORS with the
  reason: CI must build them, so this is never a skip.
- `namespace` (function): a fresh namespace, deleted with everything in it afterwards; DDS's shipped Role is bound in
  it (harness/rbac.py `grant_namespace`), for DDS run with the namespace as its own.

The binaries are built (or found in the cache) right after collection, and only when a collected test needs the
control plane: a cold build takes minutes and should not count against the first test's timeout.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Union

import pytest

from harness import rbac, versions
from harness.controlplane import ControlPlane, ensure_binaries, start_control_plane

_FIXTURE = "control_plane"
_binaries_key = pytest.StashKey[Union[Path, BaseException]]()


def _needs_control_plane(items: list[pytest.Item]) -> bool:
    return any(_FIXTURE in getattr(item, "fixturenames", ()) for item in items)


def pytest_report_header(config: pytest.Config) -> str:
    """Which Kubernetes profile this run's control planes and cluster-autoscaler come from (DDS_K8S_PROFILE)."""
    try:
        profile = versions.active_profile()
    except versions.VersionsError as exc:
        return f"dds: {exc}"
    return (f"dds: Kubernetes profile {profile.name}: kube-apiserver {profile.kubernetes_version}, "
            f"cluster-autoscaler {profile.autoscaler_version} (docs/versions.md)")


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not _needs_control_plane(session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("dds: binaries via hack/build-binaries.sh (etcd, kube-apiserver, kube-scheduler, "
                             "kube-controller-manager, kwok, cluster-autoscaler; cached: under a second, cold: "
                             "20-40 min on 2 cores for both Kubernetes minors, docs/versions.md)")
    try:
        session.config.stash[_binaries_key] = ensure_binaries()
    except Exception as exc:  # reported by every test that needs the control plane, not as an internal error
        session.config.stash[_binaries_key] = exc


def _bin_dir(config: pytest.Config) -> Path:
    found = config.stash.get(_binaries_key, None)
    if found is None:  # collected in a way the hook did not see (e.g. requested dynamically)
        found = config.stash[_binaries_key] = ensure_binaries()
    if isinstance(found, BaseException):
        raise found
    return found


def own_control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                      **components: bool) -> Iterator[ControlPlane]:
    """A control plane started for the requesting fixture's scope (a module that changes cluster-wide objects, such as
    CRDs, defines `control_plane` with it instead of sharing the session's); `components` as start_control_plane
    takes them (scheduler, kwok, crds), all by default. It runs no Cluster API."""
    plane = start_control_plane(tmp_path_factory.mktemp("control-plane"), bin_dir=_bin_dir(request.config),
                                **components)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Cluster API runs from the start, so every test on the plane writes MachineSets to its own CRDs and webhooks
    and sees its controllers act on them, whichever tests ran before on the same plane."""
    from harness.capi_stack import cluster_api_on  # capi_stack builds on this module

    for plane in own_control_plane(request, tmp_path_factory):
        cluster_api_on(plane)
        yield plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    # DDS run in this test keeps its state and Lease here (`namespace: <name>`): its shipped Role, moved here.
    rbac.grant_namespace(control_plane, rbac.DDS, name)
    try:
        yield name
    finally:
        control_plane.delete_namespace(name)
