"""The GEMM engine against NumPy: both main loops (Hopper wgmma + TMA, portable mma.sync), every
operand major, grouping, epilogue and load path, at sizes that are no multiple of any tile.
The Hopper main loop needs 16-byte aligned strides; shapes it cannot take skip it (and say so)."""
import numpy as np
import pytest

from cupy_moe import bfloat16
from cupy_moe.testing import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]


def _bf16(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32).astype(bfloat16)


def _f(a):
    return a.astype(np.float32)


ENGINES = pytest.mark.parametrize("engine", ["sm90", "sm90-pingpong", "mma"])


def _run(engine, **kw):
    """gemm() on one main loop: 'sm90' the Hopper loop with cooperative consumer warpgroups,
    'sm90-pingpong' with ping-pong ones, 'sm90-direct' cooperative with the SwiGLU epilogue run
    by the consumers themselves (not staged for the epilogue warps), 'mma' the portable loop; the
    sm90 cases skip shapes that main loop does not take."""
    from cupy_moe.gpu import gemm

    saved = gemm.PINGPONG, gemm.STAGED_EPILOGUE
    gemm.PINGPONG = engine == "sm90-pingpong"
    gemm.STAGED_EPILOGUE = engine != "sm90-direct"
    try:
        gemm.gemm(engine=engine.split("-")[0], **kw)
    except ValueError as exc:
        if engine.startswith("sm90") and "does not apply" in str(exc):
            pytest.skip(str(exc))
        raise
    finally:
        gemm.PINGPONG, gemm.STAGED_EPILOGUE = saved


def _ld(cols, padded):
    """A leading dimension: the extent itself, or padded past the next multiple of 8."""
    return -(-cols // 8) * 8 + 8 if padded else cols


@pytest.mark.parametrize("a_kmajor,b_kmajor", [(True, True), (True, False), (False, False), (False, True)])
@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (130, 136, 72), (257, 200, 40), (5, 7, 3), (33, 9, 131),
                                   (131, 520, 1000), (389, 264, 8)])
@pytest.mark.parametrize("epilogue", ["bf16", "f32", "f32_accumulate"])
@pytest.mark.parametrize("padded", [False, True])
@ENGINES
def test_dense(a_kmajor, b_kmajor, m, n, k, epilogue, padded, engine):
    """Padded leading dimensions put odd extents on aligned strides (the sm90 main loop's case);
    the padding columns of the output must keep their poison."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(m * 1000 + n + k)
    a_shape = (m, k) if a_kmajor else (k, m)
    b_shape = (n, k) if b_kmajor else (k, n)
    A_mem = _bf16(rng, a_shape[0], _ld(a_shape[1], padded))
    B_mem = _bf16(rng, b_shape[0], _ld(b_shape[1], padded))
    A, B = A_mem[:, :a_shape[1]], B_mem[:, :b_shape[1]]
    ref = (_f(A) if a_kmajor else _f(A).T) @ (_f(B).T if b_kmajor else _f(B))
    ldc = _ld(n, padded)
    out = cp.empty((m, ldc), bfloat16 if epilogue == "bf16" else cp.float32)
    if epilogue == "f32_accumulate":
        c0 = rng.standard_normal((m, n), dtype=np.float32)
        out[:, :n] = cp.asarray(c0)
        ref = ref + c0
    _run(engine, m=m, n=n, segments=[Segment(cp.asarray(A_mem), A_mem.shape[1], cp.asarray(B_mem),
                                             B_mem.shape[1], k=k)],
         a_kmajor=a_kmajor, b_kmajor=b_kmajor, out=out, ldc=ldc, epilogue=epilogue)
    got = out.get()
    assert relative_error(got[:, :n].astype(np.float32), ref) < (1e-2 if epilogue == "bf16" else 1e-5)
    assert np.isnan(got[:, n:].astype(np.float32)).all()  # untouched poison


@ENGINES
def test_segments_concatenate_k(engine):
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(1)
    m, n = 77, 136
    ks = (40, 24, 8, 136)
    As = [_bf16(rng, m, k) for k in ks]
    Bs = [_bf16(rng, k, n) for k in ks]
    ref = sum(_f(a) @ _f(b) for a, b in zip(As, Bs))
    out = cp.empty((m, n), cp.float32)
    _run(engine, m=m, n=n, segments=[Segment(cp.asarray(a), a.shape[1], cp.asarray(b), n, k=a.shape[1])
                                     for a, b in zip(As, Bs)],
         a_kmajor=True, b_kmajor=False, out=out, ldc=n, epilogue="f32")
    assert relative_error(out.get(), ref) < 1e-5


@pytest.mark.parametrize("splits", [2, 3, 7, 40])
@pytest.mark.parametrize("a_kmajor,b_kmajor", [(True, False), (True, True), (False, False)])
@ENGINES
def test_split_k_pieces_sum_to_the_product(splits, a_kmajor, b_kmajor, engine):
    """k_splits: the fp32 pieces, c_group_stride apart, sum to the product over every segment's
    reduction (21 k-tiles here, so 40 pieces leave some empty: zeros); on the Hopper loop the
    gaps between pieces keep their poison."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(splits)
    m, n, ks = 136, 200, (1000, 72, 136)
    As = [_bf16(rng, *((m, k) if a_kmajor else (k, m))) for k in ks]
    Bs = [_bf16(rng, *((n, k) if b_kmajor else (k, n))) for k in ks]
    ref = sum((_f(a) if a_kmajor else _f(a).T) @ (_f(b).T if b_kmajor else _f(b)) for a, b in zip(As, Bs))
    stride = m * n + 64
    out = cp.empty(splits * stride, cp.float32)
    _run(engine, m=m, n=n, segments=[Segment(cp.asarray(a), a.shape[1], cp.asarray(b), b.shape[1], k=k)
                                     for a, b, k in zip(As, Bs, ks)],
         a_kmajor=a_kmajor, b_kmajor=b_kmajor, out=out, ldc=n, epilogue="f32", k_splits=splits,
         c_group_stride=stride)
    got = out.get()
    pieces = [got[s * stride:s * stride + m * n].reshape(m, n) for s in range(splits)]
    assert relative_error(sum(pieces), ref) < 1e-5
    if engine.startswith("sm90"):
        assert np.isnan(np.stack([got[s * stride + m * n:(s + 1) * stride] for s in range(splits)])).all()
        assert sum(not p.any() for p in pieces) == (splits - 21 if splits > 21 else 0)


