"""bench/benchmark.py's PyTorch peers compute the layer's math: the forward (routing included) and
the autograd backward against the NumPy reference, on PyTorch's CPU build where it is installed
(torch._grouped_mm runs on the CPU; the device is where they are timed). Skipped without PyTorch:
the library never needs it."""
import importlib.util
import os

import numpy as np
import pytest

import cupy_moe
from cupy_moe import MoEConfig, bfloat16
from cupy_moe.testing import make_grad_output, make_moe_inputs, relative_error

torch = pytest.importorskip("torch", reason="the benchmark's peers need PyTorch")


def _grouped_mm_on_the_cpu() -> bool:
    try:
        torch._grouped_mm(torch.zeros(2, 16, dtype=torch.bfloat16), torch.zeros(1, 16, 16, dtype=torch.bfloat16),
                          offs=torch.tensor([2], dtype=torch.int32))
        return True
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _grouped_mm_on_the_cpu(), reason="this PyTorch has no torch._grouped_mm on the CPU")

_path = os.path.join(os.path.dirname(__file__), "..", "bench", "benchmark.py")
_spec = importlib.util.spec_from_file_location("benchmark", _path)
benchmark = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmark)

CONFIGS = {
    "plain": MoEConfig(hidden_size=128, n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=64),
    "grouped": MoEConfig(hidden_size=64, n_routed_experts=32, num_experts_per_tok=6, moe_intermediate_size=32,
                         n_group=8, topk_group=3, routed_scaling_factor=2.5),
    "no_shared_unnormalized": MoEConfig(hidden_size=64, n_routed_experts=8, num_experts_per_tok=2,
                                        moe_intermediate_size=16, n_shared_experts=0, norm_topk_prob=False),
}


def _to_torch(a):
    """NumPy -> torch without a copy (the peers' torch.from_dlpack, which ml_dtypes' bf16 lacks)."""
    a = np.ascontiguousarray(a)
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


@pytest.mark.parametrize("routing", ["random", "skewed"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_torch_peers_compute_the_layer(name, routing, monkeypatch):
    monkeypatch.setattr(torch, "from_dlpack", _to_torch)
    cfg = CONFIGS[name]
    args = make_moe_inputs(cfg, 97, seed=3, routing=routing)
    out, ctx = cupy_moe.moe_forward(**args, config=cfg)
    dy = make_grad_output(cfg, 97, seed=1)
    want = [g for g in cupy_moe.moe_backward(dy, ctx) if g is not None]

    got_out = benchmark.layer_torch_forward_peer(args, cfg, to_torch=_to_torch)()
    assert relative_error(got_out.float().numpy(), out.astype(np.float32)) < 1e-2
    got = benchmark.layer_torch_autograd_peer(dy, ctx)()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert relative_error(g.float().numpy(), np.asarray(w, np.float32)) < 1e-2
