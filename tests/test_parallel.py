"""Expert parallelism without GPUs: the dispatch bookkeeping on its own, and whole worlds of W
simulated ranks (threads) whose results must equal one device's on the same global inputs."""
import os
import sys
import threading

import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig
from cupy_moe.parallel import SingleRankGroup, thread_groups
from cupy_moe.parallel.dispatch import plan_from_counts
from cupy_moe.testing import make_moe_inputs, relative_error

CFG = MoEConfig(hidden_size=24, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=6,
                n_group=2, topk_group=2, routed_scaling_factor=1.5)
EXPERT_FIELDS = ("expert_gate_weight", "expert_up_weight", "expert_down_weight")


def test_plan_from_counts():
    rng = np.random.default_rng(0)
    W, El = 3, 4
    recv = rng.integers(0, 5, (W, El))
    recv[1] = 0  # a source that sends nothing
    send = rng.integers(0, 5, (W, El))
    plan = plan_from_counts(send, recv)
    assert (plan.send_counts == send.sum(1)).all() and (plan.recv_counts == recv.sum(1)).all()
    # Tag every received row with (source, local expert, position) and check the expert-major order.
    tags = [(s, e, i) for s in range(W) for e in range(El) for i in range(recv[s, e])]
    ordered = [tags[j] for j in plan.to_expert_major]
    assert ordered == sorted(tags, key=lambda t: (t[1], t[0], t[2]))
    for e in range(El):
        block = ordered[plan.local_offsets[e]:plan.local_offsets[e + 1]]
        assert all(t[1] == e for t in block) and len(block) == recv[:, e].sum()
    assert (plan.to_expert_major[plan.to_received] == np.arange(len(tags))).all()


def _run_world(W, shards, weights, dys, cfg=CFG):
    """Forward + backward on W threads; returns each rank's (out, grads, ctx)."""
    groups = thread_groups(W)
    results, errors = [None] * W, []

    def rank(r):
        try:
            El = cfg.n_routed_experts // W
            args = dict(weights, hidden_states=shards[r])
            for f in EXPERT_FIELDS:
                args[f] = weights[f][r * El:(r + 1) * El]
            out, ctx = cupy_moe.moe_forward(**args, config=cfg, ep_group=groups[r])
            results[r] = (out, cupy_moe.moe_backward(dys[r], ctx), ctx)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
            groups[r]._x.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _run_world_with(cfg, sizes, seed, dt, routing, tol):
    """A world of len(sizes) ranks holding sizes[r] tokens each, checked against one process."""
    W, T = len(sizes), sum(sizes)
    g = make_moe_inputs(cfg, T, seed=seed, dtype=dt, routing=routing)
    dy = np.random.default_rng(seed + 1).standard_normal((T, cfg.hidden_size)).astype(dt)
    ref_out, ref_ctx = cupy_moe.moe_forward(**g, config=cfg)
    ref = cupy_moe.moe_backward(dy, ref_ctx)
    cuts = np.cumsum([0] + list(sizes))
    shards = [g["hidden_states"][cuts[r]:cuts[r + 1]] for r in range(W)]
    dys = [dy[cuts[r]:cuts[r + 1]] for r in range(W)]
    results = _run_world(W, shards, g, dys, cfg)
    f64 = lambda a: np.asarray(a, np.float64)
    out = np.concatenate([r[0] for r in results])
    assert relative_error(f64(out), f64(ref_out)) <= tol
    dx = np.concatenate([r[1].hidden_states for r in results])
    assert relative_error(f64(dx), f64(ref.hidden_states)) <= tol
    for f in EXPERT_FIELDS:  # each rank holds its experts' whole gradient
        got = np.concatenate([getattr(r[1], f) for r in results])
        assert relative_error(f64(got), f64(getattr(ref, f))) <= tol, f
    for f in ("router_weight", "shared_expert_gate_weight", "shared_expert_up_weight",
              "shared_expert_down_weight"):  # replicated weights: the ranks' shares sum up
        if getattr(ref, f) is None:
            assert all(getattr(r[1], f) is None for r in results)
            continue
        got = sum(f64(getattr(r[1], f)) for r in results)
        assert relative_error(got, f64(getattr(ref, f))) <= tol, f
    # Every rank's tokens_per_expert counts its own tokens; the world's sum is the device's.
    assert (sum(r[2].tokens_per_expert for r in results) == ref_ctx.tokens_per_expert).all()


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float64", "bf16"])
@pytest.mark.parametrize("routing", ["random", "one_expert"])
def test_world_equals_one_device(W, dtype, routing):
    dt = np.float64 if dtype == "float64" else cupy_moe.bfloat16
    sizes = [7, 0, 5, 3][:W] if W > 1 else [11]
    _run_world_with(CFG, sizes, W, dt, routing, 1e-12 if dtype == "float64" else 1e-2)