@pytest.mark.parametrize("splits", [2, 5, 8])
@pytest.mark.parametrize("m", [1, 136, 300])
@ENGINES
def test_split_k_summed_in_the_kernel(splits, m, engine):
    """k_splits with a bf16 result: the pieces of each tile (on the Hopper loop a thread-block
    cluster of `splits` CTAs) are summed in piece order inside the GEMM; the portable loop runs
    unsplit. The bf16 product, the same bits on a second call; the output's padding keeps its
    poison (nothing is written past n)."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(splits + m)
    n, ks = 200, (1000, 72, 136)
    As = [_bf16(rng, m, k) for k in ks]
    Bs = [_bf16(rng, k, n) for k in ks]
    ref = sum(_f(a) @ _f(b) for a, b in zip(As, Bs))
    segments = [Segment(cp.asarray(a), k, cp.asarray(b), n, k=k) for a, b, k in zip(As, Bs, ks)]
    outs = []
    for _ in range(2):
        out = cp.empty((m, n + 8), bfloat16)  # 8 columns of padding past n
        _run(engine, m=m, n=n, segments=segments, a_kmajor=True, b_kmajor=False, out=out,
             ldc=n + 8, epilogue="bf16", k_splits=splits)
        outs.append(out.get())
    assert relative_error(_f(outs[0][:, :n]), ref) < 1e-2
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    assert np.isnan(_f(outs[0][:, n:])).all()


@ENGINES
def test_a_set_cancel_word_means_the_launch_does_nothing(engine):
    """gemm(cancel=address): the kernel reads the int there when it starts; nonzero, it leaves
    the output untouched (a failed input check upstream), zero, it computes as usual."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(12)
    A, B = _bf16(rng, 130, 72), _bf16(rng, 136, 72)
    out = cp.empty((130, 136), cp.float32)
    out.fill(np.nan)
    word = cp.ones(1, cp.int32)
    kw = dict(m=130, n=136, segments=[Segment(cp.asarray(A), 72, cp.asarray(B), 72, k=72)],
              a_kmajor=True, b_kmajor=True, out=out, ldc=136, epilogue="f32", cancel=word.data.ptr)
    _run(engine, **kw)
    assert cp.isnan(out).all()
    word[0] = 0
    _run(engine, **kw)
    assert relative_error(out.get(), _f(A) @ _f(B).T) < 1e-5


def _groups(rng, G, total, empty=()):
    sizes = rng.multinomial(total, np.ones(G) / G)
    for g in empty:
        sizes[(g + 1) % G] += sizes[g]
        sizes[g] = 0
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)


def _m_grouped(rng, offs, n, k):
    """A random M-grouped problem over the row segments offs (A, then the groups' W drawn from
    rng): its NumPy reference and gemm()'s keywords but out."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    Gs, rows = len(offs) - 1, int(offs[-1])
    A, W = _bf16(rng, rows, k), _bf16(rng, Gs, k, n)
    ref = np.concatenate([_f(A[offs[g]:offs[g + 1]]) @ _f(W[g]) for g in range(Gs)])
    kw = dict(m=rows, n=n, segments=[Segment(cp.asarray(A), k, cp.asarray(W), n, k=k, b_group_stride=k * n)],
              a_kmajor=True, b_kmajor=False, ldc=n, grouping="m", group_offsets=cp.asarray(offs),
              num_groups=Gs)
    return ref, kw


def _record_choices(monkeypatch, G):
    """Sm90Config.choose() patched to append every config it returns to the list this returns."""
    chosen = []
    choose = G.Sm90Config.choose.__func__
    monkeypatch.setattr(G.Sm90Config, "choose",
                        classmethod(lambda cls, *a, **flags: chosen.append(choose(cls, *a, **flags)) or chosen[-1]))
    return chosen


@pytest.mark.parametrize("n,k", [(136, 64), (24, 40), (9, 5), (264, 200)])
@pytest.mark.parametrize("b_kmajor", [True, False])
@pytest.mark.parametrize("gather", [True, False])
@ENGINES
def test_m_grouped(n, k, b_kmajor, gather, engine):
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(n + k)
    G, T, K = 6, 97, 2
    M = T * K
    offs = _groups(rng, G, M, empty=(0, 3))
    slots = rng.permutation(M).astype(np.int32) if gather else np.arange(M, dtype=np.int32) * K
    X = _bf16(rng, T if gather else M, k)
    W = _bf16(rng, G, n, k) if b_kmajor else _bf16(rng, G, k, n)
    ref = np.zeros((M, n), np.float32)
    for g in range(G):
        rows = slice(offs[g], offs[g + 1])
        w = _f(W[g]).T if b_kmajor else _f(W[g])
        ref[rows] = _f(X)[slots[rows] // K] @ w
    out = cp.empty((M, n), bfloat16)
    _run(engine, m=M, n=n, segments=[Segment(cp.asarray(X), k, cp.asarray(W), W.shape[2], k=k,
                                             b_group_stride=n * k)],
         a_kmajor=True, b_kmajor=b_kmajor, out=out, ldc=n, grouping="m",
         group_offsets=cp.asarray(offs), num_groups=G,
         gather_a=cp.asarray(slots) if gather else None, gather_div=K)
    assert relative_error(out.get().astype(np.float32), ref) < 1e-2


@pytest.mark.parametrize("m,n", [(136, 72), (9, 5), (200, 264), (136, 1408)])
@pytest.mark.parametrize("gather", ["a", "b"])
@ENGINES
def test_k_grouped_empty_groups_write_zeros(m, n, gather, engine):
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(m + n)
    G, T, K = 5, 83, 3
    L = T * K
    offs = _groups(rng, G, L, empty=(1, 4))
    slots = rng.permutation(L).astype(np.int32)
    A = _bf16(rng, T if gather == "a" else L, m)
    B = _bf16(rng, T if gather == "b" else L, n)
    Af = _f(A)[slots // K] if gather == "a" else _f(A)
    Bf = _f(B)[slots // K] if gather == "b" else _f(B)
    ref = np.stack([Af[offs[g]:offs[g + 1]].T @ Bf[offs[g]:offs[g + 1]] for g in range(G)])
    out = cp.empty((G, m, n), bfloat16)
    kw = {f"gather_{gather}": cp.asarray(slots)}
    _run(engine, m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], a_kmajor=False,
         b_kmajor=False, out=out, ldc=n, c_group_stride=m * n, grouping="k",
         group_offsets=cp.asarray(offs), num_groups=G, gather_div=K, **kw)
    got = out.get().astype(np.float32)
    assert not got[1].any() and not got[4].any()
    assert relative_error(got, ref) < 1e-2


@pytest.mark.parametrize("m,n", [(136, 264), (128, 1408)])
@ENGINES
def test_k_grouped_short_last_k_tiles(m, n, engine):
    """K-grouped with TMA operands: groups of 0, 1, 63, 64, 65, 96, 97, 127, 128, 200 and 333 lines.
    A group's last k-tile short of 64 lines (of at least 64 in all) loads the 64 lines ending at the
    group's end and zeroes in A the ones the tile before counted; a shorter group zeroes the next
    group's lines in both operands. An infinity in one group's B stays in that group's result,
    whether or not it lies in such an overlap."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(m + n)
    sizes = [0, 1, 63, 64, 65, 127, 128, 200, 333, 96, 97]
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    L, G = int(offs[-1]), len(sizes)
    A, B = _bf16(rng, L, m), _bf16(rng, L, n)
    # Infinities in B: group 5 (127 lines), line 63, and group 7 (200 lines), line 150, both in
    # their shifted last tile's zeroed overlap.
    inf_at = {5: (63, 1), 7: (150, 3)}
    for g, (line, col) in inf_at.items():
        B[offs[g] + line, col] = np.inf
    ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(G)])
    out = cp.empty((G, m, n), bfloat16)
    _run(engine, m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], a_kmajor=False,
         b_kmajor=False, out=out, ldc=n, c_group_stride=m * n, grouping="k",
         group_offsets=cp.asarray(offs), num_groups=G)
    got = out.get().astype(np.float32)
    assert not got[0].any()
    finite = [g for g in range(G) if g not in inf_at]
    assert np.isfinite(got[finite]).all()
    for g, (_, col) in inf_at.items():
        assert not np.isfinite(got[g][:, col]).all()
    assert relative_error(got[finite], ref[finite]) < 1e-2


