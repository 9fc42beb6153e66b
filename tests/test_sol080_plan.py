"""SOL-080's launch plan on the CPU (a stand-in CuPy on 132 SMs, no kernels): where d_act runs
split-K and in how many pieces, and where the router kernel (which runs the top-k check) goes:
beside d_act on SMs it leaves free, or first, alone."""
import importlib
import sys
import types

import pytest

H, I, E = 4096, 1408, 128


class _Array:
    def __init__(self, shape, ptr=0x1000_0000):
        self.shape, self.data = shape, types.SimpleNamespace(ptr=ptr)


@pytest.fixture
def plan_of(monkeypatch):
    try:  # the device: the real CuPy (gpu/sol080.py binds the module it imports, for later tests)
        importlib.import_module("cupy")
    except ImportError:
        fake = types.ModuleType("cupy")
        fake.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0))
        monkeypatch.setitem(sys.modules, "cupy", fake)
    from cupy_moe.gpu import gemm, sol080

    monkeypatch.setattr(gemm, "_device_info", lambda device_id: ("90", 132))
    monkeypatch.setattr(sol080, "CONCURRENT", True)

    def plan(T, e=E):
        g, x, wr, gate = _Array((T, H)), _Array((T, H), 0x2000_0000), _Array((e, H)), _Array((T, I))
        wg, wu, wd = _Array((I, H)), _Array((I, H)), _Array((H, I))
        return sol080._Plan.of(g, x, wr, wg, wu, wd, gate)
    return plan


@pytest.mark.parametrize("T,splits,beside", [
    (1, 8, True), (192, 5, True), (211, 5, True), (293, 3, True), (384, 3, True), (512, 2, True),
    # fused d_act: 128 x 128 tiles, beside where the even-rounds grid frees >= 8 of 132 SMs
    (513, 1, True),     # 55 tiles: more than a third of the SMs, unsplit (ACT_SPLIT_THIRD)
    (768, 1, True),     # 66 tiles: 66 free
    (997, 1, True),     # 88 tiles: 44 SMs free
    (1321, 1, True),    # 121 tiles: 11 free
    (2053, 1, True),    # 187 tiles, 2 rounds on 94 CTAs
    (3072, 1, False),   # 264 tiles: 2 full rounds, nothing free
    (6144, 1, False),   # 528 tiles: 4 full rounds
    (8192, 1, True)])   # 704 tiles, 6 rounds on 118 CTAs
def test_d_act_pieces_and_router_place(plan_of, T, splits, beside, monkeypatch):
    """(From T = 5120 grad_Wd takes the router beside it instead: WD_FIRST, tested below; at
    1537 .. 2560 tokens d_act runs wide and plain instead: WIDE_MID_T, tested below.)"""
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "WD_FIRST", "0")
    monkeypatch.setattr(sol080, "WIDE_MID_T", False)
    p = plan_of(T)
    assert (p.act_splits, p.act_fused, p.router_beside) == (splits, splits == 1, beside)


def test_d_act_splits_only_while_its_tiles_fill_a_third_of_the_sms(plan_of, monkeypatch):
    """sol080.ACT_SPLIT_THIRD: 44 tiles (T = 512) split, 55 (513) and 66 (768) not; "0" keeps
    gemm.k_splits_for's half: 2 pieces up to 768 tokens, the router then first where they fill
    every SM."""
    from cupy_moe.gpu import sol080

    assert [plan_of(T).act_splits for T in (512, 513, 768, 769)] == [2, 1, 1, 1]
    monkeypatch.setattr(sol080, "ACT_SPLIT_THIRD", False)
    plans = [plan_of(T) for T in (512, 513, 768, 769)]
    assert [p.act_splits for p in plans] == [2, 2, 2, 1]
    assert [p.router_beside for p in plans] == [True, True, False, True]


def test_one_stream_puts_the_router_first(plan_of, monkeypatch):
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "CONCURRENT", False)
    assert [plan_of(T).router_beside for T in (192, 2053, 8192)] == [False] * 3
    assert plan_of(192).act_splits == 6  # all the pieces k_splits_for gives: no room to leave


def test_the_unfused_ab_knob_keeps_the_router_beside(plan_of, monkeypatch):
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "FUSED_D_ACT", False)
    p = plan_of(4093)
    assert (p.act_splits, p.act_fused, p.router_beside) == (1, False, True)


