"""Argument checks for every public function: one place, one wording for every error.

All checks run on shapes, dtypes and strides only, except `check_topk_indices`, which reads the
index values (one small kernel and a host sync on the GPU path): a bad routing raises, and no
kernel does any work on it (those enqueued before the host has the verdict read it first).
"""
from __future__ import annotations

import numpy as np

from ._arrays import bfloat16, is_array, is_cupy_array


def _dtype_name(dt) -> str:
    dt = np.dtype(dt)
    if dt == bfloat16:
        return "bfloat16"
    if not dt.isnative:  # '>f4' and '<f4' are both named float32: say which one this is
        return f"{dt.name} in non-native byte order ({dt.str})"
    return dt.name


class Dims:
    """Binds symbolic dimension names (T, H, ...) to sizes as arrays are checked.

    The first array that mentions a name fixes its size; every later mention must agree, and the
    error names both arguments so the user sees which two disagree.
    """

    def __init__(self, **known: int):
        self.sizes = dict(known)
        self.source = {k: "the config" for k in known}

    def __getitem__(self, name: str) -> int:
        return self.sizes[name]

    def check(self, name: str, a, dtypes, dims: tuple) -> None:
        """Check array `a`, argument `name`: dtype in `dtypes`, shape `dims`, C-contiguous.
        (Runs on every public call: the messages are only built on the error path.)"""
        dtypes = dtypes if isinstance(dtypes, (tuple, list)) else (dtypes,)
        if a.dtype not in dtypes:
            want = " or ".join(_dtype_name(d) for d in dtypes)
            raise TypeError(f"{name}: expected dtype {want}, got {_dtype_name(a.dtype)}")
        shape = a.shape
        if len(shape) != len(dims):
            raise ValueError(f"{name}: expected a {len(dims)}-d array of shape {_spec(dims)}, "
                             f"got {len(shape)}-d shape {tuple(shape)}")
        for axis, (d, n) in enumerate(zip(dims, shape)):
            want = d if isinstance(d, int) else self.sizes.get(d)
            if want is None:
                self.sizes[d] = int(n)
                self.source[d] = f"{name}.shape[{axis}]"
            elif n != want:
                where = "" if isinstance(d, int) else f" ({d} = {want} from {self.source[d]})"
                raise ValueError(f"{name}: expected shape {_spec(dims)}{where}, got {tuple(shape)}")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array, got strides {a.strides} "
                             f"for shape {tuple(shape)} (pass xp.ascontiguousarray({name}))")


def _spec(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


class IndexCheck:
    """A top-k index check under way. finish() completes it (waits for the verdict; ValueError
    naming the first bad row). cancel: on the GPU path, the device address of the verdict, which
    launches enqueued before finish() read so that they do nothing on bad indices (gemm's
    cancel); None where there is nothing to read (NumPy, no rows). kernel_args: for a check that
    the caller's own kernel runs (topk_check_in_kernel), the arguments that kernel takes.
    settle(): for a call that fails before finish(), waits until the check can no longer write
    (a later check's verdict is then its own). keep: the buffers behind cancel and kernel_args,
    which whatever replays those launches later (a captured CUDA graph) must hold, so that their
    addresses are neither freed nor handed to another check while it can still run; report: the
    address the verdict is reported to (with cancel, what such a replay bakes in)."""

    def __init__(self, finish=lambda: None, cancel=None, kernel_args=None, settle=lambda: None, keep=None,
                 report=None):
        self.finish, self.cancel, self.kernel_args, self.settle = finish, cancel, kernel_args, settle
        self.keep, self.report = keep, report


def check_topk_indices(name: str, idx, n_experts: int) -> None:
    """Every index in [0, n_experts) and no index repeated within a row.

    On the GPU path one small kernel checks all rows and the host waits for its verdict (two
    ints in host-mapped memory); only when a row is bad is that row copied back to word the
    error. (SOL-080's GPU path instead runs the check in its own first kernel and waits after
    enqueueing its work: topk_check_in_kernel.)
    """
    _topk_check(name, idx, n_experts).finish()


def topk_check_in_kernel(name: str, idx, n_experts: int) -> IndexCheck:
    """The GPU top-k index check run by the caller's first kernel instead of a kernel of its own
    (SOL-080's router kernel reads the rows anyway): launch that kernel with kernel_args
    (cuda_src/common/topk_check.cuh) before anything reads cancel, then call finish(). No rows:
    nothing to run (kernel_args None)."""
    return _topk_check(name, idx, n_experts, launch=False)


def _topk_check(name, idx, n_experts, launch=True) -> IndexCheck:
    if idx.size == 0:
        return IndexCheck()
    if is_cupy_array(idx):
        from .gpu.routing import next_topk_check, start_topk_check

        pending = start_topk_check(idx, n_experts) if launch else next_topk_check()

        def finish():
            bad_range, bad_repeat = pending.result()
            if bad_range is not None:
                rows = idx[bad_range].get()
                bad = next(int(v) for v in rows if v < 0 or v >= n_experts)
                raise ValueError(f"{name}: expected expert indices in [0, {n_experts}), found {bad} "
                                 f"in row {bad_range}")
            if bad_repeat is not None:
                raise ValueError(f"{name}: expected distinct experts within a row, row {bad_repeat} "
                                 f"repeats one: {idx[bad_repeat].get().tolist()}")
        return IndexCheck(finish, pending.cancel, None if launch else pending.kernel_args,
                          pending.settle, keep=pending.buffers, report=pending.buffers.device_report)
    _check_topk_numpy(name, idx, n_experts)
    return IndexCheck()


def _check_topk_numpy(name, idx, n_experts):
    out_of_range = (idx < 0) | (idx >= n_experts)
    if out_of_range.any():
        row = int(np.argmax(out_of_range.any(axis=1)))
        bad = int(idx[row][out_of_range[row]][0])
        raise ValueError(f"{name}: expected expert indices in [0, {n_experts}), found {bad} "
                         f"in row {row}")
    if idx.shape[1] > 1:
        s = np.sort(idx, axis=1)
        rep = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if rep.any():
            row = int(np.argmax(rep))
            raise ValueError(f"{name}: expected distinct experts within a row, row {row} repeats "
                             f"one: {idx[row].tolist()}")


def require_module(name: str, a, gpu: bool) -> None:
    if is_cupy_array(a) != gpu:
        want, got = ("cupy.ndarray", "numpy.ndarray") if gpu else ("numpy.ndarray", "cupy.ndarray")
        raise TypeError(f"{name}: expected a {want} like the forward's inputs, got a {got}")


_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)
_INT64 = np.dtype(np.int64)