@pytest.mark.parametrize("m,n", [(128, 264), (200, 1408)])
@pytest.mark.parametrize("engine", ["sm90", "sm90-pingpong"])
def test_k_grouped_tails_issue_only_their_k16_steps(m, n, engine, monkeypatch):
    """K-grouped, a group's short last k-tile issues only the k16 steps that hold its own lines
    and zeroes only the lines of the step they split (Sm90Config.SKIP_K16): groups of every
    length 0 .. 129 in shuffled order, so every run a tile can take occurs (a shifted tail from
    step 0, 1, 2 or 3 with 0-15 lines zeroed; a group shorter than a tile ending at step 1-4).
    Bitwise equal to zeroing all those lines and multiplying every step (fp32 and bf16 results),
    every element written, against NumPy."""
    import cupy as cp
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(m + n)
    sizes = rng.permutation(130)
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    L, groups = int(offs[-1]), len(sizes)
    A, B = _bf16(rng, L, m), _bf16(rng, L, n)
    ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(groups)])
    A, B, offs_d = cp.asarray(A), cp.asarray(B), cp.asarray(offs)
    built = []
    module = G._sm90_module
    monkeypatch.setattr(G, "_sm90_module", lambda cfg: built.append(cfg) or module(cfg))
    results = {}
    for skip in (True, False):
        monkeypatch.setattr(G, "CONFIG_OVERRIDE", {"SKIP_K16": skip})
        for epilogue, dtype in (("f32", cp.float32), ("bf16", bfloat16)):
            out = cp.full((groups, m, n), np.nan, dtype)
            _run(engine, m=m, n=n, segments=[Segment(A, m, B, n, k=L)], a_kmajor=False, b_kmajor=False,
                 out=out, ldc=n, c_group_stride=m * n, grouping="k", group_offsets=offs_d,
                 num_groups=groups, epilogue=epilogue)
            results[skip, epilogue] = out.get().astype(np.float32)
    assert [c.SKIP_K16 for c in built] == [True, True, False, False]
    assert all(c.GROUPING == G.GROUPINGS["k"] and c.PINGPONG == (engine == "sm90-pingpong") for c in built)
    for epilogue in ("f32", "bf16"):
        assert not np.isnan(results[True, epilogue]).any()
        np.testing.assert_array_equal(results[True, epilogue].view(np.uint32),
                                      results[False, epilogue].view(np.uint32))
    assert not results[True, "f32"][sizes == 0].any()
    assert relative_error(results[True, "f32"], ref) < 1e-5
    assert relative_error(results[True, "bf16"], ref) < 1e-2


