"""The CUDA-graph cache's policy on the CPU (a stand-in CuPy): eager on a key's first call,
captured on its second, replayed after; one graph per key with its own workspace; least recently
used graphs dropped past CAPACITY; a refused capture falls back to eager for good."""
import sys
import types

import pytest

from cupy_moe.gpu import graphs


class _Graph:
    def __init__(self, log):
        self.log, self.launches = log, 0

    def launch(self, stream=None):
        self.launches += 1
        self.log.append(("replay", self))


class _Stream:
    current = None

    def __init__(self, ptr=7, non_blocking=False, log=None, refuse=False):
        self.ptr, self.log, self.refuse, self.capturing = ptr, log, refuse, False

    def __enter__(self):
        self.prev, _Stream.current = _Stream.current, self
        return self

    def __exit__(self, *exc):
        _Stream.current = self.prev
        return False

    def begin_capture(self):
        if self.refuse:
            raise RuntimeError("capture refused")
        self.capturing = True

    def end_capture(self):
        self.capturing = False
        return _Graph(self.log)


@pytest.fixture
def fake(monkeypatch):
    log, state = [], {"refuse": False}
    main = _Stream(ptr=7, log=log)
    _Stream.current = main
    cuda = types.SimpleNamespace(
        get_current_stream=lambda: _Stream.current,
        Device=lambda *a: types.SimpleNamespace(id=0),
        Stream=lambda non_blocking=False: _Stream(ptr=99, log=log, refuse=state["refuse"]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(graphs, "ENABLED", True)
    monkeypatch.setattr(graphs, "stats", {"eager": 0, "captured": 0, "replayed": 0})
    graphs.clear()
    yield log, state
    graphs.clear()


def _call(log, key, workspaces):
    def make():
        workspaces.append(object())
        return workspaces[-1]

    def enqueue(ws):
        log.append(("captured" if _Stream.current.capturing else "eager", key, ws))
    graphs.run(key, make, enqueue)


def test_eager_then_capture_then_replay(fake):
    log, _ = fake
    ws = []
    for _ in range(4):
        _call(log, ("a",), ws)
    kinds = [e[0] for e in log]
    assert kinds == ["eager", "captured", "replay", "replay", "replay"]
    assert graphs.stats == {"eager": 1, "captured": 1, "replayed": 2}
    assert log[1][2] is ws[1] and len(ws) == 2  # the graph keeps its own workspace; no more made


def test_keys_are_separate_and_lru_bounded(fake, monkeypatch):
    log, _ = fake
    monkeypatch.setattr(graphs, "CAPACITY", 2)
    ws = []
    for key in ("a", "a", "b", "b", "c", "c"):  # three graphs captured, the oldest dropped
        _call(log, (key,), ws)
    assert graphs.stats["captured"] == 3 and len(graphs._graphs) == 2
    log.clear()
    _call(log, ("a",), ws)  # "a" was dropped but is remembered as seen: captured again
    assert [e[0] for e in log] == ["captured", "replay"]


def test_disabled_always_eager(fake, monkeypatch):
    log, _ = fake
    monkeypatch.setattr(graphs, "ENABLED", False)
    for _ in range(3):
        _call(log, ("a",), [])
    assert [e[0] for e in log] == ["eager"] * 3


def test_refused_capture_stays_eager(fake):
    log, state = fake
    state["refuse"] = True
    for _ in range(3):
        _call(log, ("a",), [])
    assert [e[0] for e in log] == ["eager"] * 3 and graphs.stats["captured"] == 0
