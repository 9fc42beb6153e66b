"""sol080_backward on the GPU: the benchmark's pass rule at all 16 workloads, and odd small shapes."""
import numpy as np
import pytest

import cupy_moe
from cupy_moe import bfloat16
from cupy_moe.testing import (SOL080_WORKLOADS, make_sol080_inputs, relative_error,
                              sol080_pass_rule)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_memory")]
NAMES = ("grad_hidden_states", "grad_router_weight", "grad_shared_expert_gate_weight",
         "grad_shared_expert_up_weight", "grad_shared_expert_down_weight")


def _run(T, H=4096, I=1408, E=128, K=8, seed=0):
    import cupy as cp

    a = make_sol080_inputs(T, H, I, E, K, seed=seed)
    out = cupy_moe.sol080_backward(**{k: cp.asarray(v) for k, v in a.items()})
    ref = cupy_moe.sol080_backward(**a)
    return out, ref


def _assert_router_residue(o, r, T):
    """grad_router_weight is an fp32 rounding residue (sol080.md): only its scale is comparable;
    with a handful of tokens both an all-zero and a non-zero residue are right, so non-zero is
    asked only where many rows make an all-zero result impossible in practice."""
    scale = np.abs(r).max()
    assert np.abs(o.get() - r).max() <= 4 * scale + 1e-30
    if T >= 64:
        assert np.abs(o.get()).max() > 0


def _assert_passes(out, ref, atol):
    """The benchmark's rule on every output, and 1e-2 relative error on all but the router's."""
    for name, o, r in zip(NAMES, out, ref):
        res = sol080_pass_rule(o, r, atol)
        assert res, (name, res.reason)
        if name != "grad_router_weight":
            assert relative_error(o, r) < 1e-2, name


@pytest.mark.parametrize("T,atol", SOL080_WORKLOADS)
def test_workloads_pass_rule(T, atol):
    _assert_passes(*_run(T, seed=T), atol)


@pytest.mark.parametrize("T,atol", [(449, 0.2), (600, 0.2), (700, 0.2), (1420, 0.2), (1536, 0.2), (3200, 0.22),
                                    (3328, 0.22)])
def test_plans_between_the_workloads_pass_rule(T, atol):
    """Plans that no workload reaches on an H200: grad_Wd on half the SMs beside a dgrad whose
    last row tile is partial (385 .. 511 tokens: SMALL_T_WD_HALF), d_act unsplit where its tiles
    fill more than a third of the SMs (513 .. 768 tokens: ACT_SPLIT_THIRD), d_act wide in one
    round beside the router where the fused one would fill every SM (1409 .. 1536:
    WIDE_FULL_ROUND) and the router queued beside a d_act on every SM where the fused d_act just
    passes two rounds (3200, 3328: ROUTER_QUEUED)."""
    _assert_passes(*_run(T, seed=T + 3), atol)


@pytest.mark.parametrize("split_cluster", [True, False])
@pytest.mark.parametrize("T", [1, 5, 130])
def test_split_k_at_glm_size(T, split_cluster, monkeypatch):
    """The small-T split-K paths at GLM-4.5-Air sizes (d_act in 8 / 8 / 5 pieces, the dgrad in 4 /
    4 / 2): the pieces summed in the GEMM by a cluster per tile (gemm and sol080.SPLIT_CLUSTER,
    an A/B path), or through global memory and the sum kernels (the default); both deterministic
    to the bit."""
    import cupy as cp
    from cupy_moe.gpu import gemm, sol080

    monkeypatch.setattr(gemm, "SPLIT_CLUSTER", split_cluster)
    monkeypatch.setattr(sol080, "SPLIT_CLUSTER", split_cluster)
    out, ref = _run(T, seed=T + 11)
    for name, o, r in zip(NAMES, out, ref):
        if name == "grad_router_weight":
            _assert_router_residue(o, r, T)
        else:
            assert sol080_pass_rule(o, r, 0.1), name
            assert relative_error(o, r) < 1e-2, name
    a = make_sol080_inputs(T, seed=T + 11)
    again = cupy_moe.sol080_backward(**{k: cp.asarray(v) for k, v in a.items()})
    for name, o, o2 in zip(NAMES, out, again):
        assert cp.array_equal(o.view(cp.uint8), o2.view(cp.uint8)), name