MOE_WEIGHTS = ("router_weight", "expert_gate_weight", "expert_up_weight", "expert_down_weight",
               "shared_expert_gate_weight", "shared_expert_up_weight", "shared_expert_down_weight")


# The GPU path's router kernels keep a token's top-k picks in the lanes of one warp and the kept
# expert groups in a 64-bit mask.
GPU_MAX_TOPK, GPU_MAX_GROUPS = 32, 64


def gpu_config(config) -> None:
    """The GPU path's limits on a MoEConfig (moe_forward checks them for CuPy inputs)."""
    if config.n_group > GPU_MAX_GROUPS:
        raise ValueError(f"config.n_group: the GPU path supports up to {GPU_MAX_GROUPS} groups, "
                         f"got {config.n_group}")
    if config.num_experts_per_tok > GPU_MAX_TOPK:
        raise ValueError(f"config.num_experts_per_tok: the GPU path supports up to {GPU_MAX_TOPK} "
                         f"experts per token, got {config.num_experts_per_tok}")


def moe_forward_args(args: dict, config, ep_group=None):
    """Check moe_forward's arguments (a name -> value dict in signature order); returns xp."""
    from .config import MoEConfig

    if not isinstance(config, MoEConfig):
        raise TypeError(f"config: expected a cupy_moe.MoEConfig, got {type(config).__name__}")
    experts_here = config.n_routed_experts
    if ep_group is not None:
        from .parallel import ExpertParallelGroup

        if not isinstance(ep_group, ExpertParallelGroup):
            raise TypeError(f"ep_group: expected a cupy_moe.parallel.ExpertParallelGroup, "
                            f"got {type(ep_group).__name__}")
        W = ep_group.world_size
        if config.n_routed_experts % W:
            raise ValueError(f"ep_group: n_routed_experts ({config.n_routed_experts}) must be a "
                             f"multiple of the world size ({W})")
        experts_here = config.n_routed_experts // W
    for name in ("hidden_states", "e_score_correction_bias") + MOE_WEIGHTS[:4]:
        if args[name] is None:
            raise TypeError(f"{name}: expected an array, got None")
    if config.n_shared_experts == 0:
        for name in MOE_WEIGHTS[4:]:
            if args[name] is not None:
                raise ValueError(f"{name}: expected None since config.n_shared_experts == 0, "
                                 f"got an array of shape {tuple(args[name].shape)}")
    else:
        for name in MOE_WEIGHTS[4:]:
            if args[name] is None:
                raise ValueError(f"{name}: expected an array since config.n_shared_experts = "
                                 f"{config.n_shared_experts}, got None")
    xp = array_module_of(args)
    if xp is not np:
        gpu_config(config)
    if ep_group is not None:
        module = "numpy" if xp is np else "cupy"
        if module not in ep_group.array_modules:
            raise TypeError(f"ep_group: a {type(ep_group).__name__} moves "
                            f"{' or '.join(ep_group.array_modules)} arrays, got {module}.ndarray "
                            f"inputs")
    x = args["hidden_states"]
    # bf16 everywhere (both paths), or float64 everywhere (the NumPy gradient-check path).
    floats = (bfloat16,) if xp is not np else (bfloat16, _FLOAT64)
    dims = Dims(H=config.hidden_size, E=config.n_routed_experts, I=config.moe_intermediate_size,
                Is=config.shared_intermediate_size)
    e_here = "E"  # the experts whose weights this call holds: all, or the rank's shard
    if ep_group is not None:
        e_here = "E/W"
        dims.sizes[e_here] = experts_here
        dims.source[e_here] = "config.n_routed_experts / ep_group.world_size"
    dims.check("hidden_states", x, floats, ("T", "H"))
    dt = x.dtype
    bias_dtypes = (_FLOAT32,) if dt == bfloat16 else (_FLOAT32, _FLOAT64)
    dims.check("router_weight", args["router_weight"], dt, ("E", "H"))
    dims.check("e_score_correction_bias", args["e_score_correction_bias"], bias_dtypes, ("E",))
    dims.check("expert_gate_weight", args["expert_gate_weight"], dt, (e_here, "I", "H"))
    dims.check("expert_up_weight", args["expert_up_weight"], dt, (e_here, "I", "H"))
    dims.check("expert_down_weight", args["expert_down_weight"], dt, (e_here, "H", "I"))
    if config.n_shared_experts:
        dims.check("shared_expert_gate_weight", args["shared_expert_gate_weight"], dt, ("Is", "H"))
        dims.check("shared_expert_up_weight", args["shared_expert_up_weight"], dt, ("Is", "H"))
        dims.check("shared_expert_down_weight", args["shared_expert_down_weight"], dt, ("H", "Is"))
    return xp


