"""Helpers for tests and benchmarks: input generators and the SOL-080 benchmark's pass rule.

Generators draw with NumPy's Generator from a seed and return NumPy arrays, or CuPy arrays when
xp=cupy (drawn on the device with CuPy's generator, so GLM-size weights cost no host time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._arrays import bfloat16
from .config import MoEConfig


def _as_numpy(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass(frozen=True)
class PassResult:
    """Outcome of the pass rule for one output; bool(result) is result.ok."""

    ok: bool
    pass_fraction: float
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def sol080_pass_rule(out, ref, atol: float, rtol: float = 0.05,
                     min_fraction: float = 0.99) -> PassResult:
    """The SOL-ExecBench rule: compared in fp32, an element passes when
    |out - ref| <= atol + rtol * |ref|; at least min_fraction of the elements must pass; any NaN or
    Inf fails; an all-zero output where the reference is non-zero fails; shape and dtype must match.
    """
    out, ref = _as_numpy(out), _as_numpy(ref)
    if out.shape != ref.shape:
        return PassResult(False, 0.0, f"shape {out.shape} != reference {ref.shape}")
    if out.dtype != ref.dtype:
        return PassResult(False, 0.0, f"dtype {out.dtype} != reference {ref.dtype}")
    o, r = out.astype(np.float32), ref.astype(np.float32)
    if not np.isfinite(o).all():
        return PassResult(False, 0.0, "output holds NaN or Inf")
    if o.size and not o.any() and r.any():
        return PassResult(False, 0.0, "output is all zeros, the reference is not")
    if o.size == 0:
        return PassResult(True, 1.0, "empty")
    ok = np.abs(o - r) <= atol + rtol * np.abs(r)
    frac = float(ok.mean())
    if frac < min_fraction:
        return PassResult(False, frac, f"{frac:.4%} of elements within tolerance < {min_fraction:.0%}")
    return PassResult(True, frac, f"{frac:.4%} within tolerance")


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| accumulated in float64 (inf when out has NaN/Inf, 0 for two empty
    arrays). Works in chunks, so GLM-size weight gradients need no float64 copy of the whole. Two
    CuPy arrays are compared on their device (copying DeepSeek-V3's 22.5 GB of expert gradients
    to the host took minutes); anything else on the host."""
    xp = np
    if all(hasattr(a, "get") and not isinstance(a, np.ndarray) for a in (out, ref)):
        import cupy as xp
    o = (out if xp is not np else _as_numpy(out)).reshape(-1)
    r = (ref if xp is not np else _as_numpy(ref)).reshape(-1)
    num = den = 0.0
    step = 1 << 24
    for i in range(0, o.size, step):
        oc = o[i:i + step].astype(xp.float64)
        rc = r[i:i + step].astype(xp.float64)
        if not bool(xp.isfinite(oc).all()):
            return float("inf")
        num += float(xp.dot(oc - rc, oc - rc))
        den += float(xp.dot(rc, rc))
    return float(np.sqrt(num / den)) if den else float(np.sqrt(num))


def _rng_normal(xp, rng, shape, scale=1.0, dtype=bfloat16):
    if xp is np:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)
    a = xp.random.standard_normal(shape, dtype=xp.float32)
    a *= scale
    return a.astype(dtype)


def make_moe_inputs(config: MoEConfig, T: int, seed: int = 0, xp=np, dtype=bfloat16,
                    routing: str = "random"):
    """Random inputs for moe_forward as a dict of its argument names.

    routing: 'random' (zero bias), 'one_expert' (bias pushes every token onto experts 0..K-1, so
    expert 0 gets all T tokens and experts >= K none), 'skewed' (a Zipf-like bias).
    """
    rng = np.random.default_rng(seed)
    if xp is not np:
        xp.random.seed(seed)
    E, H, I, Is = (config.n_routed_experts, config.hidden_size, config.moe_intermediate_size,
                   config.shared_intermediate_size)
    bias = np.zeros(E, np.float32)
    if routing == "one_expert":
        bias[:config.num_experts_per_tok] = 10.0
    elif routing == "skewed":
        bias = (0.5 / np.arange(1, E + 1) ** 0.8).astype(np.float32)
    elif routing != "random":
        raise ValueError(f"routing: expected 'random', 'one_expert' or 'skewed', got {routing!r}")
    std = lambda fan_in: 1.0 / np.sqrt(fan_in)
    args = dict(
        hidden_states=_rng_normal(xp, rng, (T, H), 1.0, dtype),
        router_weight=_rng_normal(xp, rng, (E, H), std(H), dtype),
        e_score_correction_bias=xp.asarray(bias.astype(np.float64 if dtype == np.float64 else np.float32)),
        expert_gate_weight=_rng_normal(xp, rng, (E, I, H), std(H), dtype),
        expert_up_weight=_rng_normal(xp, rng, (E, I, H), std(H), dtype),
        expert_down_weight=_rng_normal(xp, rng, (E, H, I), std(I), dtype),
        shared_expert_gate_weight=None, shared_expert_up_weight=None, shared_expert_down_weight=None)
    if Is:
        args.update(shared_expert_gate_weight=_rng_normal(xp, rng, (Is, H), std(H), dtype),
                    shared_expert_up_weight=_rng_normal(xp, rng, (Is, H), std(H), dtype),
                    shared_expert_down_weight=_rng_normal(xp, rng, (H, Is), std(Is), dtype))
    return args