@pytest.mark.parametrize("T,H,I,E,K", [(1, 64, 24, 8, 2), (7, 36, 13, 6, 3), (333, 128, 40, 16, 4),
                                       (130, 2048, 72, 8, 2), (200, 1024, 136, 16, 4),
                                       (37, 64, 24, 160, 40)])
def test_small_shapes(T, H, I, E, K):
    out, ref = _run(T, H, I, E, K, seed=1)
    for name, o, r in zip(NAMES, out, ref):
        assert o.dtype == r.dtype and o.shape == r.shape, name
        assert np.isfinite(o.get().astype(np.float32)).all(), name
        if name == "grad_router_weight":
            _assert_router_residue(o, r, T)
        else:
            assert relative_error(o, r) < 1e-2, name


@pytest.mark.parametrize("bad,match", [(128, r"\[0, 128\).*128 in row 5"), (-3, "-3 in row 5"),
                                       ("repeat", "row 5 repeats")])
def test_bad_topk_indices_rejected_and_inputs_kept(bad, match):
    import cupy as cp

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(9, 64, 24, 128, 8, seed=2).items()}
    idx = a["topk_indices"].copy()
    idx[5, 3] = idx[5, 0] if bad == "repeat" else bad
    before = idx.copy()
    with pytest.raises(ValueError, match="topk_indices: " + ".*" + match):
        cupy_moe.sol080_backward(**dict(a, topk_indices=idx))
    assert (idx == before).all()


@pytest.mark.parametrize("E,K", [(128, 8), (160, 8), (40, 33)])  # both router kernels' checks
def test_a_row_with_two_equal_bad_indices_is_out_of_range_and_a_repeat_elsewhere_is_reported(E, K):
    """Two slots holding the same out-of-range value are reported as out of range (the range
    error goes first), and with every index in range the first repeating row is found."""
    import cupy as cp

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(70, 64, 24, E, K, seed=4).items()}
    idx = a["topk_indices"].copy()
    idx[9, 0] = idx[9, K - 1] = E + 7
    idx[3, 1] = idx[3, 0]
    with pytest.raises(ValueError, match=f"{E + 7} in row 9$"):
        cupy_moe.sol080_backward(**dict(a, topk_indices=idx))
    idx[9] = a["topk_indices"][9]
    idx[41, K - 1] = idx[41, 0]
    with pytest.raises(ValueError, match="row 3 repeats"):
        cupy_moe.sol080_backward(**dict(a, topk_indices=idx))


def test_bad_topk_indices_report_the_first_bad_row_across_blocks_and_leave_no_state():
    """The check folds many blocks' verdicts (256 rows each): the first bad row is reported
    whichever block finishes last, and a good call right after a bad one passes (the kernel
    resets its scratch itself)."""
    import cupy as cp

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(1000, 64, 24, 128, 8, seed=3).items()}
    good = a["topk_indices"]
    for rows, want in (((999, 700, 300), 300), ((513,), 513), ((0, 999), 0)):
        idx = good.copy()
        for r in rows:
            idx[r, 1] = 200
        with pytest.raises(ValueError, match=f"200 in row {want}$"):
            cupy_moe.sol080_backward(**dict(a, topk_indices=idx))
        idx = good.copy()
        idx[rows[-1], 2] = idx[rows[-1], 5]
        with pytest.raises(ValueError, match=f"row {rows[-1]} repeats"):
            cupy_moe.sol080_backward(**dict(a, topk_indices=idx))
        out = cupy_moe.sol080_backward(**a)
        assert relative_error(out[0], cupy_moe.sol080_backward(**{k: v.get() for k, v in a.items()})[0]) < 1e-2


