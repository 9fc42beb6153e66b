"""MoEConfig: the hyper-parameters of one MoE layer, frozen and validated."""
from __future__ import annotations

import math
from dataclasses import dataclass


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"MoEConfig.{name}: expected int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"MoEConfig.{name}: expected a positive int, got {value}")


@dataclass(frozen=True)
class MoEConfig:
    """Shapes and routing rules of a GLM-4.5 / DeepSeek-V3 style MoE layer.

    hidden_size (H), n_routed_experts (E), num_experts_per_tok (K) and moe_intermediate_size (I)
    size the routed experts; the shared expert has width I * n_shared_experts (0 disables it).
    Selection is group-limited: the E experts form n_group groups, a group scores the sum of its two
    largest biased scores, the topk_group best groups stay, and the K best experts among them win.
    """

    hidden_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        for name in ("hidden_size", "n_routed_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "n_group", "topk_group"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.n_shared_experts, bool) or not isinstance(self.n_shared_experts, int):
            raise TypeError("MoEConfig.n_shared_experts: expected int, "
                            f"got {type(self.n_shared_experts).__name__}")
        if self.n_shared_experts < 0:
            raise ValueError(f"MoEConfig.n_shared_experts: expected >= 0, got {self.n_shared_experts}")
        if not isinstance(self.norm_topk_prob, bool):
            raise TypeError("MoEConfig.norm_topk_prob: expected bool, "
                            f"got {type(self.norm_topk_prob).__name__}")
        r = self.routed_scaling_factor
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise TypeError(f"MoEConfig.routed_scaling_factor: expected float, got {type(r).__name__}")
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"MoEConfig.routed_scaling_factor: expected a finite value > 0, got {r}")
        E, G = self.n_routed_experts, self.n_group
        if E % G:
            raise ValueError(f"MoEConfig.n_group: n_routed_experts ({E}) must be a multiple of "
                             f"n_group ({G})")
        if self.topk_group > G:
            raise ValueError(f"MoEConfig.topk_group: expected <= n_group ({G}), got {self.topk_group}")
        if G > 1 and E // G < 2:
            raise ValueError(f"MoEConfig.n_group: a group's score sums its two best experts, so each "
                             f"group needs >= 2 experts; got {E // G} (E={E}, n_group={G})")
        selectable = self.topk_group * (E // G)
        if self.num_experts_per_tok > selectable:
            raise ValueError(f"MoEConfig.num_experts_per_tok: expected <= {selectable} (the experts "
                             f"in topk_group kept groups), got {self.num_experts_per_tok}")

    @property
    def shared_intermediate_size(self) -> int:
        """Width of the shared expert's SwiGLU MLP (0 when there is none)."""
        return self.moe_intermediate_size * self.n_shared_experts

    @classmethod
    def glm45_air(cls) -> "MoEConfig":
        return cls(hidden_size=4096, n_routed_experts=128, num_experts_per_tok=8,
                   moe_intermediate_size=1408, n_shared_experts=1, n_group=1, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=1.0)

    @classmethod
    def glm45(cls) -> "MoEConfig":
        return cls(hidden_size=5120, n_routed_experts=160, num_experts_per_tok=8,
                   moe_intermediate_size=1536, n_shared_experts=1, n_group=1, topk_group=1,
                   norm_topk_prob=True, routed_scaling_factor=2.5)

    @classmethod
    def deepseek_v3(cls) -> "MoEConfig":
        return cls(hidden_size=7168, n_routed_experts=256, num_experts_per_tok=8,
                   moe_intermediate_size=2048, n_shared_experts=1, n_group=8, topk_group=4,
                   norm_topk_prob=True, routed_scaling_factor=2.5)