@pytest.mark.parametrize("grouping", ["none", "m", "k"])
@ENGINES
def test_more_tiles_than_sms(grouping, engine):
    """Every CTA of the persistent grid walks several tiles and the stage ring wraps many times."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(7)
    if grouping == "k":
        G, m, n, L = 9, 264, 520, 3001
        offs = _groups(rng, G, L, empty=(2,))
        A, B = _bf16(rng, L, m), _bf16(rng, L, n)
        ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(G)])
        out = cp.empty((G, m, n), bfloat16)
        _run(engine, m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], a_kmajor=False,
             b_kmajor=False, out=out, ldc=n, c_group_stride=m * n, grouping="k",
             group_offsets=cp.asarray(offs), num_groups=G)
    else:
        G = 16 if grouping == "m" else 1
        M, n, k = 4099, 1032, 520
        offs = _groups(rng, G, M, empty=(5,)) if grouping == "m" else np.array([0, M], np.int32)
        X, W = _bf16(rng, M, k), _bf16(rng, G, n, k)
        ref = np.concatenate([_f(X[offs[g]:offs[g + 1]]) @ _f(W[g]).T for g in range(G)])
        out = cp.empty((M, n), bfloat16)
        kw = dict(grouping="m", group_offsets=cp.asarray(offs), num_groups=G) if grouping == "m" else {}
        _run(engine, m=M, n=n, segments=[Segment(cp.asarray(X), k, cp.asarray(W), k, k=k,
                                                 b_group_stride=n * k)],
             a_kmajor=True, b_kmajor=True, out=out, ldc=n, **kw)
    assert relative_error(out.get().astype(np.float32), ref) < 1e-2


@pytest.mark.parametrize("n,k,G,M", [(136, 200, 5, 301), (1408, 264, 5, 301), (13, 40, 5, 301),
                                     (200, 136, 3, 1031), (1408, 72, 1, 389), (64, 40, 4, 777),
                                     (1408, 136, 7, 20011)])
@pytest.mark.parametrize("routed", [True, False])
@pytest.mark.parametrize("engine", ["sm90", "sm90-direct", "sm90-pingpong", "mma"])
def test_swiglu_backward_epilogue(n, k, G, M, routed, engine):
    """da' = dy W (M-grouped, never stored) -> dg, du, aw and dw = <da', a>, as the elementwise
    kernel computes them from an fp32 da' (the mma engine runs exactly that composition). The
    larger cases have whole 128-row tiles inside an expert next to tiles that straddle an
    expert's end, more tiles than SMs, and a tile past n's last multiple of 128."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment, SwigluBackward

    rng = np.random.default_rng(n + k + M)
    offs = _groups(rng, G, M, empty=(2,) if G > 2 else ())
    dy, W = _bf16(rng, M, k), _bf16(rng, G, k, n)
    g, u, a = _bf16(rng, M, n), _bf16(rng, M, n), _bf16(rng, M, n)
    w = rng.random(M, dtype=np.float32) if routed else np.ones(M, np.float32)
    da = np.concatenate([_f(dy[offs[i]:offs[i + 1]]) @ _f(W[i]) for i in range(G)])
    s = 1 / (1 + np.exp(-_f(g)))
    ref_dg = w[:, None] * da * _f(u) * s * (1 + _f(g) * (1 - s))
    ref_du = w[:, None] * da * _f(g) * s
    outs = [cp.empty((M, n), bfloat16) for _ in range(3)]
    dw = cp.empty(M, cp.float32)
    sw = SwigluBackward(gate=cp.asarray(g), up=cp.asarray(u), dg=outs[0], du=outs[1])
    if routed:
        perm = rng.permutation(M).astype(np.int32)  # weights come through a row index
        w_mem = np.empty(M, np.float32)
        w_mem[perm] = w
        sw.act, sw.weights, sw.row_index = cp.asarray(a), cp.asarray(w_mem), cp.asarray(perm)
        sw.aw, sw.dw = outs[2], dw
    _run(engine, m=M, n=n, segments=[Segment(cp.asarray(dy), k, cp.asarray(W), n, k=k,
                                             b_group_stride=k * n)],
         a_kmajor=True, b_kmajor=False, out=None, ldc=n, epilogue="swiglu_backward", swiglu=sw,
         grouping="m", group_offsets=cp.asarray(offs), num_groups=G)
    assert relative_error(outs[0].get().astype(np.float32), ref_dg) < 1e-2
    assert relative_error(outs[1].get().astype(np.float32), ref_du) < 1e-2
    if routed:
        assert relative_error(outs[2].get().astype(np.float32), w[:, None] * _f(a)) < 1e-2
        assert relative_error(dw.get(), (da * _f(a)).sum(1)) < 1e-4


