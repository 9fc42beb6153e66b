"""The GEMM launcher's host side on the CPU (a stand-in CuPy, no kernels): parameter blocks are
built once per distinct call and replayed byte for byte; any changed address or size builds anew."""
import ctypes
import sys
import types

import pytest

from cupy_moe.gpu import gemm as G
from cupy_moe.gpu import tma


class _Array:
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


@pytest.fixture
def host(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(G, "_device_info", lambda device_id: ("90", 132))
    monkeypatch.setattr(G, "_prepared", {})
    monkeypatch.setattr(G, "_sm90_module", lambda cfg: ("sm90", cfg))
    monkeypatch.setattr(G, "_module", lambda cfg: ("mma", cfg))
    monkeypatch.setattr(tma, "_encoded", {})

    def encode(desc, address, dims, strides, box):  # deterministic bytes per map
        raw = repr((address, dims, strides, box)).encode()[:128].ljust(128, b"\0")
        ctypes.memmove(ctypes.addressof(desc), raw, 128)

    monkeypatch.setattr(tma, "_encode", encode)
    launches, prepares = [], []
    monkeypatch.setattr(G._launch, "launch", lambda mod, name, grid, block, args, smem:
                        launches.append((mod, name, grid, block, bytes(args[0]), smem)))
    real_prepare = G._prepare
    monkeypatch.setattr(G, "_prepare", lambda *a: prepares.append(a) or real_prepare(*a))
    return launches, prepares


def _call(out_ptr=0x9000_0000, k=4096, engine="auto"):
    a, b = _Array(0x1000_0000), _Array(0x2000_0000)
    G.gemm(m=192, n=1408, segments=[G.Segment(a, 4096, b, 1408, k=k)], a_kmajor=True,
           b_kmajor=False, out=_Array(out_ptr), ldc=1408, engine=engine)


def test_repeated_calls_replay_the_same_parameters(host):
    launches, prepares = host
    _call()
    _call()
    assert len(prepares) == 1 and len(launches) == 2
    assert launches[0] == launches[1]
    assert launches[0][0][0] == "sm90" and launches[0][1] == "gemm_sm90_kernel"


def test_a_changed_address_or_size_builds_anew(host):
    launches, prepares = host
    _call()
    _call(out_ptr=0xA000_0000)
    _call(k=2048)
    _call(engine="mma")
    assert len(prepares) == 4
    first, moved, shorter, portable = (l[4] for l in launches)
    assert first != moved and first != shorter
    P1, P2 = (G.GemmSm90Params.from_buffer_copy(b) for b in (first, moved))
    assert (P1.base.c, P2.base.c) == (0x9000_0000, 0xA000_0000)
    assert bytes(P1.tma_c) != bytes(P2.tma_c) and bytes(P1.tma_a) == bytes(P2.tma_a)
    assert launches[3][0][0] == "mma" and len(portable) == ctypes.sizeof(G.GemmParams)
