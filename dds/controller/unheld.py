"""Devices a node shows that no fabric record holds: what DDS cannot prevent, it detects and reports (issue 38).

With the CDI operator, a device can reach a node without a ComposableResource for it: the operator's cluster-manager
client adds twice against a cluster manager that accepts a repeated resize, and a reconcile whose add succeeds after
the resource was deleted (a failed attach given back) loses the device's id when its status write conflicts
(docs/composability.md, "Known issues"). Nothing in the operator's objects shows such a device, so DDS's pool does
not count it and no detach can name it; the operator's upstream syncer reclaims it only after a 10-minute grace. It
does show on the node: in DEVICE_PLUGIN mode the node's GPU capacity counts every GPU the server has.

What is judged: each Ready node of an extended-resource group, not being deleted. Reported when it has shown more
GPUs than the fabric's records of devices on it (any state: on their way, online, leaving) for `grace_seconds`: an
`UnheldDevice` warning Event on the node (once per count) and the `dds_unheld_devices` gauge.

A server may have GPUs of its own besides the fabric's: what a node shows beyond the fabric's records the first time
DDS judges it (normally before its first attach, as a new node registers) is taken as its own and never reported;
only devices that come beyond that are. So a device lost before DDS first saw the node (a DDS restarted since) is
not detected.

The grace covers the ordinary lags: a device shows on the node as soon as the fabric is done, while its record takes
it at the operator's next look (up to 30 s later); a detached one leaves the device plugin's count after its record is
gone. DRA groups show GPUs in ResourceSlices, not in the node's capacity: not judged here.

Pure: the controller passes what each node shows, what the fabric holds there and "now"; since when a node has shown
too many is kept in memory only (a restarted DDS starts the grace again: a report comes later, never early).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Unheld:
    """`count` devices `node` shows beyond the `held` ones (the fabric's records of devices on it, and the node's own
    GPUs), since `since`."""

    node: str
    shown: int
    held: int
    since: float

    @property
    def count(self) -> int:
        return self.shown - self.held


@dataclass
class UnheldDevices:
    grace_seconds: float
    _since: dict[str, float] = field(default_factory=dict)
    _reported: dict[str, int] = field(default_factory=dict)
    _own: dict[str, int] = field(default_factory=dict)  # GPUs each node showed beyond the records at its first look

    def find(self, shown: Mapping[str, int], held: Mapping[str, int], now: float) -> list[Unheld]:
        """The nodes (of `shown`: the ones judged) that have shown more devices than the fabric holds on them (and
        their own GPUs) for `grace_seconds` or longer."""
        for node in set(self._own) - set(shown):
            del self._own[node]
        for node, count in shown.items():
            self._own.setdefault(node, max(0, count - held.get(node, 0)))
        over = {node: count for node, count in shown.items() if count > held.get(node, 0) + self._own[node]}
        for node in over:
            self._since.setdefault(node, now)
        for node in set(self._since) - set(over):
            del self._since[node]
        return [Unheld(node, over[node], held.get(node, 0) + self._own[node], self._since[node])
                for node in sorted(over) if now - self._since[node] >= self.grace_seconds]

    def newly_reported(self, found: list[Unheld]) -> list[Unheld]:
        """Of `found`, those not reported yet with that count (one Event per node and count, not one per pass); a
        node no longer found may be reported again later."""
        fresh = [u for u in found if self._reported.get(u.node) != u.count]
        self._reported = {u.node: u.count for u in found}
        return fresh
