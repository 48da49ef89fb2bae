"""The leader's mark on its own Pod: the label dds.cdi.dev/leader=true, which DDS's Service selects.

Every replica is Ready once it can serve (its cache synced, the planner primed, gRPC listening), so a rolling update
and a PodDisruptionBudget work; cluster-autoscaler's traffic still reaches the leader alone because the Service selects
this label too (CloudNativePG routes to its primary the same way). The leader sets it once it leads and clears it when
it stops leading; a process clears it at start, since a container restarted in the same Pod is not the leader any
more. A standby that CA reaches anyway (the label not yet cleared after a partition) answers UNAVAILABLE
(dds/provider/leadership.py). The only Pod writes DDS's ServiceAccount may make in its own namespace are of this label
(ValidatingAdmissionPolicy dds-own-pod-writes, manifests/dds/admission.yaml).
"""

from __future__ import annotations

import logging
from typing import Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("dds.kube.leader_label")

LEADER_LABEL = "dds.cdi.dev/leader"
LEADER_VALUE = "true"


class LeaderPodLabel:
    """Sets and clears LEADER_LABEL on the Pod DDS runs in (`pod_name` in `namespace`; None: not in a Pod, nothing to
    label)."""

    def __init__(self, api: client.ApiClient, namespace: str, pod_name: Optional[str], request_timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._pod = pod_name
        self._timeout = request_timeout
        self._wanted: Optional[bool] = None  # the last mark asked for
        self._written = True  # whether it was written
        if pod_name is None:
            log.info("not running in a Pod (no POD_NAME): the leader label %s is not set; a Service selecting it "
                     "would select no replica", LEADER_LABEL)

    def mark(self, leading: bool) -> bool:
        """Set (leading) or clear the label with one merge patch; False, logged with the reason, when it could not
        be written (the next change of leadership writes it again; until then a standby the Service still selects
        answers UNAVAILABLE)."""
        self._wanted = leading
        if self._pod is None:
            return True
        body = {"metadata": {"labels": {LEADER_LABEL: LEADER_VALUE if leading else None}}}
        try:
            self._core.patch_namespaced_pod(self._pod, self._namespace, body, _request_timeout=self._timeout)
        except (ApiException, OSError) as error:  # urllib3's timeouts and connection errors are OSErrors
            status = getattr(error, "status", None)
            log.warning("could not %s the leader label %s on Pod %s/%s (%s): the Service %s", "set" if leading else
                        "clear", LEADER_LABEL, self._namespace, self._pod, f"HTTP {status}" if status else error,
                        "does not route cluster-autoscaler here yet" if leading else "may still route here, where "
                        "calls are refused with UNAVAILABLE")
            self._written = False
            return False
        self._written = True
        log.info("%s the leader label %s on Pod %s/%s", "set" if leading else "cleared", LEADER_LABEL,
                 self._namespace, self._pod)
        return True

    def retry_failed(self, _observation: object = None) -> None:
        """A control-loop listener (the leader's passes): write again a mark that could not be written, so a leader
        whose label a blip of the apiserver kept off is reachable by the next pass, not only at the next election."""
        if not self._written and self._wanted is not None:
            self.mark(self._wanted)
