"""Keeps cluster-autoscaler's GPU label (`LABEL_ATTACHED_GPU`) true on DDS nodes: present exactly while a node has a
GPU it can use. Why CA needs that is in dds/planner/labels.py and docs/gpu-label.md.

Two moments matter:
- every control-loop pass sets or removes the label where it disagrees with the node's GPUs (an attach becomes
  allocatable, the device plugin drops a GPU, a removal before a crash was not finished);
- before a detach that leaves the node without fabric GPUs, the label goes first, so CA never sees the node with its
  GPU label and 0 GPUs, even for one scan.

The pass's reconcile runs outside the controller's lock, in a thread of its own once the controller has started (a
first pass on a large cluster writes thousands of labels: minutes that must neither hold CA's calls behind the lock nor
stretch the loop's pass). The loop offers each pass's snapshot; the writer takes the newest, so a slow write never
queues stale ones. A detach can start between a snapshot and its write: a node detached from since `mark()` keeps its
label off until a snapshot that shows the detach.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional, Protocol

from dds.fabric.base import DeviceState, Fabric
from dds.kube.nodes import NodeNotFound, NodeUpdateFailed
from dds.model.groups import LABEL_ATTACHED_GPU
from dds.planner.labels import attached_gpu_label
from dds.model.plan import Detach
from dds.model.snapshot import Snapshot

log = logging.getLogger(__name__)


class NodeLabelSetter(Protocol):
    """The one write the keeper makes: set a Node's label `key` to `value`, or remove it when `value` is None, leaving
    its other labels alone. Raises `NodeNotFound` for a Node that does not exist and `NodeUpdateFailed` for any other
    refusal (dds.kube.nodes.KubeNodeWriter: a merge patch on the apiserver)."""

    def set_label(self, node: str, key: str, value: Optional[str]) -> None: ...


class GpuLabelKeeper:
    def __init__(self, labels: NodeLabelSetter, fabric: Fabric) -> None:
        self._labels = labels
        self._fabric = fabric
        self._lock = threading.Lock()  # a label decision and its write are one step against before_detach
        self._detaches = 0
        self._detached_at: dict[str, int] = {}  # node -> the count of label-removing detaches when it was last one
        self._offered: Optional[tuple[Snapshot, int]] = None  # the newest snapshot not yet written, with its mark
        self._wake = threading.Condition()
        self._writing = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # --- the writer thread ---
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dds-gpu-labels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def offer(self, snapshot: Snapshot, since: int) -> None:
        """Reconcile against `snapshot` (taken after `mark()` returned `since`): by the writer thread when it runs (a
        newer offer replaces one not yet taken), else here and now."""
        if self._thread is None:
            self.reconcile(snapshot, since)
            return
        with self._wake:
            self._offered = (snapshot, since)
            self._wake.notify()

    def idle(self) -> bool:
        """Every offered snapshot is written (or replaced by a newer one that is)."""
        with self._wake:
            return self._offered is None and not self._writing

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while self._offered is None and not self._stop.is_set():
                    self._wake.wait()
                offered, self._offered = self._offered, None
                self._writing = offered is not None
            if offered is None:
                continue
            try:
                self.reconcile(*offered)
            except Exception:  # the next offer tries again; the loop must not lose its labeller
                log.exception("reconciling %s failed; the next pass tries again", LABEL_ATTACHED_GPU)
            finally:
                with self._wake:
                    self._writing = False

    def mark(self) -> int:
        """Taken before the snapshot a reconcile will use."""
        with self._lock:
            return self._detaches

    def reconcile(self, snapshot: Snapshot, since: int = -1) -> None:
        """Make each DDS node's label agree with `snapshot`; never re-adds a label a detach started after `since` (a
        `mark()`) removed. `since=-1` means the snapshot is current (taken under the controller's lock)."""
        with self._lock:  # detaches this snapshot already shows need no guard any more
            self._detached_at = {n: at for n, at in self._detached_at.items() if at > since}
        for node in snapshot.nodes:
            if node.group_id is None:
                continue  # not DDS's node: its labels are someone else's
            group = snapshot.group(node.group_id)
            want = attached_gpu_label(node, group, snapshot.gpu_model_label)
            have = node.labels.get(LABEL_ATTACHED_GPU)
            if want == have:
                continue
            why = (f"{node.allocatable.get(node.gpu_resource)} GPU(s) allocatable" if want
                   else "no GPU left that it can use")
            with self._lock:
                if want and since >= 0 and self._detached_at.get(node.name, -1) > since:
                    continue  # the snapshot predates a detach of its last GPUs: the next pass judges it
                self._set(node.name, want, why)

    def before_detach(self, step: Detach) -> None:
        """Remove the label when this detach takes the node's last fabric GPU."""
        leaving = set(step.device_ids)
        staying = [d for d in self._fabric.devices(step.node)
                   if d.id not in leaving and d.state != DeviceState.DETACHING]
        if not staying:
            with self._lock:
                self._detaches += 1
                self._detached_at[step.node] = self._detaches
                self._set(step.node, None, f"its last GPU(s) {', '.join(step.device_ids)} are being detached")

    def _set(self, node_name: str, value: str | None, why: str) -> None:
        try:
            self._labels.set_label(node_name, LABEL_ATTACHED_GPU, value)
        except NodeNotFound:
            return  # a node that is gone carries no label
        except NodeUpdateFailed as exc:
            # The next loop pass tries again; a detach is not held back for it (the window is one pass).
            log.warning("could not update %s on %s (%s): %s", LABEL_ATTACHED_GPU, node_name, why, exc)
            return
        log.info("%s %s on %s: %s", "set" if value else "removed",
                 f"{LABEL_ATTACHED_GPU}={value}" if value else LABEL_ATTACHED_GPU, node_name, why)