@pytest.mark.parametrize("T,stacked,cluster,shape", [
    (300, True, True, None),                 # too few tokens to split: hi^T x + lo^T x, straight out
    (511, True, False, None),
    (512, True, True, None),                 # 2 pieces x [hi; lo]: summed inside the GEMM
    (3200, True, True, None),
    (3201, True, True, (2, 2 * E, H)),       # through global memory above _CLUSTER_SUM_MAX_T
    (8192, True, True, (2, 2 * E, H)),
    (512, True, False, (2, 2 * E, H)),       # [hi; lo] = 2 x 32 tiles of 128: two pieces fill 128 SMs
    (8192, True, False, (2, 2 * E, H)),
    (512, False, True, (2, E, H)),           # the A/B path: 32 tiles, pieces of >= 256 tokens
    (8192, False, False, (4, E, H))])
def test_router_wgrad_pieces(plan_of, monkeypatch, T, stacked, cluster, shape):
    from cupy_moe.gpu import gemm, router

    monkeypatch.setattr(router, "STACKED", stacked)
    monkeypatch.setattr(gemm, "SPLIT_CLUSTER", cluster)
    assert router.weight_gradient_pieces_shape(T, E, H) == shape
    p = plan_of(T)  # both knobs are in the graph key: a change re-captures
    assert p.wgrad_stacked == stacked and not p.split_cluster  # sol080.SPLIT_CLUSTER: off


def test_the_wide_d_act_knob_frees_room_for_the_router(plan_of, monkeypatch):
    """CUPY_MOE_SOL080_WIDE_D_ACT (A/B): where the fused 128 x 128 d_act fills the SMs (T = 3072,
    6144), a plain 128 x 256 d_act on its even-rounds grid (144 tiles on 72 CTAs; 288 on 96)
    leaves the router room beside it; elsewhere nothing changes."""
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "WIDE_D_ACT", True)
    monkeypatch.setattr(sol080, "WIDE_MID_T", False)
    for T in (3072, 6144):
        p = plan_of(T)
        assert (p.act_wide, p.act_fused, p.router_beside) == (True, False, True)
    for T in (192, 2053, 8192):
        assert not plan_of(T).act_wide


@pytest.mark.parametrize("T,wide", [(1321, False), (1408, False), (1409, True), (1536, True), (1537, True),
                                    (1571, True), (1879, True), (2053, True), (2560, True), (2561, False),
                                    (3072, False), (3089, False), (8192, False)])
def test_mid_t_d_act_in_one_round_of_wide_tiles(plan_of, T, wide):
    """sol080.WIDE_MID_T: where the fused 128 x 128 d_act takes two rounds of the 132 SMs (133 ..
    264 tiles: 13 .. 24 row tiles), or one that leaves the router no room beside it (125 .. 132
    tiles: 12 row tiles, WIDE_FULL_ROUND), and the plain 128 x 256 one fits one round beside the
    router (at most 124 tiles: 20 row tiles), d_act runs wide and plain, the router beside it, and
    the SwiGLU backward on half the SMs beside grad_Wd; elsewhere the fused d_act stays."""
    p = plan_of(T)
    assert (p.act_wide, p.act_fused) == (wide, not wide and p.swiglu_sms == 0)
    if wide:
        assert p.router_beside and p.swiglu_sms == 66 and not p.wd_first


def test_wide_full_round_can_be_turned_off(plan_of, monkeypatch):
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "WIDE_FULL_ROUND", False)
    assert [plan_of(T).act_wide for T in (1409, 1536, 1537)] == [False, False, True]
    assert plan_of(1536).wd_first  # (the fused d_act fills every SM: grad_Wd first, as before)


def test_mid_t_d_act_stays_fused_where_the_bulk_swiglu_cannot_run(plan_of):
    """WIDE_MID_T pays only with the bulk SwiGLU kernel beside grad_Wd; its rows need E % 8 == 0
    (and I % 8 == 0), so with 100 experts d_act stays fused at 1879 tokens."""
    p = plan_of(1879, e=100)
    assert (p.act_wide, p.act_fused, p.swiglu_sms) == (False, True, 0)
    assert plan_of(1879, e=128).act_wide