@pytest.mark.parametrize("epilogue", ["bf16", "swiglu_backward"])
def test_even_rounds_grid_gives_the_same_bits(epilogue):
    """gemm(even_rounds=True) (SOL-080's d_act, 17 x 11 = 187 tiles: 94 CTAs of two rounds
    instead of 132) computes each tile as before, so the results are bitwise those of the full
    grid, fused SwiGLU backward included."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment, SwigluBackward, gemm

    rng = np.random.default_rng(13)
    m, n, k = 2053, 1408, 192
    A, B = cp.asarray(_bf16(rng, m, k)), cp.asarray(_bf16(rng, k, n))
    gate, up = cp.asarray(_bf16(rng, m, n)), cp.asarray(_bf16(rng, m, n))
    results = []
    for even in (False, True):
        out = cp.full((m, 2 * n), np.nan, bfloat16)
        if epilogue == "bf16":
            gemm(m=m, n=n, segments=[Segment(A, k, B, n, k=k)], a_kmajor=True, b_kmajor=False,
                 out=out, ldc=2 * n, engine="sm90", even_rounds=even)
        else:
            du = out.data.ptr + 2 * n  # bytes: the second half of every row
            gemm(m=m, n=n, segments=[Segment(A, k, B, n, k=k)], a_kmajor=True, b_kmajor=False,
                 out=None, ldc=n, epilogue="swiglu_backward", engine="sm90", even_rounds=even,
                 swiglu=SwigluBackward(gate=gate, up=up, dg=out, du=du, ld_grad=2 * n,
                                       contract_rounding=True))
        results.append(out.get())
    full, even = results
    written = full if epilogue == "swiglu_backward" else full[:, :n]
    assert not np.isnan(written.astype(np.float32)).any()
    np.testing.assert_array_equal(full.view(np.uint16), even.view(np.uint16))


@pytest.mark.parametrize("case", ["dense", "m-gather", "k-grouped", "swiglu"])
def test_dynamic_tile_claims_give_the_same_bits(case, monkeypatch):
    """Tiles claimed as the CTAs go (gemm.DYNAMIC_TILES) are each computed whole, in the same
    order of operations, so the results are bitwise those of the static order, whichever CTA
    took a tile; repeated launches (the kernel zeroes its counters at its end) stay so, and every
    counter pair is zero again afterwards. Cases: TMA stores, the cp.async producer's tile reads,
    ping-pong consumers, the staged SwiGLU epilogue warps."""
    import cupy as cp
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment, SwigluBackward

    rng = np.random.default_rng(29)
    if case == "dense":
        m, n, k = 4099, 1032, 520
        A, B = cp.asarray(_bf16(rng, m, k)), cp.asarray(_bf16(rng, n, k))
        out = cp.empty((m, n), bfloat16)
        kw = dict(m=m, n=n, segments=[Segment(A, k, B, k, k=k)], a_kmajor=True, b_kmajor=True, out=out, ldc=n)
    elif case == "m-gather":
        Gs, T, K, n, k = 16, 1500, 4, 264, 200
        offs = _groups(rng, Gs, T * K, empty=(5,))
        slots = cp.asarray(rng.permutation(T * K).astype(np.int32))
        X, W = cp.asarray(_bf16(rng, T, k)), cp.asarray(_bf16(rng, Gs, n, k))
        out = cp.empty((T * K, n), bfloat16)
        kw = dict(m=T * K, n=n, segments=[Segment(X, k, W, k, k=k, b_group_stride=n * k)], a_kmajor=True,
                  b_kmajor=True, out=out, ldc=n, grouping="m", group_offsets=cp.asarray(offs),
                  num_groups=Gs, gather_a=slots, gather_div=K)
    elif case == "k-grouped":
        Gs, m, n, L = 9, 264, 520, 3001
        offs = _groups(rng, Gs, L, empty=(2,))
        A, B = cp.asarray(_bf16(rng, L, m)), cp.asarray(_bf16(rng, L, n))
        out = cp.empty((Gs, m, n), bfloat16)
        kw = dict(m=m, n=n, segments=[Segment(A, m, B, n, k=L)], a_kmajor=False, b_kmajor=False, out=out,
                  ldc=n, c_group_stride=m * n, grouping="k", group_offsets=cp.asarray(offs), num_groups=Gs)
    else:
        m, n, k = 2053, 1408, 192
        A, B = cp.asarray(_bf16(rng, m, k)), cp.asarray(_bf16(rng, k, n))
        gate, up = cp.asarray(_bf16(rng, m, n)), cp.asarray(_bf16(rng, m, n))
        out = cp.empty((m, 2 * n), bfloat16)
        kw = dict(m=m, n=n, segments=[Segment(A, k, B, n, k=k)], a_kmajor=True, b_kmajor=False, out=None,
                  ldc=n, epilogue="swiglu_backward",
                  swiglu=SwigluBackward(gate=gate, up=up, dg=out, du=out.data.ptr + 2 * n, ld_grad=2 * n,
                                        contract_rounding=True))
    results = []
    for dynamic in ("none", "all", "all", "all"):
        monkeypatch.setattr(G, "DYNAMIC_TILES", dynamic)
        out.fill(np.nan)
        G.gemm(engine="sm90", **kw)
        results.append(out.get())
    assert not np.isnan(results[0].astype(np.float32)).any()
    for r in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint16), r.view(np.uint16))
    counters = G._counters[cp.cuda.Device().id]
    assert int(cp.count_nonzero(counters)) == 0  # every launch left its pair zeroed


def _store_path_problem(rng, case, dense=(4099, 1280, 200), k_groups=(5, 1001, 0)):
    """A bf16 GEMM for the result store paths' tests: 'dense' (m, n, k, K-major operands), M-grouped
    over 1201 rows in 7 groups ('m-grouped': two empty; 'm-one-group': all rows in one), or
    K-grouped [2816 x 1408] per group ('k-grouped'; 'k-transposed' stores C^T, as the layer's dWd)
    over k_groups = (groups, lines, last): one empty group and, with last > 0, a last group of
    that many lines. Returns its NumPy reference, gemm()'s keywords and their out."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment

    if case == "dense":
        m, n, k = dense
        A, B = _bf16(rng, m, k), _bf16(rng, n, k)
        ref = _f(A) @ _f(B).T
        out = cp.empty((m, n), bfloat16)
        kw = dict(m=m, n=n, segments=[Segment(cp.asarray(A), k, cp.asarray(B), k, k=k)], a_kmajor=True,
                  b_kmajor=True, out=out, ldc=n)
    elif case in ("m-grouped", "m-one-group"):
        rows = 1201
        if case == "m-grouped":
            offs = _groups(rng, 7, rows, empty=(0, 3))
        else:
            offs = np.array([0, 0, 0, rows, rows, rows, rows, rows], np.int32)
        ref, kw = _m_grouped(rng, offs, 2048, 136)
        out = kw["out"] = cp.empty(ref.shape, bfloat16)
    else:
        (Gs, L, last), m, n = k_groups, 2816, 1408
        offs = _groups(rng, Gs - (last > 0), L - last, empty=(2,))
        if last:
            offs = np.append(offs, L).astype(np.int32)
        A, B = _bf16(rng, L, m), _bf16(rng, L, n)
        ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(Gs)])
        if case == "k-transposed":  # (the layer's dWd: n and m swap, the result stored as C^T)
            ref = ref.transpose(0, 2, 1)
        out = cp.empty(ref.shape, bfloat16)
        kw = dict(m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], a_kmajor=False,
                  b_kmajor=False, out=out, ldc=ref.shape[2], c_group_stride=m * n, grouping="k",
                  group_offsets=cp.asarray(offs), num_groups=Gs, out_transposed=case == "k-transposed")
    return ref, kw, out


def _assert_same_bits(results, ref):
    """bf16 results of one problem under several settings: every element written (no NaN left of
    the poison), all bitwise the first's, and right against the NumPy reference."""
    assert not np.isnan(results[0].astype(np.float32)).any()
    for r in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint16), r.view(np.uint16))
    assert relative_error(results[0].astype(np.float32), ref) < 1e-2


def _check_store_ring(monkeypatch, knob, case, seed, expected, **gemm_kw):
    """Runs one store-path problem with the ring knob `knob` at 0 (whole-tile staging) and at 2
    (a ring of two units per warpgroup), the output poisoned with NaN before each run; checks
    the configs choose() took ((BN, PINGPONG, C_TMA, STORE_RING, STAGES) for each run), that every
    element is written, that the ring's bits are whole-tile staging's, and the result against NumPy."""
    from cupy_moe.gpu import gemm as G

    ref, kw, out = _store_path_problem(np.random.default_rng(seed), case)
    chosen = _record_choices(monkeypatch, G)
    results = []
    for ring in (0, 2):
        monkeypatch.setattr(G, knob, ring)
        G._prepared.clear()  # (a launch prepared for the same addresses would skip choose())
        out.fill(np.nan)
        G.gemm(engine="sm90", **gemm_kw, **kw)
        results.append(out.get())
    assert [(c.BN, c.PINGPONG, c.C_TMA, c.STORE_RING, c.STAGES) for c in chosen] == expected
    _assert_same_bits(results, ref)


@pytest.mark.parametrize("case", ["dense", "m-grouped", "m-one-group", "k-grouped", "k-transposed"])
def test_store_ring_gives_the_same_bits(case, monkeypatch):
    """128 x 256 tiles staged through a ring (gemm.STORE_RING = 2, 4 stages) store what whole-tile
    staging does (0, 3 stages): dense, M-grouped with empty groups or all rows in one group (tiles
    that straddle a group's end store from registers), K-grouped with an empty group, and the
    transposed result. (dense: enough 128 x 256 tiles for every SM, so choose() takes them.)"""
    _check_store_ring(monkeypatch, "STORE_RING", case, 31, [(256, False, True, 0, 3), (256, False, True, 2, 4)])


