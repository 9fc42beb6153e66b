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
    monkeypatch.setattr(G._launch, "max_active_clusters", lambda *a: None)  # the driver's answer
    monkeypatch.setattr(tma, "_encoded", {})

    def encode(desc, address, dims, strides, box, dtype):  # deterministic bytes per map
        raw = repr((address, dims, strides, box, dtype)).encode()[:128].ljust(128, b"\0")
        ctypes.memmove(ctypes.addressof(desc), raw, 128)

    monkeypatch.setattr(tma, "_encode", encode)
    pairs = iter(range(0xC000_0000, 0xD000_0000, 8))
    monkeypatch.setattr(G, "_tile_counter", lambda: next(pairs))  # a fresh zeroed pair each
    launches, prepares = [], []
    monkeypatch.setattr(G._launch, "launch", lambda mod, name, grid, block, args, smem, cluster=1:
                        launches.append((mod, name, grid, block, bytes(args[0]), smem) +
                                        ((cluster,) if cluster > 1 else ())))
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


class _Scratch(_Array):
    """What the stand-in cupy.empty hands out: an address; the row sums of such scratch
    (elementwise.row_partial_sums) are recorded in sums."""

    sums = []


@pytest.fixture
def scratch(host, monkeypatch):
    fake = sys.modules["cupy"]
    counter = iter(range(0xB000_0000, 0xC000_0000, 0x100_0000))
    fake.empty = lambda shape, dtype: _Scratch(next(counter))
    fake.float32 = "float32"
    import cupy_moe.gpu

    name = "cupy_moe.gpu.elementwise"
    imported_here = name not in sys.modules  # then it binds the stand-in: forget it afterwards
    from cupy_moe.gpu import elementwise

    calls = []
    monkeypatch.setattr(elementwise, "swiglu_backward", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(elementwise, "row_partial_sums", lambda partial, out: _Scratch.sums.append(
        (partial.data.ptr, out)))
    _Scratch.sums.clear()
    yield calls
    if imported_here:
        sys.modules.pop(name, None)
        if getattr(cupy_moe.gpu, "elementwise", None) is elementwise:
            delattr(cupy_moe.gpu, "elementwise")


def _swiglu_call(ldc=1408, engine="auto"):
    arrays = [_Array(0x3000_0000 + i * 0x100_0000) for i in range(9)]
    sw = G.SwigluBackward(gate=arrays[0], up=arrays[1], dg=arrays[2], du=arrays[3], act=arrays[4],
                          weights=arrays[5], row_index=arrays[6], aw=arrays[7], dw=arrays[8])
    G.gemm(m=300, n=1408, segments=[G.Segment(_Array(0x1000_0000), 4096, _Array(0x2000_0000), 1408,
                                              k=4096)],
           a_kmajor=True, b_kmajor=False, out=None, ldc=ldc, epilogue="swiglu_backward",
           swiglu=sw, engine=engine)
    return sw


def test_fused_swiglu_gets_fresh_row_partials_each_call(host, scratch):
    launches, prepares = host
    sw = _swiglu_call()
    sw2 = _swiglu_call()
    assert len(prepares) == 1 and len(launches) == 2
    P = [G.GemmSm90Params.from_buffer_copy(l[4]) for l in launches]
    assert P[0].base.e_row_partial != P[1].base.e_row_partial  # each call its own partials
    assert P[0].base.e_partial_ld == 1408 // 128 and P[0].base.e_dg == sw.dg.data.ptr
    assert _Scratch.sums == [(P[0].base.e_row_partial, sw.dw), (P[1].base.e_row_partial, sw2.dw)]
    assert not scratch  # the fused path never calls the elementwise kernel


def test_unfused_swiglu_on_the_portable_loop(host, scratch):
    launches, prepares = host
    sw = _swiglu_call(engine="mma")
    assert len(launches) == 1 and launches[0][0][0] == "mma"
    p = G.GemmParams.from_buffer_copy(launches[0][4])
    assert p.c != 0 and p.ldc == 1408  # an fp32 da' scratch the elementwise kernel reads
    (args, kw), = scratch
    assert args[1:] == (sw.gate, sw.up, sw.act, sw.weights, sw.row_index)
    assert kw["out"] == (sw.dg, sw.du, sw.dw, sw.aw)


@pytest.mark.parametrize("pingpong", [False, True])
def test_every_chosen_config_fits_shared_memory(pingpong):
    """Whatever Sm90Config.choose picks (every tile width, store path, grouping, up to 256
    experts' scheduler table) fits in sm_90's 227 KB of shared memory per block."""
    for n in (8, 64, 72, 128, 200, 256, 1408, 2816, 4096):
        for m_tiles in (1, 64, 1000):
            for grouping, groups in ((0, 0), (1, 8), (1, 128), (1, 256), (2, 128)):
                for c_tma in (False, True):
                    cfg = G.Sm90Config.choose(m_tiles, n, 132, groups if grouping == 1 else 0,
                                              pingpong, GROUPING=grouping, C_TMA=c_tma)
                    table = groups if grouping == 1 else 0
                    assert 2 <= cfg.STAGES <= 8, cfg
                    assert cfg.smem_bytes(table) <= G.Sm90Config.SMEM_LIMIT, (cfg, table)


def test_pingpong_tma_store_tiles_take_a_sixth_stage_through_a_store_ring(monkeypatch):
    """Ping-pong 128 x 128 tiles with bf16 TMA stores stage their results through a ring of two
    64 x 64 units per warpgroup (PINGPONG_STORE_RING), which leaves room for a 6th stage; narrow
    (64-wide) tiles, fp32 results (no TMA stores) and PINGPONG_STORE_RING = 0 keep whole-tile
    staging."""
    for grouping in (0, 2):
        cfg = G.Sm90Config.choose(30, 4096, 132, 0, True, GROUPING=grouping, C_TMA=True,
                                  A_KMAJOR=False, B_KMAJOR=False)
        assert (cfg.BN, cfg.PINGPONG, cfg.STORE_RING, cfg.STAGES) == (128, True, 2, 6), cfg
        assert cfg.smem_bytes(0) <= G.Sm90Config.SMEM_LIMIT
    assert G.Sm90Config.choose(30, 64, 132, 0, True, C_TMA=True).STORE_RING == 0
    assert G.Sm90Config.choose(30, 4096, 132, 0, True, C_TMA=False).STORE_RING == 0
    monkeypatch.setattr(G, "PINGPONG_STORE_RING", 0)
    cfg = G.Sm90Config.choose(30, 4096, 132, 0, True, C_TMA=True)
    assert (cfg.STORE_RING, cfg.STAGES) == (0, 5), cfg


def test_wide_tma_store_tiles_keep_four_stages_through_a_store_ring(monkeypatch):
    """Cooperative 128 x 256 tiles with bf16 TMA stores stage their results through a ring of
    two 64 x 64 units per warpgroup, which leaves room for a 4th stage (with 256 experts'
    table too); without the ring (STORE_RING = 0) they keep whole-tile staging and 3 stages."""
    for groups in (0, 128, 256):
        cfg = G.Sm90Config.choose(1000, 4096, 132, groups, False, GROUPING=1 if groups else 0, C_TMA=True)
        assert (cfg.BN, cfg.STORE_RING, cfg.STAGES) == (256, 2, 4), cfg
        assert cfg.smem_bytes(groups) <= G.Sm90Config.SMEM_LIMIT
    assert G.Sm90Config.choose(1000, 4096, 132, 0, False, C_TMA=False).STORE_RING == 0
    assert G.Sm90Config.choose(1000, 128, 132, 0, False, C_TMA=True).STORE_RING == 0
    monkeypatch.setattr(G, "STORE_RING", 0)
    cfg = G.Sm90Config.choose(1000, 4096, 132, 0, False, C_TMA=True)
    assert (cfg.STORE_RING, cfg.STAGES) == (0, 3), cfg


def test_swiglu_epilogue_staged_where_aligned(host, scratch, monkeypatch):
    """Routed experts and the shared expert alike stage their accumulators for the epilogue
    warps (128-wide tiles); an unaligned row, a narrow output, the switch off or ping-pong
    consumers take the per-thread path."""
    launches, _ = host
    _swiglu_call()
    cfg = launches[-1][0][1]
    assert cfg.E_STAGED and cfg.BN == 128 and not cfg.PINGPONG
    assert cfg.smem_bytes(0) <= G.Sm90Config.SMEM_LIMIT
    plain = G.SwigluBackward(gate=_Array(0x3000_0000), up=_Array(0x3100_0000),
                             dg=_Array(0x3200_0000), du=_Array(0x3300_0000))
    G.gemm(m=300, n=1408, segments=[G.Segment(_Array(0x1000_0000), 4096, _Array(0x2000_0000), 1408,
                                              k=4096)],
           a_kmajor=True, b_kmajor=False, out=None, ldc=1408, epilogue="swiglu_backward", swiglu=plain)
    assert launches[-1][0][1].E_STAGED
    _swiglu_call(ldc=1410)  # rows not on 4-element boundaries
    assert not launches[-1][0][1].E_STAGED
    monkeypatch.setattr(G, "STAGED_EPILOGUE", False)
    _swiglu_call()
    assert not launches[-1][0][1].E_STAGED
    monkeypatch.setattr(G, "STAGED_EPILOGUE", True)
    monkeypatch.setattr(G, "PINGPONG", True)
    _swiglu_call()
    assert not launches[-1][0][1].E_STAGED and launches[-1][0][1].PINGPONG


@pytest.mark.parametrize("T,d_act,dgrad", [(0, 1, 1), (1, 8, 4), (192, 6, 2), (293, 4, 1),
                                           (384, 4, 1), (512, 3, 1), (640, 2, 1), (997, 1, 1),
                                           (8192, 1, 1)])
def test_split_k_pieces_for_sol080_shapes(T, d_act, dgrad):
    """SOL-080's d_act (T x 1408 x 4096) and dgrad (T x 4096 x 2944) on 132 SMs: pieces only
    while the output tiles fill less than half the SMs, as many as the SMs hold, at most 8."""
    assert G.k_splits_for(T, 1408, 4096, sms=132) == d_act
    assert G.k_splits_for(T, 4096, 2944, sms=132) == dgrad


def test_split_k_keeps_eight_k_tiles_per_piece():
    assert G.k_splits_for(100, 100, 64 * 15, sms=132) == 1  # 15 k-tiles: one piece of 8 at most
    assert G.k_splits_for(100, 100, 64 * 16, sms=132) == 2


@pytest.mark.parametrize("tiles,ctas", [(0, 0), (1, 1), (88, 88), (132, 132), (133, 67), (187, 94),
                                        (264, 132), (330, 110), (528, 132), (704, 118)])
def test_even_round_ctas_keep_the_rounds_with_the_fewest_ctas(tiles, ctas):
    """SOL-080's d_act tile counts on 132 SMs (T = 997 .. 8192): as many rounds as one CTA per
    SM takes, and one CTA fewer would take another round."""
    assert G.even_round_ctas(tiles, 132) == ctas
    if tiles:
        rounds = G.cdiv(tiles, min(tiles, 132))
        assert G.cdiv(tiles, ctas) == rounds
        assert ctas == 1 or G.cdiv(tiles, ctas - 1) > rounds


@pytest.mark.parametrize("splits,even,ctas", [(1, False, 22), (6, False, 132), (6, True, 132),
                                              (4, False, 88), (8, True, 88)])
def test_split_k_and_even_round_launches(host, splits, even, ctas):
    """SOL-080's d_act at T = 192 (2 x 11 output tiles of 128): split-K compiles the SPLIT_K
    config, puts the piece count where the kernel reads it (GemmParams.num_groups) and launches
    one CTA per tile and piece up to the SMs; even_rounds keeps the rounds with fewer CTAs
    (176 work items: 2 rounds of 88)."""
    launches, _ = host
    G.gemm(m=192, n=1408, segments=[G.Segment(_Array(0x1000_0000), 4096, _Array(0x2000_0000), 1408,
                                              k=4096)],
           a_kmajor=True, b_kmajor=False, out=_Array(0x9000_0000), ldc=1408, epilogue="f32",
           k_splits=splits, c_group_stride=192 * 1408 if splits > 1 else 0, even_rounds=even)
    (kind, cfg), name, grid, _, params, _ = launches[-1]
    assert kind == "sm90" and cfg.SPLIT_K == (splits > 1) and grid[0] == ctas
    base = G.GemmSm90Params.from_buffer_copy(params).base
    assert base.num_groups == (splits if splits > 1 else 0)


@pytest.mark.parametrize("epilogue,n", [("bf16", 4096), ("swiglu_backward", 1408)])
def test_split_k_with_a_final_epilogue_launches_a_cluster_per_tile(host, epilogue, n):
    """k_splits with a bf16 or SwiGLU result: the S pieces of each 128 x 128 tile are one cluster
    of S CTAs (grid = tiles x S, no persistent rounds), the config sums them in the kernel."""
    launches, _ = host
    a, b, out = _Array(0x1000_0000), _Array(0x2000_0000), _Array(0x9000_0000)
    sw = None
    if epilogue == "swiglu_backward":
        sw = G.SwigluBackward(gate=_Array(0x3000_0000), up=_Array(0x4000_0000),
                              dg=_Array(0x5000_0000), du=_Array(0x5000_0000 + 2 * n),
                              ld_grad=2 * n, contract_rounding=True)
    G.gemm(m=192, n=n, segments=[G.Segment(a, 4096, b, n, k=4096)], a_kmajor=True,
           b_kmajor=False, out=out, ldc=n, epilogue=epilogue, swiglu=sw, k_splits=5)
    (mod, name, grid, block, _, smem, cluster), = launches
    cfg = mod[1]
    assert cfg.SPLIT_K and cfg.SPLIT_CLUSTER and cfg.BN == 128 and not cfg.C_TMA and not cfg.PINGPONG
    assert cluster == 5 and grid == (2 * G.cdiv(n, 128) * 5,)


def test_split_k_clusters_take_fewer_pieces_where_too_few_fit(host, monkeypatch):
    """The driver says how many clusters of S CTAs fit at once (they share a GPC); with one tile
    per CTA every cluster should be resident, so S drops until they all fit (never below 2)."""
    launches, _ = host
    fits = {8: 8, 7: 8, 6: 16, 5: 24, 4: 32}  # e.g. 16-SM GPCs
    monkeypatch.setattr(G._launch, "max_active_clusters", lambda m, n, t, s, cluster: fits[cluster])
    a, b, out = _Array(0x1000_0000), _Array(0x2000_0000), _Array(0x9000_0000)
    G.gemm(m=192, n=1408, segments=[G.Segment(a, 4096, b, 1408, k=4096)], a_kmajor=True,
           b_kmajor=False, out=out, ldc=1408, epilogue="bf16", k_splits=8)
    (mod, name, grid, block, params, smem, cluster), = launches
    assert cluster == 5 and grid == (22 * 5,)  # 22 tiles: 24 clusters of 5 fit, 16 of 6 do not
    P = G.GemmSm90Params.from_buffer_copy(params)
    assert P.base.num_groups == 5


@pytest.mark.parametrize("paired", [True, False])
def test_router_wgrad_groups_and_halves_launch_one_cluster_per_output_tile(host, monkeypatch, paired):
    """gemm(sum_groups_and_halves): [hi; lo] (m = 256) in 2 token pieces, one cluster per 128 x
    128 output tile of the [128, 4096] result: of its 2 pieces, each CTA multiplying both halves'
    rows (PAIRED_HALVES, 4 stages of 256 + 128 rows), or of 2 x 2 CTAs in (piece, half) order."""
    launches, _ = host
    monkeypatch.setattr(G, "PAIRED_HALVES", paired)
    a, b, out = _Array(0x1000_0000), _Array(0x2000_0000), _Array(0x9000_0000)
    G.gemm(m=256, n=4096, segments=[G.Segment(a, 256, b, 4096, k=8192)], a_kmajor=False,
           b_kmajor=False, out=out, ldc=4096, epilogue="f32", grouping="k", num_groups=2,
           sum_groups_and_halves=True)
    (mod, name, grid, block, params, smem, cluster), = launches
    cfg = mod[1]
    assert cfg.GROUPING == 2 and cfg.SPLIT_CLUSTER and not cfg.SPLIT_K and cfg.BN == 128
    assert cfg.PAIR_ROWS == paired and cfg.STAGES == (4 if paired else 6)
    assert (cluster, grid) == ((2, (32 * 2,)) if paired else (4, (32 * 4,)))
    P = G.GemmSm90Params.from_buffer_copy(params).base
    assert P.num_groups == 2 and P.m == 256  # (the kernel's result rows: m / 2)


def test_each_prepared_launch_claims_tiles_with_its_own_counters(host, monkeypatch):
    """Dynamic tile claims: every prepared Hopper launch that claims gets a counter pair of its own
    (two launches on different streams may overlap), replays reuse it (the kernel leaves it
    zeroed); "grouped" claims for grouped GEMMs only, "none" never, and a cluster launch (one
    tile per CTA) keeps the static order (null) whatever the switch."""
    launches, prepares = host
    counter = lambda: G.GemmSm90Params.from_buffer_copy(launches[-1][4]).base.tile_counter
    _call()
    assert counter() is None  # the default, "grouped": a dense GEMM keeps the static order
    monkeypatch.setattr(G, "DYNAMIC_TILES", "all")
    _call()
    _call()
    _call(out_ptr=0xA000_0000)
    first, again, other = (G.GemmSm90Params.from_buffer_copy(l[4]).base.tile_counter for l in launches[1:])
    assert first and first == again and other and other != first
    monkeypatch.setattr(G, "DYNAMIC_TILES", "none")
    _call()
    assert len(prepares) == 4 and counter() is None
    monkeypatch.setattr(G, "DYNAMIC_TILES", "grouped")
    G.gemm(m=300, n=1408, segments=[G.Segment(_Array(0x1000_0000), 1408, _Array(0x2000_0000), 4096, k=4096)],
           a_kmajor=False, b_kmajor=False, out=_Array(0x9000_0000), ldc=1408, c_group_stride=300 * 1408,
           grouping="k", group_offsets=_Array(0x8000_0000), num_groups=4)
    assert counter()  # grouped: claims
    monkeypatch.setattr(G, "DYNAMIC_TILES", "all")
    a, b, out = _Array(0x1000_0000), _Array(0x2000_0000), _Array(0x9000_0000)
    G.gemm(m=192, n=4096, segments=[G.Segment(a, 4096, b, 4096, k=4096)], a_kmajor=True,
           b_kmajor=False, out=out, ldc=4096, epilogue="bf16", k_splits=5)
    assert launches[-1][-1] == 5  # a cluster launch
    assert G.GemmSm90Params.from_buffer_copy(launches[-1][4]).base.tile_counter is None


@pytest.mark.parametrize("tiles,ctas,heavy,rotation", [
    (368, 132, 16, 264),   # SOL-080's fused weight gradient: heavy tiles at positions 104 .. 119
    (368, 132, 0, 0),      # nothing heavy
    (264, 132, 16, 0),     # whole rounds: nowhere better to put them
    (368, 132, 29, 0),     # more heavy tiles than CTAs with one tile fewer (28)
    (115, 115, 5, 0)])     # one round
def test_heavy_tiles_rotation(tiles, ctas, heavy, rotation):
    assert G._heavy_tiles_rotation(tiles, ctas, heavy) == rotation
    if rotation:
        r = tiles % ctas
        positions = [(u - rotation) % tiles for u in range(heavy)]  # where tile u lands
        assert all(r <= p < ctas for p in positions)  # first round, CTAs with one tile fewer


def test_no_counter_inside_a_capture_means_the_static_config(host, monkeypatch):
    """A launch prepared inside a stream capture before any counter pair exists gets none
    (_tile_counter() gives 0): it must then run a static config, never the dynamic one with a
    null counter."""
    launches, _ = host
    monkeypatch.setattr(G, "_tile_counter", lambda: 0)
    G.gemm(m=300, n=1408, segments=[G.Segment(_Array(0x1000_0000), 1408, _Array(0x2000_0000), 4096, k=4096)],
           a_kmajor=False, b_kmajor=False, out=_Array(0x9000_0000), ldc=1408, c_group_stride=300 * 1408,
           grouping="k", group_offsets=_Array(0x8000_0000), num_groups=4)
    (kind, cfg), *_ = launches[-1]
    assert not cfg.DYNAMIC
    assert G.GemmSm90Params.from_buffer_copy(launches[-1][4]).base.tile_counter is None


def test_f32_results_take_tma_stores_through_the_ring(host, monkeypatch):
    """The layer's dx_rest shape (fp32 [8192, 4096]): 128 x 256 tiles whose fp32 results leave
    through the store ring (4 stages), with an fp32 C map of 64-row, 32-column (128-byte) boxes.
    With F32_TMA off, or a leading dimension off 16 bytes, they leave from registers."""
    launches, _ = host
    maps = []
    real = tma._encode
    monkeypatch.setattr(tma, "_encode", lambda desc, address, dims, strides, box, dtype:
                        maps.append((address, dims, box, dtype)) or real(desc, address, dims, strides, box, dtype))
    a, b = _Array(0x1000_0000), _Array(0x2000_0000)
    call = lambda out, ldc: G.gemm(m=8192, n=4096, segments=[G.Segment(a, 3072, b, 4096, k=3072)], a_kmajor=True,
                                   b_kmajor=False, out=_Array(out), ldc=ldc, epilogue="f32")
    call(0x9000_0000, 4096)
    cfg = launches[-1][0][1]
    assert (cfg.BN, cfg.C_TMA, cfg.STORE_RING, cfg.STAGES) == (256, True, 2, 4)
    assert (0x9000_0000, (4096, 8192, 1), (32, 64, 1), "f32") in maps
    monkeypatch.setattr(G, "F32_TMA", False)
    call(0xA000_0000, 4096)
    cfg = launches[-1][0][1]
    assert (cfg.BN, cfg.C_TMA, cfg.STORE_RING, cfg.STAGES) == (256, False, 0, 4)
    monkeypatch.setattr(G, "F32_TMA", True)
    call(0xB000_0000, 4098)
    assert not launches[-1][0][1].C_TMA


def test_out_transposed_takes_wide_tiles_and_the_transposed_map(host, monkeypatch):
    """gemm(out_transposed): SOL-080's grad_Wd as (act^T g)^T, m = 1408, n = 4096, is a C_TRANS
    config of 128 x 256 tiles, and its C map describes the stored array, [n rows of m] with the
    row stride ldc; what it cannot store (fp32, M-grouped, rows not in 8s) is refused first."""
    launches, _ = host
    maps = []
    real = tma._encode
    monkeypatch.setattr(tma, "_encode", lambda desc, address, dims, strides, box, dtype:
                        maps.append((address, dims, strides)) or real(desc, address, dims, strides, box, dtype))
    act, g, out = _Array(0x1000_0000), _Array(0x2000_0000), _Array(0x9000_0000)
    G.gemm(m=1408, n=4096, segments=[G.Segment(act, 1408, g, 4096, k=8192)], a_kmajor=False,
           b_kmajor=False, out=out, ldc=1408, out_transposed=True)
    (mod, name, grid, *_), = launches
    cfg = mod[1]
    assert cfg.C_TRANS and cfg.C_TMA and cfg.BN == 256 and grid == (132,)
    assert (0x9000_0000, (1408, 4096, 1), (1408, 1408 * 4096)) in maps
    seg = [G.Segment(act, 1408, g, 4096, k=8192)]
    assert G.transposed_applies(1408, 4096, seg, False, False, out, 1408)
    assert not G.transposed_applies(1408, 4096, seg, False, False, out, 1412)
    assert not G.transposed_applies(1408, 4096, seg, False, False, out, 1408, grouping="m")
    for bad in (dict(epilogue="f32"), dict(ldc=1412), dict(grouping="m", group_offsets=_Array(0x3000_0000),
                                                            num_groups=4)):
        kw = dict(m=1408, n=4096, segments=[G.Segment(act, 1408, g, 4096, k=8192)], a_kmajor=False,
                  b_kmajor=False, out=out, ldc=1408, out_transposed=True)
        with pytest.raises(ValueError, match="out_transposed"):
            G.gemm(**dict(kw, **bad))


def test_launch_tiles_of_the_shared_expert_weight_gradients(host):
    """launch_tiles is the persistent grid's tile count (side_by_side shares the SMs by it): at
    T = 8192, [dWsg; dWsu] (2816 x 4096) in 22 x 16 tiles of 128 x 256, dWsd stored transposed
    (1408 x 4096) in 11 x 16; nothing where there is nothing to compute; no launch either way."""
    launches, _ = host
    x, d = _Array(0x1000_0000), _Array(0x2000_0000)
    wgu = dict(m=2816, n=4096, segments=[G.Segment(d, 2816, x, 4096, k=8192)], a_kmajor=False,
               b_kmajor=False, out=_Array(0x9000_0000), ldc=4096)
    wd = dict(m=1408, n=4096, segments=[G.Segment(d, 1408, x, 4096, k=8192)], a_kmajor=False,
              b_kmajor=False, out=_Array(0xA000_0000), ldc=1408, out_transposed=True)
    assert G.launch_tiles(**wgu) == 352
    assert G.launch_tiles(**wd) == 176
    assert G.launch_tiles(**dict(wgu, m=0)) == 0
    assert launches == []


@pytest.mark.parametrize("H,I,wide", [(4096, 1408, False),   # GLM-4.5-Air: 23 MB of [Wg; Wu] a expert
                                      (5120, 1536, False),   # GLM-4.5: 31.5 MB
                                      (7168, 2048, True)])   # DeepSeek-V3: 58.7 MB
def test_m_grouped_bands_where_an_experts_weights_fill_the_l2(host, H, I, wide):
    """gemm.m_grouped_band: the routed dgrad [dg | du] @ [Wg; Wu] walks its row tiles in bands of
    WIDE_B_BAND where one expert's B is over WIDE_B_BYTES (DeepSeek-V3), the plain order
    elsewhere; the fused dgrad's Wd (half those bytes) keeps the plain order at every model."""
    launches, _ = host
    rows, offsets = 65536, _Array(0x8000_0000)
    dg, du, dy, wg, wu, wd = (_Array(0x1000_0000 * (i + 1)) for i in range(6))
    G.gemm(m=rows, n=H, segments=[G.Segment(dg, I, wg, H, k=I, b_group_stride=I * H),
                                  G.Segment(du, I, wu, H, k=I, b_group_stride=I * H)],
           a_kmajor=True, b_kmajor=False, out=_Array(0x9000_0000), ldc=H, grouping="m",
           group_offsets=offsets, num_groups=128)
    assert launches[-1][0][1].BAND_M == (G.WIDE_B_BAND if wide else 1), launches[-1][0][1]
    G.gemm(m=rows, n=I, segments=[G.Segment(dy, H, wd, I, k=H, b_group_stride=H * I)], a_kmajor=True,
           b_kmajor=False, out=_Array(0x9000_0000), ldc=I, grouping="m", group_offsets=offsets,
           num_groups=128)
    assert launches[-1][0][1].BAND_M == 1
    assert G.WIDE_B_BAND > 1
