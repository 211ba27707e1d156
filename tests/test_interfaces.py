"""The lane's interfaces: what the local objects and the cluster's remote ones implement, the relays derived from
the Protocols, and the kinds' host-operation channel (once per key, whoever asks). Pure: no build, no device; the
cluster's classes are imported (Ray installed) but no cluster is started."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import pytest

from devicelab import kinds
from devicelab.errors import DevicelabError
from devicelab.kinds.base import DATA, FILE, HOST_OPS, host_op
from devicelab.ledger import Ledger
from devicelab.runner.host import HostWork
from devicelab.runner.lane import EVENT_CALLS, LEDGER_CALLS, Events, HostServices, LaneLedger, protocol_calls


def _implements(cls, proto) -> list[str]:
    """The Protocol's calls `cls` lacks, or that take fewer parameters."""
    bad = []
    for name in protocol_calls(proto):
        have = getattr(cls, name, None)
        if have is None:
            bad.append(f"{name}: missing")
            continue
        want = [p for p in inspect.signature(getattr(proto, name)).parameters if p != "self"]
        got = [p for p in inspect.signature(have).parameters if p != "self"]
        if len(got) < len(want) and not any(p in ("a", "args") for p in got):
            bad.append(f"{name}{tuple(got)} != {tuple(want)}")
    return bad


def test_protocol_calls_are_the_declared_methods():
    assert {"stage", "build_progress", "progress", "cells", "lane", "cell_start", "cell_done"} == EVENT_CALLS
    assert "artifacts_dir" not in LEDGER_CALLS  # a property: each side has its own folder
    assert {"begin_cell", "finish_cell", "fail_cell", "device_fact"} <= LEDGER_CALLS


def test_local_objects_implement_the_protocols():
    assert _implements(Ledger, LaneLedger) == []
    assert _implements(HostWork, HostServices) == []


def test_cluster_relays_are_derived_from_the_protocols():
    head = pytest.importorskip("devicelab.cluster.head")
    assert _implements(head.RemoteLedger, LaneLedger) == []
    assert _implements(head.RemoteHostWork, HostServices) == []
    assert issubclass(head.RelayEvents, Events)

    class Queue:
        def __init__(self):
            self.items = []

        def put(self, item, timeout=None):
            self.items.append(item)

    q = Queue()
    ev = head.RelayEvents(q)
    ev.stage("hello")
    ev.cell_done("c", True, note="n")
    ev.cell_done("d", False)
    assert q.items == [("stage", ("hello",)), ("cell_done", ("c", True, "n")), ("cell_done", ("d", False, ""))]
    assert not hasattr(ev, "not_an_event")

    class Head:  # the head's ledger_call refuses what the Protocol does not name
        ledger = None

    with pytest.raises(DevicelabError, match="no call"):
        head.Head.__ray_actor_class__.ledger_call(Head(), "replace_rows", ("x", []), {})


def test_host_op_is_made_once_per_key_whoever_asks(tmp_path):
    calls = []
    gate = threading.Event()

    @host_op("test-op-once", DATA)
    def _op(host, n: int, spec: dict):
        calls.append((n, spec["a"]))
        gate.wait(5)
        return {"n": n}

    try:
        hw = HostWork(None, {}, tmp_path, Events())
        out: list = []
        threads = [threading.Thread(target=lambda: out.append(hw.op("test-op-once", 1, {"a": 2}))) for _ in range(4)]
        for t in threads:
            t.start()
        gate.set()
        for t in threads:
            t.join(10)
        assert out == [{"n": 1}] * 4 and calls == [(1, 2)]
        assert hw.op("test-op-once", 2, {"a": 2}) == {"n": 2} and len(calls) == 2
    finally:
        HOST_OPS.pop("test-op-once", None)


def test_unknown_host_op_names_the_available_ones(tmp_path):
    hw = HostWork(None, {}, tmp_path, Events())
    with pytest.raises(DevicelabError, match=r"unknown host operation 'nope'; available: .*kld-base-logits"):
        hw.op("nope")


def test_text_op_finds_a_recipe_relative_file(tmp_path):
    (tmp_path / "t.txt").write_text("some text")
    hw = HostWork(None, {}, tmp_path, Events())
    assert kinds.get_op("text").result == FILE
    assert hw.op("text", "t.txt", "eval data") == Path(tmp_path / "t.txt")
    with pytest.raises(DevicelabError, match="eval data missing.txt not found"):
        hw.op("text", "missing.txt", "eval data")
