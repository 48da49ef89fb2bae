"""The control-plane fixture itself: what it starts works together (a kwok node runs a scheduled pod), an apiserver
restart keeps the data, a stop leaves no process behind, and a component that cannot start says why."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from kubernetes import client

from harness import versions
from harness.controlplane import (BINARIES, KWOK_NODE_ANNOTATION, REPO_ROOT, ControlPlane, ControlPlaneError,
                                 start_control_plane)

pytestmark = pytest.mark.integration


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with control_plane.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def kwok_node(core: client.CoreV1Api) -> Iterator[str]:
    name = f"kwok-{uuid.uuid4().hex[:6]}"
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}
    key, value = KWOK_NODE_ANNOTATION
    core.create_node(client.V1Node(
        metadata=client.V1ObjectMeta(name=name, annotations={key: value}, labels={"dds-test/node": name}),
        status=client.V1NodeStatus(capacity=resources, allocatable=resources)))
    yield name
    core.delete_node(name)


def node_ready(core: client.CoreV1Api, name: str) -> bool:
    conditions = core.read_node_status(name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_kwok_makes_an_annotated_node_ready_with_the_capacity_it_was_given(core: client.CoreV1Api,
                                                                           kwok_node: str) -> None:
    assert wait_for(lambda: node_ready(core, kwok_node))
    node = core.read_node(kwok_node)
    assert node.status.capacity["nvidia.com/gpu"] == "1" and node.status.allocatable["cpu"] == "8"
    assert not node.spec.taints, "no not-ready taint: the scheduler may place pods at once"


def test_a_pod_is_scheduled_onto_the_kwok_node_and_runs(core: client.CoreV1Api, kwok_node: str,
                                                        namespace: str) -> None:
    assert wait_for(lambda: node_ready(core, kwok_node))
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="gpu-job"),
        spec=client.V1PodSpec(node_selector={"dds-test/node": kwok_node}, containers=[client.V1Container(
            name="main", image="registry.k8s.io/pause:3.10",
            resources=client.V1ResourceRequirements(requests={"cpu": "1", "nvidia.com/gpu": "1"},
                                                    limits={"nvidia.com/gpu": "1"}))])))

    def running() -> bool:
        pod = core.read_namespaced_pod("gpu-job", namespace)
        return pod.spec.node_name == kwok_node and pod.status.phase == "Running"

    assert wait_for(running)


def test_the_control_plane_runs_the_selected_kubernetes_profile(control_plane: ControlPlane) -> None:
    # DDS_K8S_PROFILE (or hack/versions.env's default) picks the binaries; the apiserver must say it is that release.
    assert control_plane.server_version() == versions.active_profile().kubernetes_version


def test_a_status_patch_of_the_gpu_count_sticks(core: client.CoreV1Api, kwok_node: str) -> None:
    """How a hot-plugged GPU becomes visible: the node's /status, which kwok's stages never overwrite."""
    assert wait_for(lambda: node_ready(core, kwok_node))
    core.patch_node_status(kwok_node, {"status": {"capacity": {"nvidia.com/gpu": "3"},
                                                  "allocatable": {"nvidia.com/gpu": "3"}}})
    node = core.read_node(kwok_node)
    assert (node.status.capacity["nvidia.com/gpu"], node.status.allocatable["nvidia.com/gpu"]) == ("3", "3")


def test_deleting_a_namespace_removes_what_it_held(control_plane: ControlPlane, core: client.CoreV1Api) -> None:
    name = f"test-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    core.create_namespaced_config_map(name, client.V1ConfigMap(metadata=client.V1ObjectMeta(
        name="state", finalizers=["dds.cdi.dev/test-owner"])))
    core.create_namespaced_pod(name, client.V1Pod(metadata=client.V1ObjectMeta(name="p"), spec=client.V1PodSpec(
        node_name="nowhere", containers=[client.V1Container(name="c", image="registry.k8s.io/pause:3.10")])))
    control_plane.delete_namespace(name)
    assert name not in {n.metadata.name for n in core.list_namespace().items}
    pods = [p for p in core.list_pod_for_all_namespaces().items if p.metadata.namespace == name]
    assert pods == [], "a bound pod with no kubelet is removed too"
    config_maps = [c for c in core.list_config_map_for_all_namespaces().items if c.metadata.namespace == name]
    assert config_maps == [], "an object a finalizer held is not left behind"


# --- control planes of their own ---

@pytest.fixture
def bin_dir(control_plane: ControlPlane) -> Path:
    return control_plane.bin_dir


def test_restarting_the_apiserver_keeps_the_data(tmp_path: Path, bin_dir: Path) -> None:
    with start_control_plane(tmp_path, scheduler=False, kwok=False, crds=False, bin_dir=bin_dir) as plane:
        with plane.api_client() as api:
            client.CoreV1Api(api).create_namespaced_config_map("default", client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="survivor"), data={"attached": "2"}))
        old_pid = plane.pids()["kube-apiserver"]
        plane.restart_apiserver()
        assert plane.pids()["kube-apiserver"] != old_pid and not process_exists(old_pid)
        with plane.api_client() as api:
            assert client.CoreV1Api(api).read_namespaced_config_map("survivor", "default").data == {"attached": "2"}


def test_stopping_leaves_no_process_behind(tmp_path: Path, bin_dir: Path) -> None:
    plane = start_control_plane(tmp_path, crds=False, bin_dir=bin_dir)
    pids = plane.pids()
    assert set(pids) == {"etcd", "kube-apiserver", "kube-scheduler", "kwok"}
    assert all(process_exists(pid) for pid in pids.values())
    plane.stop()
    assert [name for name, pid in pids.items() if process_exists(pid)] == []
    plane.stop()  # a second stop is harmless
    with pytest.raises(ControlPlaneError, match="stopped"):
        plane.restart_apiserver()


def test_a_failing_test_session_still_tears_the_control_plane_down(tmp_path: Path, bin_dir: Path) -> None:
    """The fixture as a test run uses it: a session whose test fails, in a pytest of its own."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""
        import json, os
        from pathlib import Path

        def test_that_fails(control_plane):
            Path(os.environ["PIDS_FILE"]).write_text(json.dumps(control_plane.pids()))
            assert False, "the test failed"
    """))
    pids_file = tmp_path / "pids.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_inner.py", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
         "-q", f"--basetemp={tmp_path / 'base'}"],
        # The harness lives in the checkout, not in the installed package: the inner session finds it on PYTHONPATH.
        cwd=tmp_path, env={**os.environ, "PIDS_FILE": str(pids_file), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout + done.stderr
    pids = json.loads(pids_file.read_text())
    assert set(pids) == {"etcd", "kube-apiserver", "kube-scheduler", "kwok", "cluster-api-manager"}
    assert [name for name, pid in pids.items() if process_exists(pid)] == []


def broken_bin_dir(tmp_path: Path, real: Path, broken: str, script: str) -> Path:
    out = tmp_path / "bin"
    out.mkdir()
    for name in BINARIES:
        (out / name).symlink_to((real / name).resolve())
    (out / broken).unlink()
    (out / broken).write_text(f"#!/bin/sh\n{script}\n")
    (out / broken).chmod(stat.S_IRWXU)
    return out


@pytest.mark.parametrize("broken", ["etcd", "kube-apiserver", "kwok"])
def test_a_component_that_dies_at_startup_is_named_with_its_log(tmp_path: Path, bin_dir: Path,
                                                                broken: str) -> None:
    bad = broken_bin_dir(tmp_path, bin_dir, broken, 'echo "cannot open /dev/fabric: permission denied" >&2; exit 3')
    with pytest.raises(ControlPlaneError) as raised:
        start_control_plane(tmp_path / "plane", crds=False, scheduler=False, bin_dir=bad)
    message = str(raised.value)
    assert f"{broken} exited with code 3" in message
    assert "cannot open /dev/fabric: permission denied" in message, "the log tail is in the message"


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ControlPlaneError, match="no executable etcd, kube-apiserver, kube-scheduler, kwok"):
        start_control_plane(tmp_path, bin_dir=tmp_path)