@pytest.mark.parametrize("case", ["dense", "k-grouped", "k-transposed"])
def test_pingpong_store_ring_gives_the_same_bits(case, monkeypatch):
    """Ping-pong 128 x 128 tiles through a ring (gemm.PINGPONG_STORE_RING = 2, 6 stages) store
    what whole-tile staging does (0, 5 stages): dense with a short reduction that is no multiple of
    64 (as SOL-080's K = T weight gradients at small T), K-grouped with an empty group, and the
    transposed result."""
    _check_store_ring(monkeypatch, "PINGPONG_STORE_RING", case, 37, [(128, True, True, 0, 5), (128, True, True, 2, 6)],
                      pingpong=True)


def test_mbarrier_watchdog_keeps_the_bits_and_reports_no_stuck_wait(monkeypatch):
    """CUPY_MOE_WATCHDOG=1 builds (mbar_wait's hang finder, cuda_src/common/hopper.cuh) compute
    what the library's do, bit for bit, every element written, and a run that finishes records no
    stuck wait: K-grouped ping-pong tiles with an empty group (where it found the lost turn)."""
    from cupy_moe import _build
    from cupy_moe.gpu import gemm as G

    ref, kw, out = _store_path_problem(np.random.default_rng(41), "k-grouped")
    recs = _build.watchdog_records()
    results = []
    try:
        for watch in ("0", "1"):
            monkeypatch.setenv("CUPY_MOE_WATCHDOG", watch)
            G._sm90_module.cache_clear()  # (modules are cached per config, not per environment)
            G._prepared.clear()
            out.fill(np.nan)
            G.gemm(engine="sm90", pingpong=True, **kw)
            results.append(out.get())
    finally:
        G._sm90_module.cache_clear()
        G._prepared.clear()
    assert any(e == "gemm_sm90.cu" and p.startswith(_build.WATCHDOG_DEFINE) for _, e, p in _build._modules)
    assert not recs["written"].any(), recs[recs["written"] != 0][:8]
    _assert_same_bits(results, ref)


@pytest.mark.parametrize("case", ["dense", "dense-128", "m-grouped", "m-one-group", "k-grouped", "k-transposed"])
def test_band_orders_give_the_same_bits(case, monkeypatch):
    """Tiles walked in bands of row tiles (gemm.BAND_ROWS, BAND_GROUPED_ROWS: Sm90Config.BAND_M,
    or a launch's own: gemm(band), as SOL-080's dgrad takes them) are each computed whole, in the
    same order of operations, so the results are bitwise those of the plain order, static or
    claimed, every element written, against NumPy too: bands of 4 and of 3 (a narrower last band),
    a launch's 64 (every row: rows fastest) and 5, 128 x 256 and 128 x 128 dense tiles, M-grouped
    with empty groups or all rows in one, K-grouped with an empty group (bands within each group),
    transposed."""
    from cupy_moe.gpu import gemm as G

    ref, kw, out = _store_path_problem(np.random.default_rng(43), "dense" if case == "dense-128" else case,
                                       dense=(4099, 136 if case == "dense-128" else 1280, 200))
    bands = []
    band_rows = G.band_rows
    monkeypatch.setattr(G, "band_rows", lambda cfg, band=0: bands.append(band_rows(cfg, band)) or bands[-1])
    results = []
    for band, launch_band in ((1, 0), (4, 0), (3, 0), (3, 64), (3, 5)):
        for dynamic in ("none", "all"):
            monkeypatch.setattr(G, "BAND_ROWS", band)
            monkeypatch.setattr(G, "BAND_NARROW_ROWS", band)
            monkeypatch.setattr(G, "BAND_GROUPED_ROWS", band)
            monkeypatch.setattr(G, "DYNAMIC_TILES", dynamic)
            G._prepared.clear()
            out.fill(np.nan)
            G.gemm(engine="sm90", band=launch_band, **kw)
            results.append(out.get())
    assert bands == [1, 1, 4, 4, 3, 3, 64, 64, 5, 5]
    _assert_same_bits(results, ref)


@pytest.mark.parametrize("case", ["m-grouped", "m-one-group"])
def test_wide_b_bands_give_the_same_bits(case, monkeypatch):
    """M-grouped GEMMs whose expert's B is over gemm.WIDE_B_BYTES (DeepSeek-V3's routed dgrad)
    take bands of WIDE_B_BAND row tiles through gemm.m_grouped_band: bitwise the plain order's
    results, every element written, against NumPy too (empty groups, or all rows in one group;
    bands of 4 and of 3, static and claimed)."""
    from cupy_moe.gpu import gemm as G

    ref, kw, out = _store_path_problem(np.random.default_rng(47), case)
    bands = []
    band_rows = G.band_rows
    monkeypatch.setattr(G, "band_rows", lambda cfg, band=0: bands.append(band_rows(cfg, band)) or bands[-1])
    results = []
    for wide_bytes, wide_band in ((1 << 40, 4), (0, 4), (0, 3)):
        for dynamic in ("none", "all"):
            monkeypatch.setattr(G, "WIDE_B_BYTES", wide_bytes)
            monkeypatch.setattr(G, "WIDE_B_BAND", wide_band)
            monkeypatch.setattr(G, "DYNAMIC_TILES", dynamic)
            G._prepared.clear()
            out.fill(np.nan)
            G.gemm(engine="sm90", **kw)
            results.append(out.get())
    assert bands == [1, 1, 4, 4, 3, 3]
    _assert_same_bits(results, ref)


@pytest.mark.parametrize("case", ["dense", "dense-one-kstep", "dense-64", "m-grouped", "m-one-group",
                                  "k-grouped", "k-transposed"])
def test_deferred_stores_give_the_same_bits(case, monkeypatch):
    """A tile's bf16 results held in registers and stored under the next tile's first k-steps
    (Sm90Config.DEFER_STORE) are those stored at the tile's end (DEFER_STORE = 0), bit for bit,
    every element written, against NumPy too: 128 x 256 tiles through the store ring with 4 k-steps
    a tile and with 1 (the held batches stored after the next tile's loop), 64-wide tiles staged
    whole, M-grouped with empty groups or all rows in one group, K-grouped with an empty group and
    a last group shorter than a k-step, and the transposed result."""
    from cupy_moe.gpu import gemm as G

    dense = {"dense-one-kstep": (4099, 1280, 40), "dense-64": (1031, 56, 136)}.get(case, (4099, 1280, 200))
    ref, kw, out = _store_path_problem(np.random.default_rng(41), "dense" if case.startswith("dense") else case,
                                       dense=dense, k_groups=(7, 1001, 60))
    results = []
    for held in (0, G.Sm90Config.DEFER_STORE):
        monkeypatch.setattr(G, "CONFIG_OVERRIDE", {"DEFER_STORE": held})
        out.fill(np.nan)
        G.gemm(engine="sm90", **kw)
        results.append(out.get())
    assert G.Sm90Config.DEFER_STORE > 0
    _assert_same_bits(results, ref)