def moe_backward_args(grad_output, ctx):
    """Check moe_backward's arguments; returns xp."""
    from .context import MoEContext

    if not isinstance(ctx, MoEContext):
        raise TypeError(f"ctx: expected the cupy_moe.MoEContext returned by moe_forward, "
                        f"got {type(ctx).__name__}")
    if not is_array(grad_output):
        raise TypeError(f"grad_output: expected a numpy.ndarray or cupy.ndarray, "
                        f"got {type(grad_output).__name__}")
    gpu = is_cupy_array(ctx.hidden_states)
    require_module("grad_output", grad_output, gpu)
    x = ctx.hidden_states
    dims = Dims(T=x.shape[0], H=x.shape[1])
    dims.source.update(T="ctx.hidden_states.shape[0]", H="ctx.hidden_states.shape[1]")
    dims.check("grad_output", grad_output, x.dtype, ("T", "H"))
    if gpu:
        import cupy
        return cupy
    return np


SOL080_ARGS = (
    ("grad_output", bfloat16, ("T", "H")),
    ("hidden_states", bfloat16, ("T", "H")),
    ("router_weight", bfloat16, ("E", "H")),
    ("e_score_correction_bias", _FLOAT32, ("E",)),
    ("router_logits", _FLOAT32, ("T", "E")),
    ("scores", _FLOAT32, ("T", "E")),
    ("topk_indices", _INT64, ("T", "K")),
    ("topk_weights", _FLOAT32, ("T", "K")),
    ("score_mask", _FLOAT32, ("T", "E")),
    ("shared_expert_gate_weight", bfloat16, ("I", "H")),
    ("shared_expert_up_weight", bfloat16, ("I", "H")),
    ("shared_expert_down_weight", bfloat16, ("H", "I")),
    ("shared_gate_output", bfloat16, ("T", "I")),
    ("shared_up_output", bfloat16, ("T", "I")),
    ("shared_activated", bfloat16, ("T", "I")),
)


def sol080_args(args: dict, check_indices: bool = True):
    """Check sol080_backward's 15 arguments; returns (xp, dims) with T, H, I, E, K bound.
    check_indices=False leaves the top-k index values to the caller (the GPU path checks them in
    its first kernel: topk_check_in_kernel).

    Every check but the index values' depends only on each argument's type, dtype, shape and
    strides, so a call whose arguments all match one that passed before (a training or benchmark
    loop) skips them (about 5 us of a ~110 us call at T = 192 on the H200). The index values are
    checked on every call."""
    signature = _signature(args)
    passed = _sol080_passed.get(signature) if signature is not None else None
    if passed is None:
        passed = _sol080_structure(args)
        if signature is not None:
            if len(_sol080_passed) >= 64:
                _sol080_passed.clear()
            _sol080_passed[signature] = passed
    xp, dims = passed
    if check_indices:
        check_topk_indices("topk_indices", args["topk_indices"], dims["E"])
    return xp, dims


_sol080_passed: dict = {}  # argument signature -> (xp, Dims) of a call whose checks passed


def _signature(args: dict):
    """(type, dtype, shape, strides) of every argument in order, or None when one lacks them."""
    try:
        signature = tuple((type(a), a.dtype, a.shape, a.strides) for a in args.values())
        hash(signature)
    except (AttributeError, TypeError):  # not an array (the full checks word the error)
        return None
    return signature


def _sol080_structure(args: dict):
    for name, _, _ in SOL080_ARGS:
        if args[name] is None:
            raise TypeError(f"{name}: expected an array, got None")
    xp = array_module_of(args)
    dims = Dims()
    for name, dtype, shape in SOL080_ARGS:
        dims.check(name, args[name], dtype, shape)
    if dims["K"] > dims["E"]:
        raise ValueError(f"topk_indices: expected K <= E = {dims['E']} distinct experts per row, "
                         f"got K = {dims['K']}")
    return xp, dims


def array_module_of(args: dict):
    from ._arrays import array_module

    return array_module(args.items())
