"""The decision journal behind /decisions: newest first, bounded, as text for people and JSON for tools."""

import json
import urllib.request

from dds.controller.journal import DecisionJournal
from dds.ops.http import OpsServer


def test_journal_keeps_the_newest_decisions_first_and_bounded():
    clock = iter(range(1_000_000, 1_000_010))
    journal = DecisionJournal(lambda: next(clock), capacity=2)
    journal.record("case1-scale-up", "cluster-autoscaler IncreaseSize g +1", "gpu", "demo/train-0 -> worker-1")
    journal.record("case1-scale-up", "cluster-autoscaler IncreaseSize g +1", "node", "demo/mem-0 -> new node")
    journal.record("case4-scale-down-blocked", "control loop", "gpu", "detach A30-002 from worker-1")
    assert [d.outcome for d in journal.entries()] == ["gpu", "node"]
    text = journal.render_text().decode()
    assert text.index("case4-scale-down-blocked") < text.index("case1-scale-up")
    assert "    detach A30-002 from worker-1" in text


def test_ops_server_serves_the_journal_as_text_and_json():
    journal = DecisionJournal(lambda: 0.0)
    journal.record("case1-scale-up", "cluster-autoscaler IncreaseSize g +1", "gpu", "demo/train-0 fits after 1 GPU")
    ops = OpsServer("127.0.0.1:0")
    ops.add_page("/decisions", lambda q: (journal.render_json(), "application/json") if q.get("format") == ["json"]
                 else (journal.render_text(), "text/plain"))
    port = ops.start()
    try:
        base = f"http://127.0.0.1:{port}/decisions"
        assert b"fits after 1 GPU" in urllib.request.urlopen(base, timeout=5).read()
        [entry] = json.loads(urllib.request.urlopen(base + "?format=json", timeout=5).read())
        assert entry["trigger"] == "cluster-autoscaler IncreaseSize g +1" and entry["outcome"] == "gpu"
    finally:
        ops.stop()


def test_a_page_cannot_shadow_the_probes():
    import pytest

    with pytest.raises(ValueError):
        OpsServer("127.0.0.1:0").add_page("/readyz", lambda q: (b"", "text/plain"))