def make_grad_output(config: MoEConfig, T: int, seed: int = 1, xp=np, dtype=bfloat16):
    """A random dL/dout for moe_backward: the hidden_states make_moe_inputs(config, T, seed) draws
    first, without drawing its expert weights too (22.5 GB at DeepSeek-V3's sizes)."""
    rng = np.random.default_rng(seed)
    if xp is not np:
        xp.random.seed(seed)
    return _rng_normal(xp, rng, (T, config.hidden_size), 1.0, dtype)


def make_sol080_inputs(T: int, H: int = 4096, I: int = 1408, E: int = 128, K: int = 8,
                       seed: int = 0, xp=np):
    """The benchmark's inputs (sol080.md, 'Inputs for tests and benchmarks'), as a dict of the 15
    argument names. Derived inputs are computed in NumPy/CuPy float32 as the benchmark does."""
    rng = np.random.default_rng(seed)
    if xp is not np:
        xp.random.seed(seed)
    g = _rng_normal(xp, rng, (T, H))
    x = _rng_normal(xp, rng, (T, H))
    wr = _rng_normal(xp, rng, (E, H), 0.02)
    wg = _rng_normal(xp, rng, (I, H), 0.02)
    wu = _rng_normal(xp, rng, (I, H), 0.02)
    wd = _rng_normal(xp, rng, (H, I), 0.02)
    f32 = xp.float32
    xf = x.astype(f32)
    logits = xf @ wr.astype(f32).T
    scores = 1 / (1 + xp.exp(-logits))
    bias = xp.zeros(E, f32)
    idx = xp.argsort(-(scores + bias), axis=1)[:, :K].astype(xp.int64)
    sel = xp.take_along_axis(scores, idx, axis=1)
    tw = (sel / (sel.sum(axis=1, keepdims=True) + f32(1e-20))).astype(f32)
    gate = (xf @ wg.astype(f32).T).astype(bfloat16)
    up = (xf @ wu.astype(f32).T).astype(bfloat16)
    gf = gate.astype(f32)
    silu = (gf / (1 + xp.exp(-gf))).astype(bfloat16).astype(f32)  # silu(gate) in bf16 arithmetic
    act = (silu * up.astype(f32)).astype(bfloat16)
    return dict(grad_output=g, hidden_states=x, router_weight=wr, e_score_correction_bias=bias,
                router_logits=logits.astype(f32), scores=scores.astype(f32), topk_indices=idx,
                topk_weights=tw, score_mask=xp.ones((T, E), f32), shared_expert_gate_weight=wg,
                shared_expert_up_weight=wu, shared_expert_down_weight=wd, shared_gate_output=gate,
                shared_up_output=up, shared_activated=act)


#: (T, atol) of the 16 SOL-080 workloads, in the benchmark's order.
SOL080_WORKLOADS = ((384, 0.18), (6144, 0.25), (8192, 0.39), (3719, 0.25), (512, 0.20),
                    (192, 0.11), (211, 0.13), (3072, 0.26), (4093, 0.23), (1879, 0.20),
                    (3089, 0.22), (2053, 0.23), (997, 0.36), (1571, 0.20), (1321, 0.24),
                    (293, 0.12))


def ctx_to_numpy(ctx, host_inputs=None):
    """A copy of a GPU MoEContext with every array on the host (for the NumPy reference).
    host_inputs: moe_forward's arguments already copied to the host (a dict by argument name);
    the context's fields of the same names are taken from it instead of copied again (DeepSeek-V3's
    expert weights are 22.5 GB)."""
    import dataclasses

    host_inputs = host_inputs or {}
    return dataclasses.replace(ctx, **{
        f.name: host_inputs[f.name] if f.name in host_inputs else _as_numpy(getattr(ctx, f.name))
        for f in dataclasses.fields(ctx) if f.name != "config" and getattr(ctx, f.name) is not None})