@pytest.mark.parametrize("case", ["dense-wide", "dense-128", "dense-64", "m-grouped", "k-grouped"])
def test_f32_tma_stores_give_the_same_bits(case, monkeypatch):
    """fp32 results through shared memory and TMA stores (gemm.F32_TMA) are those stored from
    registers, bit for bit, every element written, against NumPy too: 128 x 256 tiles through the
    store ring (n = 1000: a clipped last column tile), 128 and 64 wide tiles staged whole, M-grouped
    with empty groups (tiles that straddle a group's end store from registers) and K-grouped with
    an empty group (its zeros)."""
    import cupy as cp
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(37)
    if case.startswith("dense"):
        m, n, k = {"dense-wide": (4099, 1000, 200), "dense-128": (1031, 520, 136),
                   "dense-64": (300, 56, 72)}[case]
        A, B = _bf16(rng, m, k), _bf16(rng, k, n)
        ref = _f(A) @ _f(B)
        kw = dict(m=m, n=n, segments=[Segment(cp.asarray(A), k, cp.asarray(B), n, k=k)], a_kmajor=True,
                  b_kmajor=False, ldc=n)
    elif case == "m-grouped":
        ref, kw = _m_grouped(rng, _groups(rng, 7, 1201, empty=(0, 3)), 2048, 136)
    else:
        Gs, m, n, L = 5, 264, 1024, 1001
        offs = _groups(rng, Gs, L, empty=(2,))
        A, B = _bf16(rng, L, m), _bf16(rng, L, n)
        ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(Gs)])
        kw = dict(m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], a_kmajor=False,
                  b_kmajor=False, ldc=n, c_group_stride=m * n, grouping="k", group_offsets=cp.asarray(offs),
                  num_groups=Gs, pingpong=False)
    out = cp.empty(ref.shape, cp.float32)
    chosen = _record_choices(monkeypatch, G)
    results = []
    for tma in (False, True):
        monkeypatch.setattr(G, "F32_TMA", tma)
        G._prepared.clear()  # (a launch prepared for the same addresses would skip choose())
        out.fill(np.nan)
        G.gemm(engine="sm90", out=out, epilogue="f32", **kw)
        results.append(out.get())
    assert [c.C_TMA for c in chosen] == [False, True]
    assert not np.isnan(results[1]).any()
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))
    assert relative_error(results[1], ref) < 1e-4


@pytest.mark.parametrize("m", [1, 63, 64, 65, 127, 200, 449])
@pytest.mark.parametrize("form", ["plain", "split-k", "short-segment"])
def test_last_row_tile_loads_only_its_rows(m, form, monkeypatch):
    """An ungrouped K-major A's last row tile comes in by a box of exactly its m % 128 rows
    (gemm.TAIL_BOXES), its stage's other rows keeping older data: the result's rows are those of
    the full box with zeros past m, bit for bit, every element written, against NumPy too; plain,
    split-K into fp32 pieces, and beside a segment of fewer rows (Segment.m, whose rows past its
    own must still count as zeros, so it keeps the full box)."""
    import cupy as cp
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(m)
    n, k0, k1 = 264, 200, 72
    A0, B0, B1 = _bf16(rng, m, k0), _bf16(rng, k0, n), _bf16(rng, k1, n)
    short = max(1, m // 2) if form == "short-segment" else 0
    A1 = _bf16(rng, short or m, k1)
    ref = _f(A0) @ _f(B0)
    ref[:A1.shape[0]] += _f(A1) @ _f(B1)
    segments = [Segment(cp.asarray(A0), k0, cp.asarray(B0), n, k=k0),
                Segment(cp.asarray(A1), k1, cp.asarray(B1), n, k=k1, m=short)]
    splits = 3 if form == "split-k" else 1
    kw = dict(m=m, n=n, segments=segments, a_kmajor=True, b_kmajor=False, ldc=n, engine="sm90")
    results = []
    for tail_boxes in (False, True):
        monkeypatch.setattr(G, "TAIL_BOXES", tail_boxes)
        if splits > 1:
            out = cp.full((splits, m, n), np.nan, cp.float32)
            G.gemm(out=out, epilogue="f32", k_splits=splits, c_group_stride=m * n, **kw)
            results.append(out.get())
        else:
            out = cp.full((m, n), np.nan, bfloat16)
            G.gemm(out=out, **kw)
            results.append(out.get().astype(np.float32))
    assert not np.isnan(results[1]).any()
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))
    got = results[1].sum(axis=0) if splits > 1 else results[1]
    assert relative_error(got, ref) < (1e-5 if splits > 1 else 1e-2)