def test_single_rank_group_is_the_same_code_path():
    g = make_moe_inputs(CFG, 9, seed=1, dtype=np.float64)
    out, ctx = cupy_moe.moe_forward(**g, config=CFG, ep_group=SingleRankGroup())
    assert ctx.expert_parallel is not None and ctx.gate is None
    ref_out, _ = cupy_moe.moe_forward(**g, config=CFG)
    np.testing.assert_allclose(out, ref_out, rtol=1e-13, atol=1e-13)


def test_ep_validation():
    g = make_moe_inputs(CFG, 4, seed=0)
    with pytest.raises(TypeError, match="ep_group"):
        cupy_moe.moe_forward(**g, config=CFG, ep_group="nccl")
    with pytest.raises(ValueError, match="ep_group.*multiple of the world size"):
        cupy_moe.moe_forward(**g, config=CFG, ep_group=thread_groups(3)[0])
    with pytest.raises(ValueError, match=r"expert_gate_weight.*E/W = 4"):
        cupy_moe.moe_forward(**g, config=CFG, ep_group=thread_groups(2)[0])


def _rank_step(group, tokens, seed):
    """A rank of a process world (module level, so spawned processes can import it)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "examples"))
    import expert_parallel

    return expert_parallel.rank_step(group, tokens, seed)


def test_processes_through_queues_equal_one_process():
    """W = 2 real processes (spawned, the queue transport), via the example's own check."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "examples"))
    import expert_parallel

    err, seconds = expert_parallel.check_world(2, 37, seed=3)
    assert err < 1e-2 and len(seconds) == 2


def test_run_world_reports_a_failing_rank():
    from cupy_moe.parallel import run_world

    with pytest.raises(RuntimeError, match="rank"):
        run_world(2, _rank_step, 10, -5)  # a negative seed fails in every rank


@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_p2p_schedule_moves_what_the_block_all_to_all_moves(W):
    """NcclGroup's transfers (p2p_schedule), executed on byte buffers of W simulated ranks, give
    every rank what the thread world's all-to-all gives; every send meets a receive of its size."""
    from cupy_moe.parallel.groups import p2p_schedule

    rng = np.random.default_rng(W)
    row_bytes = 6
    counts = rng.integers(0, 4, (W, W))  # counts[s, d]: rows rank s sends to rank d
    counts[0, :] = 0  # a rank that sends nothing
    send = [rng.integers(0, 256, counts[s].sum() * row_bytes, dtype=np.uint8) for s in range(W)]
    recv = [np.zeros(counts[:, d].sum() * row_bytes, np.uint8) for d in range(W)]
    schedules = [p2p_schedule(r, counts[r], counts[:, r], row_bytes) for r in range(W)]
    for r, sched in enumerate(schedules):
        for kind, peer, s_off, d_off, n in sched:
            if kind == "copy":
                recv[r][d_off:d_off + n] = send[r][s_off:s_off + n]
            elif kind == "send":  # the matching receive on the peer
                match = [t for t in schedules[peer] if t[0] == "recv" and t[1] == r]
                assert len(match) == 1 and match[0][4] == n
                recv[peer][match[0][3]:match[0][3] + n] = send[r][s_off:s_off + n]
            else:
                assert any(t[0] == "send" and t[1] == r for t in schedules[peer])
    groups = thread_groups(W)
    want = [None] * W

    def rank(r):
        rows = send[r].reshape(-1, row_bytes)
        want[r] = groups[r].exchange_rows(rows, counts[r], counts[:, r]).reshape(-1)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(W):
        np.testing.assert_array_equal(recv[r], want[r])


def test_p2p_schedule_refuses_inconsistent_self_counts():
    from cupy_moe.parallel.groups import p2p_schedule

    with pytest.raises(RuntimeError, match="rank 1: sends itself 2 rows but expects 3"):
        p2p_schedule(1, [0, 2], [0, 3], 4)


def test_group_refuses_the_other_array_module():
    """A queue world moves NumPy rows between processes; it refuses CuPy inputs (and an NCCL
    group NumPy ones) before anything runs."""
    from cupy_moe.parallel import QueueGroup

    g = make_moe_inputs(CFG, 4, seed=0)
    group = QueueGroup([None], 0)
    group.array_modules = ("cupy",)  # what an NcclGroup says, without needing NCCL here
    with pytest.raises(TypeError, match=r"ep_group: a QueueGroup moves cupy arrays, got numpy"):
        cupy_moe.moe_forward(**g, config=CFG, ep_group=group)