def test_bad_indices_in_a_replayed_graph_raise_and_leave_the_next_call_right():
    """A loop on the same buffers replays a captured graph; bad indices written into the same
    index buffer raise (the replayed launches read the check's verdict and do nothing), and the
    call after the indices are repaired gives the results of before, bitwise."""
    import cupy as cp

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(300, 256, 136, 16, 4, seed=6).items()}
    want = [o.get() for o in cupy_moe.sol080_backward(**a)]
    for _ in range(3):  # eager, captured, replayed
        cupy_moe.sol080_backward(**a)
    good = a["topk_indices"][7].copy()
    a["topk_indices"][7, 2] = 99
    with pytest.raises(ValueError, match="99 in row 7"):
        cupy_moe.sol080_backward(**a)
    a["topk_indices"][7] = good
    for got, w in zip(cupy_moe.sol080_backward(**a), want):
        np.testing.assert_array_equal(got.get(), w)


def test_zero_tokens():
    out, ref = _run(0, 64, 24, 8, 2)
    for name, o, r in zip(NAMES, out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype, name
        assert not o.astype(np.float32).any(), name  # poisoned memory: zeros were written


def test_repeated_calls_replay_a_graph_that_reads_current_inputs():
    """A loop on the same buffers is captured (gpu/graphs.py) and replayed; replays give bitwise
    the eager results and read the inputs' current contents."""
    import cupy as cp
    from cupy_moe.gpu import graphs

    graphs.clear()
    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(300, 256, 136, 16, 4, seed=5).items()}

    def call():
        return [o.get() for o in cupy_moe.sol080_backward(**a)]

    def eager():
        graphs.ENABLED = False
        try:
            return call()
        finally:
            graphs.ENABLED = True

    want = before = eager()
    replayed = graphs.stats["replayed"]
    for _ in range(4):
        for got, w in zip(call(), want):
            np.testing.assert_array_equal(got, w)
    assert graphs.stats["replayed"] > replayed
    rng = np.random.default_rng(9)
    new = rng.standard_normal(a["grad_output"].shape, dtype=np.float32).astype(bfloat16)
    a["grad_output"][...] = cp.asarray(new)  # the same buffer, new contents
    replayed = graphs.stats["replayed"]
    got = [call() for _ in range(3)]
    assert graphs.stats["replayed"] > replayed
    want = eager()
    assert not np.array_equal(want[0], before[0])
    for g in got:
        for x, w in zip(g, want):
            np.testing.assert_array_equal(x, w)
    ref = cupy_moe.sol080_backward(**{k: v.get() for k, v in a.items()})
    for i in (0, 2, 3, 4):  # grad_router_weight is fp32 rounding residue (sol080.md; the tests above)
        assert relative_error(want[i].astype(np.float32), ref[i].astype(np.float32)) < 1e-2


def test_a_kept_graph_outlives_the_check_buffers_dropped_after_many_streams():
    """A graph captured on one stream bakes in that stream's top-k check buffers. Calls on 16 more
    streams make gpu/routing.py drop every stream's buffers; the graph must keep its own alive,
    so the first stream's next check gets new addresses (a new key: no replay writing into freed
    buffers) and its calls still report and give the results of before, bitwise."""
    import cupy as cp
    from cupy_moe.gpu import graphs, routing

    graphs.clear()
    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(300, 256, 136, 16, 4, seed=8).items()}
    # The inputs' copies run on the legacy stream, asynchronously to the host (pinned staging),
    # and a non-blocking stream does not wait for it: without this, the first calls can read
    # them half-written (the router then reports a row whose indices read back fine).
    cp.cuda.Device().synchronize()
    first = cp.cuda.Stream(non_blocking=True)
    with first:
        want = [o.get() for o in cupy_moe.sol080_backward(**a)]  # eager
        cupy_moe.sol080_backward(**a)  # captured
    assert graphs.stats["captured"] and len(graphs._graphs) == 1
    (_, workspace), = graphs._graphs.values()
    kept = workspace.check
    assert kept is not None and kept is routing._check_state[(cp.cuda.Device().id, first.ptr)]
    others = [cp.cuda.Stream(non_blocking=True) for _ in range(16)]
    for s in others:  # eager on each (seen once): the 16th new stream drops every stream's buffers
        with s:
            cupy_moe.sol080_backward(**a)
    assert (cp.cuda.Device().id, first.ptr) not in routing._check_state
    replayed = graphs.stats["replayed"]  # (the counts run over the whole session)
    with first:
        for _ in range(3):  # eager (a new key), captured, replayed
            # Host copies only: an output kept alive into the next call would move that call's
            # outputs to new addresses, i.e. a new key, and nothing would replay.
            got = [o.get() for o in cupy_moe.sol080_backward(**a)]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        fresh = routing._check_state[(cp.cuda.Device().id, first.ptr)]
    assert fresh is not kept and fresh.scratch.data.ptr != kept.scratch.data.ptr
    assert graphs.stats["replayed"] > replayed
    first.synchronize()