@pytest.mark.parametrize("k0,k1", [(65, 100), (127, 30), (449, 64), (200, 77)])
@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("engine", ["sm90", "sm90-pingpong", "sm90-claims"])
def test_short_last_k_step_of_mn_major_operands(k0, k1, short, engine, monkeypatch):
    """Ungrouped with MN-major A and B (a weight gradient over tokens): a segment's last k-step
    short of 64 lines comes by boxes of exactly its lines, the stage's other lines of both operands
    by bulk copies from a block of zeros (gemm.K_TAIL_BOXES, Sm90Config.K_TAIL). The stage then holds
    what boxes past K fill in, so the results are theirs bit for bit (fp32 and bf16), every
    element written, against NumPy too: segments with a tail, none (64) and shorter than a step
    (30), a second segment of the first rows only (Segment.m); cooperative, ping-pong, and with
    tiles claimed (the producer warp's shuffle of the claimed index)."""
    import cupy as cp
    from cupy_moe.gpu import gemm as G
    from cupy_moe.gpu.gemm import Segment

    rng = np.random.default_rng(k0 * 1000 + k1 + short)
    m, n = 200, 264
    rows1 = 72 if short else 0
    A0, A1 = _bf16(rng, k0, m), _bf16(rng, k1, rows1 or m)
    B0, B1 = _bf16(rng, k0, n), _bf16(rng, k1, n)
    ref = _f(A0).T @ _f(B0)
    ref[:A1.shape[1]] += _f(A1).T @ _f(B1)
    segments = [Segment(cp.asarray(A0), m, cp.asarray(B0), n, k=k0),
                Segment(cp.asarray(A1), A1.shape[1], cp.asarray(B1), n, k=k1, m=rows1)]
    if engine == "sm90-claims":
        monkeypatch.setattr(G, "DYNAMIC_TILES", "all")
    chosen = _record_choices(monkeypatch, G)
    results = {}
    for tail in (False, True):
        monkeypatch.setattr(G, "K_TAIL_BOXES", tail)
        for epilogue, dtype in (("f32", cp.float32), ("bf16", bfloat16)):
            out = cp.full((m, n), np.nan, dtype)
            _run(engine.replace("-claims", ""), m=m, n=n, segments=segments, a_kmajor=False, b_kmajor=False,
                 out=out, ldc=n, epilogue=epilogue)
            results[tail, epilogue] = out.get().astype(np.float32)
    assert [c.K_TAIL for c in chosen] == [False, False, True, True]
    for epilogue in ("f32", "bf16"):
        assert not np.isnan(results[True, epilogue]).any()
        np.testing.assert_array_equal(results[True, epilogue].view(np.uint32),
                                      results[False, epilogue].view(np.uint32))
    assert relative_error(results[True, "f32"], ref) < 1e-5
    assert relative_error(results[True, "bf16"], ref) < 1e-2


@pytest.mark.parametrize("head,rows,n,k", [(128, 2816 + 128, 4096, 333), (40, 304, 264, 200), (8, 16, 72, 1)])
def test_f32_head_and_a_segment_of_the_first_rows(head, rows, n, k):
    """gemm(f32_head) with a Segment(m=head): [A0 (all rows); A1 (the first head rows)] reduced
    with B, rows [0, head) as fp32 into one array and the rest as bf16 into another (SOL-080's
    router weight gradient above [grad_Wg; grad_Wu]). head = 128: the split on a tile edge (TMA
    stores for the bf16 tiles), and 368 tiles of 128 x 256 on 132 SMs, so the order is rotated
    to put the 16 heavy tiles on CTAs with one tile fewer; 40 and 8: a tile that straddles it,
    stored from registers, and a second segment whose A ends inside a tile (zeros past it)."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment, gemm

    rng = np.random.default_rng(head + rows)
    A0, A1, B = _bf16(rng, k, rows), _bf16(rng, k, head), _bf16(rng, k, n)
    full = _f(A0).T @ _f(B)
    full[:head] += _f(A1).T @ _f(B)
    out = cp.full((rows - head, n), np.nan, bfloat16)
    out2 = cp.full((head, n), np.nan, np.float32)
    gemm(m=rows, n=n, segments=[Segment(cp.asarray(A0), rows, cp.asarray(B), n, k=k),
                                Segment(cp.asarray(A1), head, cp.asarray(B), n, k=k, m=head)],
         a_kmajor=False, b_kmajor=False, out=out, ldc=n, engine="sm90", f32_head=(out2, n, head))
    got2, got = out2.get(), out.get().astype(np.float32)
    assert not np.isnan(got2).any() and not np.isnan(got).any()
    assert relative_error(got2, full[:head]) < 1e-4  # fp32 out of fp32 accumulators
    assert relative_error(got, full[head:]) < 1e-2


@pytest.mark.parametrize("m,n,k,grouped,pingpong", [
    (1408, 4096, 200, False, False),  # SOL-080's grad_Wd as (act^T g)^T: 11 x 16 tiles of 128 x 256
    (296, 520, 72, False, False),     # partial tiles along both edges
    (296, 520, 72, False, True),      # ping-pong consumers (two 64-row blocks per warpgroup)
    (136, 264, 0, True, False)])      # K-grouped with empty groups (the layer's dWd)
def test_out_transposed(m, n, k, grouped, pingpong):
    """gemm(out_transposed): element (r, c) of the product at out[c * ldc + r], staged by
    stmatrix.trans and stored by TMA. Against NumPy, every element written, the row padding
    (ldc > m) and empty groups' zeros as they should be."""
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment, gemm

    rng = np.random.default_rng(m + n + k)
    ldc = (m + 7) // 8 * 8 + 8
    kw = dict(engine="sm90", pingpong=pingpong, out_transposed=True, a_kmajor=False, b_kmajor=False)
    if grouped:
        G, L = 5, 211
        offs = _groups(rng, G, L, empty=(1, 4))
        A, B = _bf16(rng, L, m), _bf16(rng, L, n)
        ref = np.stack([_f(A[offs[g]:offs[g + 1]]).T @ _f(B[offs[g]:offs[g + 1]]) for g in range(G)])
        out = cp.full((G, n, ldc), np.nan, bfloat16)
        gemm(m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=L)], out=out, ldc=ldc,
             c_group_stride=n * ldc, grouping="k", group_offsets=cp.asarray(offs), num_groups=G, **kw)
        got = out.get().astype(np.float32)
        assert not got[1, :, :m].any() and not got[4, :, :m].any()
        assert relative_error(got[:, :, :m], ref.transpose(0, 2, 1)) < 1e-2
    else:
        A, B = _bf16(rng, k, m), _bf16(rng, k, n)
        ref = _f(A).T @ _f(B)
        out = cp.full((n, ldc), np.nan, bfloat16)
        gemm(m=m, n=n, segments=[Segment(cp.asarray(A), m, cp.asarray(B), n, k=k)], out=out, ldc=ldc, **kw)
        got = out.get().astype(np.float32)
        assert relative_error(got[:, :m], ref.T) < 1e-2
    assert np.isnan(got[..., m:]).all()  # the padding past m is never written


def test_out_transposed_refuses_what_it_cannot_store():
    import cupy as cp
    from cupy_moe.gpu.gemm import Segment, gemm

    a, b = cp.zeros((64, 128), bfloat16), cp.zeros((64, 256), bfloat16)
    out = cp.zeros((256, 128), cp.float32)
    with pytest.raises(ValueError, match="out_transposed"):
        gemm(m=128, n=256, segments=[Segment(a, 128, b, 256, k=64)], a_kmajor=False, b_kmajor=False,
             out=out, ldc=128, epilogue="f32", out_transposed=True)
