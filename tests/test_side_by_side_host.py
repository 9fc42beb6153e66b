"""side_by_side's share of the SMs, on the CPU: two GEMMs at once only where that takes fewer
rounds of tiles (weighted by each tile's reduction steps) than one after the other."""
import importlib
import sys
import types

import pytest


@pytest.fixture
def split_sms(monkeypatch):
    try:  # the device: the real CuPy
        importlib.import_module("cupy")
    except ImportError:
        fake = types.ModuleType("cupy")
        fake.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0))
        monkeypatch.setitem(sys.modules, "cupy", fake)
    from cupy_moe.gpu import side_by_side

    return side_by_side.split_sms


@pytest.mark.parametrize("tiles,steps,sms,split", [
    ((352, 176), (128, 128), 132, 88),   # the shared expert's wgrads at T = 8192: 4 rounds, not 5
    ((176, 352), (128, 128), 132, 44),
    ((264, 132), (128, 128), 132, 0),    # whole rounds already: 2 + 1 either way
    ((352, 176), (3, 3), 132, 0),        # T = 192: 3 k-steps a tile gain less than a fork costs
    ((0, 176), (128, 128), 132, 0),
    ((10, 10), (64, 64), 1, 0),
])
def test_split_sms(split_sms, tiles, steps, sms, split):
    assert split_sms(tiles, steps, sms) == split


def test_split_sms_balances_unequal_reductions(split_sms):
    """A tile of the first takes 4x the steps of the second's: 150 of them on 75 SMs (2 rounds,
    512 steps) beside 300 on 57 (6 rounds, 384), against 2 + 3 rounds (704) one after the other."""
    from cupy_moe._launch import cdiv

    c = split_sms((150, 300), (256, 64), 132)
    assert max(cdiv(150, c) * 256, cdiv(300, 132 - c) * 64) == 512
    assert cdiv(150, c) == 2


@pytest.mark.parametrize("moved,flop,sms,rate,free", [
    (604e6, 94.5e9, 132, 4e6, 42),    # the dy scatter beside the shared d_act at T = 8192 (GLM-4.5-Air)
    (738e6, 756e9, 132, 4.4e6, 10),   # the combine beside the routed dWg there: 9 left it a tail alone
    (738e6, 756e9, 132, 4e6, 9),      # the same at the slower rate
    (738e6, 283e9, 132, 4e6, 21),     # the combine beside the shared weight gradients (a smaller GEMM)
    (604e6, 1e6, 132, 4e6, 66),       # at most half the SMs
    (1e6, 1e6, 132, 4e6, 0),          # a kernel of ~0.2 us on its own: not worth a fork
    (604e6, 0, 132, 4e6, 0),          # no GEMM to stand beside
])
def test_free_sms(split_sms, moved, flop, sms, rate, free):
    """side_by_side.free_sms: the SMs a memory-bound kernel gets beside a GEMM so that the longer
    of the two ends first (BYTES_PER_SM_US, the GEMM's rate), none where its time alone is short."""
    from cupy_moe.gpu import side_by_side

    assert side_by_side.free_sms(moved, flop, sms, rate) == free
    kernel, work = moved / side_by_side.BYTES_PER_SM_US, flop / rate
    if free and free < sms // 2:  # no count ends both sooner
        best = max(kernel / free, work / (sms - free))
        assert all(max(kernel / f, work / (sms - f)) >= best for f in range(1, sms // 2 + 1))


def test_gemm_rate_by_grouping(split_sms):
    """The layer's GEMM beside a row move runs at its kind's measured rate: the routed dWg
    (K-grouped) beside the combine, the shared d_act beside the dy scatter."""
    from cupy_moe.gpu import side_by_side

    assert side_by_side.gemm_rate(dict(grouping="k")) == side_by_side.K_GROUPED_FLOP_PER_SM_US
    assert side_by_side.gemm_rate(dict(m=8192)) == side_by_side.FLOP_PER_SM_US


def test_side_streams_are_kept_per_stream_and_event_names(monkeypatch):
    """streams.Side: one side stream and one event per name, made once per (device, caller's
    stream, names); SOL-080's four events and side_by_side's two are separate sides."""
    fake = types.ModuleType("cupy")
    made = []
    fake.cuda = types.SimpleNamespace(
        Device=lambda *a: types.SimpleNamespace(id=0),
        Stream=lambda non_blocking: made.append("stream") or object(),
        Event=lambda disable_timing: made.append("event") or object())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    import cupy_moe.gpu as gpu

    # A fresh copy of the module bound to the stand-in (the real one, if imported, comes back).
    monkeypatch.delitem(sys.modules, "cupy_moe.gpu.streams", raising=False)
    if hasattr(gpu, "streams"):
        monkeypatch.setattr(gpu, "streams", gpu.streams)
    streams = importlib.import_module("cupy_moe.gpu.streams")
    monkeypatch.setitem(sys.modules, "cupy_moe.gpu.streams", streams)  # removed again at teardown

    main, other = types.SimpleNamespace(ptr=1), types.SimpleNamespace(ptr=2)
    sol = streams.Side.of(main, ("fork", "d_act_done", "router_done", "join"))
    assert streams.Side.of(main, ("fork", "d_act_done", "router_done", "join")) is sol
    pair = streams.Side.of(main, ("fork", "join"))
    assert pair is not sol and streams.Side.of(other, ("fork", "join")) is not pair
    assert sol.fork is not sol.join and sol.router_done is not sol.d_act_done
    assert made.count("stream") == 3 and made.count("event") == 8