def test_mid_t_wide_d_act_can_be_turned_off(plan_of, monkeypatch):
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "WIDE_MID_T", False)
    p = plan_of(1879)
    assert (p.act_wide, p.act_fused, p.swiglu_sms) == (False, True, 0)


def test_every_router_wgrad_knob_reaches_the_plan(plan_of, monkeypatch):
    """The plan keys the call's CUDA graph: gemm.SPLIT_CLUSTER alone (SOL-080's own split
    clusters off) still moves the router wgrad between its in-GEMM and global-memory sums, so it
    must change the plan, or a graph captured with the other path would replay."""
    from cupy_moe.gpu import gemm, router

    assert plan_of(1879).wgrad_cluster
    for module, knob in ((gemm, "SPLIT_CLUSTER"), (router, "SUM_IN_GEMM"), (router, "STACKED")):
        with monkeypatch.context() as m:
            m.setattr(module, knob, False)
            assert not plan_of(1879).wgrad_cluster, knob
    assert not plan_of(8192).wgrad_cluster  # above router._CLUSTER_SUM_MAX_T


def test_router_wgrad_rides_in_the_weight_gradient_gemm(plan_of, monkeypatch):
    """The router weight gradient runs as the first E rows of the grad_[Wg; Wu] GEMM where its own
    GEMM would sum its pieces through global memory (T above router._CLUSTER_SUM_MAX_T: 3719,
    4093, 6144, 8192), as its own GEMM below; the knob's "1" and "0" force either, and a workspace
    row the Hopper loop cannot read keeps it separate (E = 6: [hi | d_gate | d_up | lo] puts lo
    2828 bytes into a row of 5644, not on 16-byte boundaries)."""
    from cupy_moe.gpu import sol080

    assert [plan_of(T).wgrad_fused for T in (1, 192, 2053, 3089, 3719, 8192)] == [False] * 3 + [True] * 3
    monkeypatch.setattr(sol080, "FUSED_WGRAD", "1")
    assert all(plan_of(T).wgrad_fused for T in (1, 192, 2053, 8192))
    assert not plan_of(2053, e=6).wgrad_fused
    monkeypatch.setattr(sol080, "FUSED_WGRAD", "0")
    assert not any(plan_of(T).wgrad_fused for T in (2053, 8192))


def test_grad_wd_takes_ping_pong_consumers_up_to_4096_tokens(plan_of, monkeypatch):
    """grad_Wd's reduction is T long: ping-pong consumers (the tile epilogue behind the other
    warpgroup's main loop) where it is short, cooperative above 4096 tokens; the knob forces
    either, and it reaches the plan, which keys the call's graph."""
    from cupy_moe.gpu import sol080

    assert [plan_of(T).wd_pingpong for T in (1, 192, 2053, 4093, 4096, 4097, 6144, 8192)] == [True] * 5 + [False] * 3
    monkeypatch.setattr(sol080, "WD_PINGPONG", "1")
    assert plan_of(8192).wd_pingpong
    monkeypatch.setattr(sol080, "WD_PINGPONG", "0")
    assert not plan_of(192).wd_pingpong


def test_grad_wgu_takes_ping_pong_consumers_up_to_512_tokens(plan_of, monkeypatch):
    from cupy_moe.gpu import sol080

    assert [plan_of(T).wgu_pingpong for T in (1, 192, 512, 513, 2053, 8192)] == [True] * 3 + [False] * 3
    monkeypatch.setattr(sol080, "WGU_PINGPONG", "1")
    assert plan_of(8192).wgu_pingpong
    monkeypatch.setattr(sol080, "WGU_PINGPONG", "0")
    assert not plan_of(192).wgu_pingpong


def test_grad_wd_transposed_beside_the_mid_t_wide_d_act(plan_of, monkeypatch):
    """CUPY_MOE_SOL080_WD_TRANSPOSED: "auto" (the default) takes grad_Wd as (act^T g)^T in 128 x
    256 tiles where WIDE_MID_T's plan runs (1537 .. 2560 tokens), "1" everywhere, "0" nowhere."""
    from cupy_moe.gpu import sol080

    Ts = (192, 997, 1537, 1879, 2560, 2561, 3719, 6144, 8192)
    assert [plan_of(T).wd_transposed for T in Ts] == [False] * 2 + [True] * 3 + [False] * 4
    monkeypatch.setattr(sol080, "WIDE_MID_T", False)
    assert not plan_of(1879).wd_transposed
    monkeypatch.setattr(sol080, "WD_TRANSPOSED", "1")
    assert all(plan_of(T).wd_transposed for T in Ts)
    monkeypatch.setattr(sol080, "WD_TRANSPOSED", "0")
    monkeypatch.setattr(sol080, "WIDE_MID_T", True)
    assert not any(plan_of(T).wd_transposed for T in Ts)