def _router_terms_in_order(tw, idx, mask, scores, q, E):
    """hi and lo of steps 7-10 in fp32 with the kernel's order of operations (k in order)."""
    f32 = np.float32
    T, K = idx.shape
    hi = np.zeros((T, E), bfloat16)
    lo = np.zeros((T, E), bfloat16)
    for t in range(T):
        S = f32(0)
        for k in range(K):
            S = f32(S + tw[t, k])
        S = f32(S + f32(1e-20))
        total = f32(0)
        for k in range(K):
            total = f32(total + f32(f32(q[t] * tw[t, k]) / S))
        c = f32(f32(q[t] - total) / S)
        G = np.zeros(E, f32)
        for k in range(K):
            G[idx[t, k]] = f32(G[idx[t, k]] + c)
        s = scores[t]
        grl = ((G * mask[t]).astype(f32) * s).astype(f32) * (f32(1) - s).astype(f32)
        hi[t] = grl.astype(f32).astype(bfloat16)
        lo[t] = (grl.astype(f32) - hi[t].astype(f32)).astype(bfloat16)
    return hi, lo


# sol080_router_lanes (K <= 32, E <= 128: 333 / 5 / 66) and sol080_router (E > 128 with the slots in
# the lanes: 29; K > 32: 37 / 11).
@pytest.mark.parametrize("T,H,E,K", [(333, 4096, 128, 8), (37, 64, 160, 40), (5, 36, 6, 3), (66, 200, 128, 32),
                                     (29, 72, 160, 8), (11, 48, 100, 33)])
def test_router_kernel_writes_the_contracts_router_terms_bitwise(T, H, E, K):
    """The router kernel (steps 7-10, plus the index check) against the contract's formula
    evaluated in the same fp32 order. grad_output holds +-1, +-1/2, +-1/4, so that q is exact
    whatever the order of its sum; the rest (c, the rounding residue the contract's
    grad_router_weight is made of, grl, its bf16 split) must then agree bit for bit, at the
    routed experts and as zeros elsewhere. Unnormalised weights and a random mask make the
    residue non-zero in many rows. The shapes take the kernel's paths: 16-byte rows or not,
    K <= 32 in registers or not, E up to 128 prefetched or more."""
    import cupy as cp
    from cupy_moe import validate
    from cupy_moe.gpu import sol080 as gpu_sol080

    a = make_sol080_inputs(T, H, 24, E, K, seed=T)
    rng = np.random.default_rng(T)
    a["grad_output"] = rng.choice([-1.0, -0.5, -0.25, 0.25, 0.5, 1.0], (T, H)).astype(bfloat16)
    a["topk_weights"] = (3 * rng.random((T, K))).astype(np.float32)
    a["score_mask"] = rng.random((T, E)).astype(np.float32)  # the contract's mask is all ones
    d = {k: cp.asarray(v) for k, v in a.items()}
    inputs = gpu_sol080._Inputs(d["grad_output"], d["hidden_states"], d["router_weight"], d["scores"],
                                d["topk_indices"], d["topk_weights"], d["score_mask"],
                                d["shared_expert_gate_weight"], d["shared_expert_up_weight"],
                                d["shared_expert_down_weight"], d["shared_gate_output"],
                                d["shared_up_output"], d["shared_activated"])
    acts = gpu_sol080._Acts(24, E)  # the fused weight gradient's row [hi | d_gate | d_up | lo]
    rows = cp.full((T, acts.ld), np.nan, bfloat16)
    check = validate.topk_check_in_kernel("topk_indices", inputs.idx, E)
    gpu_sol080._router_kernel(inputs, rows, acts.ld, acts.lo, check.kernel_args)
    check.finish()
    g = a["grad_output"].astype(np.float64)
    q = (g * g).sum(axis=1).astype(np.float32) / np.float32(K)  # the sum is exact in fp32 too
    hi, lo = _router_terms_in_order(a["topk_weights"], a["topk_indices"], a["score_mask"],
                                    a["scores"], q, E)
    assert np.abs(hi.astype(np.float32)).max() > 0  # the residue is not zero everywhere
    got = rows.get()
    np.testing.assert_array_equal(got[:, :E].view(np.uint16), hi.view(np.uint16))
    np.testing.assert_array_equal(got[:, acts.lo:].view(np.uint16), lo.view(np.uint16))
    assert np.isnan(got[:, E:acts.lo].astype(np.float32)).all()  # d_gate and d_up's columns untouched


