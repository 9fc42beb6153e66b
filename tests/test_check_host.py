"""The host half of the top-k check's protocol on the CPU (cuda_src/common/topk_check.cuh; a
stand-in CuPy and stream): a check waits for its done flag, reads the verdict, says when its
stream finished without one, and a failed call's settle() swallows the stream's error."""
import importlib
import sys
import types

import numpy as np
import pytest

NO_ROW = 0x7FFFFFFF


@pytest.fixture
def routing(monkeypatch):
    try:  # the device: the real CuPy (gpu/routing.py binds the module it imports)
        importlib.import_module("cupy")
    except ImportError:
        monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    from cupy_moe.gpu import routing
    return routing


def _check(routing, report, done=True, sync=lambda: None):
    buffers = types.SimpleNamespace(report=np.array(report, np.int32), device_report=0x2000,
                                    scratch=types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x1000)))
    stream = types.SimpleNamespace(done=done, synchronize=sync)
    return routing.PendingCheck(stream, buffers)


def test_a_set_flag_gives_the_verdict(routing):
    assert _check(routing, [NO_ROW, NO_ROW, 1]).result() == (None, None)
    assert _check(routing, [5, NO_ROW, 1]).result() == (5, None)
    assert _check(routing, [NO_ROW, 7, 1]).result() == (None, 7)


def test_the_verdict_word_follows_the_scratch(routing):
    assert _check(routing, [NO_ROW, NO_ROW, 1]).cancel == 0x1000 + 3 * 4


def test_a_finished_stream_without_a_verdict_raises(routing):
    with pytest.raises(RuntimeError, match="without reporting"):
        _check(routing, [NO_ROW, NO_ROW, 0]).result()


def test_the_streams_own_error_comes_first(routing):
    def sync():
        raise MemoryError("the stream's error")
    with pytest.raises(MemoryError):
        _check(routing, [NO_ROW, NO_ROW, 0], sync=sync).result()


def test_settle_waits_and_keeps_the_error_under_way(routing):
    waited = []

    def sync():
        waited.append(True)
        raise RuntimeError("an earlier launch failed")
    _check(routing, [NO_ROW, NO_ROW, 0], sync=sync).settle()
    assert waited