def test_dgrad_takes_wide_tiles_where_they_fill_nine_tenths_of_the_sms(plan_of, monkeypatch):
    """T = 997: 8 row tiles x 16 wide column tiles = 128 of 132 SMs (one round, instead of 256
    narrow tiles in two); from T = 1025 choose() takes 256 by itself (every SM gets a tile), and at
    T = 896 the 112 wide tiles would leave 20 SMs."""
    from cupy_moe.gpu import sol080

    Ts = (192, 512, 896, 897, 997, 1024, 1025, 8192)
    assert [plan_of(T).dgrad_wide for T in Ts] == [False] * 3 + [True] * 3 + [False] * 2
    g = types.SimpleNamespace(g=_Array((997, H)))
    assert sol080._dgrad_ctas(g, plan_of(997)) == 128
    monkeypatch.setattr(sol080, "DGRAD_WIDE", "0")
    assert not plan_of(997).dgrad_wide
    assert sol080._dgrad_ctas(g, plan_of(997)) == 132
    monkeypatch.setattr(sol080, "DGRAD_WIDE", "1")
    assert plan_of(192).dgrad_wide and plan_of(8192).dgrad_wide  # wherever the dgrad is unsplit
    monkeypatch.setattr(sol080, "DGRAD_SPLITS", "k")
    assert not plan_of(192).dgrad_wide  # split-K pieces keep their own tiles


def test_dgrad_walks_its_rows_fastest_in_bands_of_64(plan_of, monkeypatch):
    """The dgrad's tiles in bands of 64 row tiles (DGRAD_BAND; every row up to T = 8192), whichever
    tile width it takes; a split-K launch keeps the plain order (gemm.band_rows); "0": gemm's
    BAND_ROWS / BAND_NARROW_ROWS."""
    from cupy_moe.gpu import gemm, sol080

    assert [plan_of(T).dgrad_band for T in (192, 997, 3072, 8192)] == [64] * 4
    wide, narrow = (gemm.Sm90Config.choose(m_tiles, H, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False)
                    for m_tiles in (64, 2))
    assert (wide.BN, narrow.BN) == (256, 128)
    assert gemm.band_rows(wide, 64) == gemm.band_rows(narrow, 64) == 64
    assert (gemm.band_rows(wide), gemm.band_rows(narrow)) == (gemm.BAND_ROWS, gemm.BAND_NARROW_ROWS)
    split = gemm.Sm90Config.choose(4, H, 132, 0, False, A_KMAJOR=True, B_KMAJOR=False, SPLIT_K=True)
    assert gemm.band_rows(split, 64) == 1
    monkeypatch.setattr(sol080, "DGRAD_BAND", 0)
    assert plan_of(8192).dgrad_band == 0