@pytest.mark.parametrize("knob,value,T,atol", [("FUSED_D_ACT", False, 997, 0.36),
                                                ("FUSED_D_ACT", False, 2053, 0.23),
                                                ("WIDE_D_ACT", True, 3072, 0.26),
                                                ("WIDE_D_ACT", True, 6144, 0.25),
                                                ("FUSED_WGRAD", "1", 192, 0.11),
                                                ("FUSED_WGRAD", "1", 2053, 0.23),
                                                ("FUSED_WGRAD", "0", 8192, 0.39),
                                                ("WD_TRANSPOSED", "1", 8192, 0.39),
                                                ("WD_TRANSPOSED", "0", 1879, 0.20),
                                                ("SMALL_T_ORDER", "cap", 384, 0.18),
                                                ("SMALL_T_ORDER", "", 192, 0.11),
                                                ("DGRAD_SPLITS", "k", 211, 0.13),
                                                ("WD_FIRST", "0", 8192, 0.39),
                                                ("WD_FIRST", "1", 1879, 0.20),
                                                ("SWIGLU_SMS", "14", 8192, 0.39),
                                                ("SWIGLU_SMS", "16", 997, 0.36),
                                                ("SWIGLU_SMS", "0", 4093, 0.23)])
def test_ab_d_act_paths_pass_like_the_fused_one(knob, value, T, atol, monkeypatch):
    """The A/B knobs' other d_act paths. CUPY_MOE_SOL080_FUSED_D_ACT=0: d_act as a plain GEMM,
    then the contract's SwiGLU backward as an elementwise kernel (16-byte accesses for
    I % 8 == 0). CUPY_MOE_SOL080_WIDE_D_ACT=1: where the fused d_act leaves the router no room,
    d_act as a plain 128 x 256 GEMM (its last column tile half past n = 1408) with the router
    kernel beside it, then the elementwise SwiGLU backward. CUPY_MOE_SOL080_FUSED_WGRAD: the
    router weight gradient inside the grad_[Wg; Wu] GEMM where "auto" keeps it separate (T <=
    3200), and separate where "auto" fuses it (T = 8192). CUPY_MOE_SOL080_WD_TRANSPOSED: grad_Wd
    as (act^T g)^T, stored transposed, where "auto" leaves it plain (T = 8192), and plain where
    "auto" transposes it (T = 1879). CUPY_MOE_SOL080_SMALL_T_ORDER: grad_Wd's grid capped
    beside the dgrad alone, or the side-stream order with the dgrad split in two (its pieces
    summed by a kernel). CUPY_MOE_SOL080_DGRAD_SPLITS=k: the split dgrad in the default order.
    CUPY_MOE_SOL080_WD_FIRST: the router beside d_act at T = 8192; grad_Wd first with the router
    beside it at T = 1879. CUPY_MOE_SOL080_SWIGLU_SMS: d_act plain, the SwiGLU backward on a few
    SMs beside grad_Wd (where "auto" leaves it fused), and fused where "auto" does not."""
    from cupy_moe.gpu import sol080 as gpu_sol080

    monkeypatch.setattr(gpu_sol080, knob, value)
    _assert_passes(*_run(T, seed=T + 1), atol)


@pytest.mark.parametrize("T", [997, 2053])
def test_packed_contract_gives_the_same_bits(T, monkeypatch):
    """The fused d_act's SwiGLU contract with bf16x2 products (Sm90Config.PACKED_CONTRACT, the
    default) writes exactly what the element-by-element fp32 form writes."""
    import cupy as cp
    from cupy_moe.gpu import gemm

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(T, seed=T + 5).items()}
    packed = [o.copy() for o in cupy_moe.sol080_backward(**a)]
    monkeypatch.setattr(gemm, "CONFIG_OVERRIDE", {"PACKED_CONTRACT": False})
    plain = cupy_moe.sol080_backward(**a)
    for name, o, o2 in zip(NAMES, packed, plain):
        assert cp.array_equal(o.view(cp.uint8), o2.view(cp.uint8)), name


@pytest.mark.parametrize("sms,T", [("14", 997), ("24", 1031), ("5", 2053), ("auto", 4093)])
def test_swiglu_beside_grad_wd_gives_the_fused_paths_bits(sms, T, monkeypatch):
    """CUPY_MOE_SOL080_SWIGLU_SMS: d_act plain, then the SwiGLU contract by the bulk-copy kernel on
    a few SMs beside grad_Wd (rows split unevenly among the blocks, a last chunk short of its
    rows), writes exactly what the fused d_act epilogue writes in the same order of launches
    (WD_FIRST=0 in both calls): every output bitwise."""
    import cupy as cp
    from cupy_moe.gpu import sol080 as gpu_sol080

    a = {k: cp.asarray(v) for k, v in make_sol080_inputs(T, seed=T + 7).items()}
    monkeypatch.setattr(gpu_sol080, "WD_FIRST", "0")
    monkeypatch.setattr(gpu_sol080, "SWIGLU_SMS", "0")
    fused = [o.copy() for o in cupy_moe.sol080_backward(**a)]
    monkeypatch.setattr(gpu_sol080, "SWIGLU_SMS", sms)
    plan = gpu_sol080._Plan.of(a["grad_output"], a["hidden_states"], a["router_weight"],
                               a["shared_expert_gate_weight"], a["shared_expert_up_weight"],
                               a["shared_expert_down_weight"], a["shared_gate_output"])
    assert plan.swiglu_sms and not plan.act_fused  # (its own workspace: poisoned memory)
    beside = cupy_moe.sol080_backward(**a)
    for name, o, o2 in zip(NAMES, fused, beside):
        assert cp.array_equal(o.view(cp.uint8), o2.view(cp.uint8)), name


@pytest.mark.parametrize("T,H,I,E,K,sms", [(1100, 128, 1000, 16, 4, "3"), (8500, 64, 136, 8, 2, "7")])
def test_swiglu_beside_small_shapes(T, H, I, E, K, sms, monkeypatch):
    """The same at small widths (d_act unsplit: at least 67 of its 128 x 128 tiles): a chunk of 11
    rows at I = 1000 and rows split 366 / 367 / 367 among 3 blocks; a last column tile 8 wide at
    I = 136; the fused path's bits, and within the pass rule of the reference."""
    import cupy as cp
    from cupy_moe.gpu import sol080 as gpu_sol080

    host = make_sol080_inputs(T, H, I, E, K, seed=3)
    a = {k: cp.asarray(v) for k, v in host.items()}
    monkeypatch.setattr(gpu_sol080, "WD_FIRST", "0")
    monkeypatch.setattr(gpu_sol080, "SWIGLU_SMS", "0")
    fused = [o.copy() for o in cupy_moe.sol080_backward(**a)]
    monkeypatch.setattr(gpu_sol080, "SWIGLU_SMS", sms)
    beside = cupy_moe.sol080_backward(**a)
    for name, o, o2 in zip(NAMES, fused, beside):
        assert cp.array_equal(o.view(cp.uint8), o2.view(cp.uint8)), name
    ref = cupy_moe.sol080_backward(**host)
    for name, o, r in zip(NAMES, beside, ref):
        if name == "grad_router_weight":
            _assert_router_residue(o, r, T)
        else:
            assert relative_error(o, r) < 1e-2, name