def test_small_t_order_reaches_only_split_plans(plan_of, monkeypatch):
    """CUPY_MOE_SOL080_SMALL_T_ORDER applies where d_act is split (T <= 512 here; "auto":
    "wgu-main", the dgrad then unsplit with DGRAD_SPLITS "auto"), and the dgrad's grid it caps
    grad_Wd against: 64 CTAs at T = 192 unsplit (68 SMs free), 96 at T = 384; split in two at
    T = 192 (128 CTAs: 4 free, too few to cap)."""
    from cupy_moe.gpu import sol080

    Ts = (192, 211, 293, 384, 512, 997, 8192)
    plans = [plan_of(T) for T in Ts]
    assert [p.small_t_order for p in plans] == ["wgu-main"] * 5 + [""] * 2
    assert [p.dgrad_splits for p in plans] == [1] * 7
    g = lambda T: types.SimpleNamespace(g=_Array((T, H)))
    assert sol080._dgrad_ctas(g(192), plan_of(192)) == 64
    assert sol080._dgrad_ctas(g(384), plan_of(384)) == 96
    monkeypatch.setattr(sol080, "SMALL_T_ORDER", "cap")
    assert [plan_of(T).small_t_order for T in (192, 384, 512, 997, 8192)] == ["cap"] * 3 + [""] * 2
    assert plan_of(192).dgrad_splits == 2  # the dgrad split as before the order
    assert sol080._dgrad_ctas(g(192), plan_of(192)) == 128
    monkeypatch.setattr(sol080, "SMALL_T_ORDER", "")
    assert plan_of(192).dgrad_splits == 2
    monkeypatch.setattr(sol080, "DGRAD_SPLITS", "1")
    assert plan_of(192).dgrad_splits == 1
    monkeypatch.setattr(sol080, "SMALL_T_ORDER", "auto")
    monkeypatch.setattr(sol080, "DGRAD_SPLITS", "k")
    assert plan_of(192).dgrad_splits == 2
    monkeypatch.setattr(sol080, "DGRAD_SPLITS", "auto")
    monkeypatch.setattr(sol080, "CONCURRENT", False)
    assert (plan_of(192).small_t_order, plan_of(192).dgrad_splits) == ("", 2)


def test_small_t_grad_wd_takes_the_sms_the_dgrad_leaves_or_half_of_them(plan_of, monkeypatch):
    """Beside the small-T dgrad grad_Wd takes the SMs the dgrad's grid leaves (68 at T = 192, 36
    at 384); where that is fewer than 16 (its 128 CTAs at 449 and 512) half the SMs, so that the
    SwiGLU sum is not held back behind it (SMALL_T_WD_HALF; off: every SM)."""
    from cupy_moe.gpu import sol080

    g = lambda T: types.SimpleNamespace(g=_Array((T, H)))
    ctas = lambda T: sol080._small_t_wd_ctas(g(T), plan_of(T))
    assert [ctas(T) for T in (192, 293, 384, 449, 512)] == [68, 36, 36, 66, 66]
    monkeypatch.setattr(sol080, "SMALL_T_WD_HALF", False)
    assert [ctas(T) for T in (192, 384, 512)] == [68, 36, 0]


def test_grad_wd_first_from_5120_tokens_and_where_the_router_would_go_first(plan_of, monkeypatch):
    """CUPY_MOE_SOL080_WD_FIRST: "auto" runs grad_Wd first with the router beside it from
    T = 5120 (of the workloads 6144 and 8192) and where d_act would leave the router no room
    (T = 3072), with the router wgrad inside grad_[Wg; Wu] there (FUSED_WGRAD "auto"); "1"
    wherever d_act is unsplit and fused (the router then never runs beside d_act), "0" nowhere;
    never where d_act is split or on one stream, nor beside the mid-T wide d_act (WIDE_MID_T, off
    here: tested above)."""
    from cupy_moe.gpu import sol080

    monkeypatch.setattr(sol080, "WIDE_MID_T", False)

    Ts = (192, 997, 2053, 3072, 3089, 4093, 6144, 8192)
    plans = [plan_of(T) for T in Ts]
    assert [p.wd_first for p in plans] == [False] * 3 + [True, False, False, True, True]
    assert [p.router_beside for p in plans] == [True] * 3 + [False, True, True, False, False]
    assert [p.wgrad_fused for p in plans] == [False] * 3 + [True] * 5
    monkeypatch.setattr(sol080, "WD_FIRST", "1")
    plans = [plan_of(T) for T in Ts]
    assert [p.wd_first for p in plans] == [False] + [True] * 7
    assert [p.router_beside for p in plans] == [True] + [False] * 7
    monkeypatch.setattr(sol080, "WD_FIRST", "0")
    assert not any(plan_of(T).wd_first for T in Ts)
    assert not plan_of(3072).wgrad_fused
    monkeypatch.setattr(sol080, "WD_FIRST", "auto")
    monkeypatch.setattr(sol080, "CONCURRENT", False)
    assert not plan_of(8192).wd_first


@pytest.mark.parametrize("T,queued", [(192, False), (1321, False), (2053, False), (2944, False), (3072, False),
                                      (3073, True), (3089, True), (3200, True), (3329, True), (3719, True),
                                      (4093, True), (5119, True), (5120, False), (8192, False)])
def test_router_queued_beside_d_act_of_three_rounds_or_more(plan_of, T, queued, monkeypatch):
    """sol080.ROUTER_QUEUED: where d_act (unsplit, 128-wide) takes three rounds of the 132 SMs or
    more and the router would run beside its even rounds, d_act takes every SM and the router
    waits beside it for the SMs its last round leaves, with the router wgrad inside grad_[Wg; Wu]
    (T <= 3200 would give it a GEMM of its own); not with fewer rounds (split, one round,
    1537 .. 2560 wide, 2944: none to spare, 3072: grad_Wd first), nor where grad_Wd goes first
    (5120 on). "0" keeps the router beside d_act's even rounds."""
    from cupy_moe.gpu import sol080

    p = plan_of(T)
    assert p.router_queued == queued
    if queued:
        assert (p.router_beside, p.wd_first, p.wgrad_fused) == (True, False, True)
    monkeypatch.setattr(sol080, "ROUTER_QUEUED", "0")
    p = plan_of(T)
    assert not p.router_queued
    if queued:
        assert p.router_beside and not p.wd_first


@pytest.mark.parametrize("T,sms", [(3089, 0), (3584, 20), (3719, 20), (4093, 20), (5119, 20),
                                   (6144, 0), (8192, 0), (2053, 66), (1321, 0), (192, 0)])
def test_swiglu_beside_grad_wd_where_auto_puts_it(plan_of, T, sms):
    """CUPY_MOE_SOL080_SWIGLU_SMS=auto: d_act plain and the SwiGLU contract on 20 SMs beside
    grad_Wd from 3584 tokens until grad_Wd goes first (5120), and on half the SMs beside the
    mid-T wide d_act (WIDE_MID_T: 2053); elsewhere d_act stays fused."""
    p = plan_of(T)
    assert (p.swiglu_sms, p.act_fused) == (sms, p.act_splits == 1 and not sms)
    assert not (sms and p.wd_first)


@pytest.mark.parametrize("T,claims", [(192, False), (512, False), (997, True), (2053, True),
                                      (3719, True), (8192, True)])
def test_grad_wgu_claims_its_tiles_where_it_runs_beside(plan_of, T, claims, monkeypatch):
    """grad_[Wg; Wu] claims its tiles where it runs on the side stream (its CTAs start as another
    kernel's end), not at small T, where it follows the dgrad on the main stream; one stream, or
    CLAIMS = "none", keeps every GEMM static."""
    from cupy_moe.gpu import sol080

    assert plan_of(T).claims == (frozenset({"wgu"}) if claims else frozenset())
    monkeypatch.setattr(sol080, "CLAIMS", "none")
    assert plan_of(T).claims == frozenset()
    monkeypatch.setattr(sol080, "CLAIMS", "auto")
    monkeypatch.setattr(sol080, "CONCURRENT", False)
    assert plan_of(T).claims == frozenset()


def test_a_plan_is_kept_until_a_setting_or_the_alignment_changes(plan_of, monkeypatch):
    """_Plan.of keeps its plans (gpu/settings.py): the same shapes, alignment and settings give the
    kept plan; a setting assigned at run time (as tests and the A/B scripts do) or an operand off
    16-byte alignment gives a plan derived anew."""
    from cupy_moe.gpu import gemm, settings, sol080

    first = plan_of(8192)
    assert plan_of(8192) is first and first.wd_first
    before = settings.epoch()
    monkeypatch.setattr(sol080, "WD_FIRST", "0")
    assert settings.epoch() > before
    assert not plan_of(8192).wd_first
    monkeypatch.setattr(sol080, "WD_FIRST", "auto")
    assert plan_of(8192) == first
    epoch = settings.epoch()
    monkeypatch.setattr(gemm, "STORE_RING", gemm.STORE_RING)  # (any assignment counts)
    assert settings.epoch() == epoch + 1
    g, x, wr, gate = _Array((8192, H), 0x1000_0008), _Array((8192, H)), _Array((E, H)), _Array((8192, I))
    wg, wu, wd = _Array((I, H)), _Array((I, H)), _Array((H, I))
    misaligned = sol080._Plan.of(g, x, wr, wg, wu, wd, gate)
    assert not misaligned.act_fused and first.act_fused  # d_act off the Hopper loop
