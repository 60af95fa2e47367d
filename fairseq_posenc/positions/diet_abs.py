from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from .base import PositionEncoding, at_least_float32, gather_square
from .sharing import SharingConfig, resolve_sharing


@dataclass
class DietAbsConfig(SharingConfig):
    diet_rank: Optional[int] = field(
        default=None, metadata={"help": "diet_abs: rank k of P_Q P_K^T per head (DIET-ABS-Rank-k); default head dim"}
    )


class DietAbs(PositionEncoding):
    """DIET-ABS (Chen et al., 2021): a learned low-rank bias P_Q P_K^T over absolute positions,
    added to each head's logits. Its tables end at --max-source/target-positions."""

    config = DietAbsConfig
    extrapolates = False

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.sharing, groups, heads = resolve_sharing(cfg, "layers", num_layers, num_heads)
        self.rank = cfg.diet_rank or head_dim
        if self.rank <= 0:
            raise ValueError(f"--diet-rank must be positive, got {self.rank}")
        # (groups, positions, heads, rank)
        self.p_q = nn.Parameter(torch.empty(groups, self.max_positions, heads, self.rank))
        self.p_k = nn.Parameter(torch.empty(groups, self.max_positions, heads, self.rank))
        nn.init.normal_(self.p_q, std=self.rank**-0.5)
        nn.init.normal_(self.p_k, std=0.02)

    def attention_bias(self, layer, q, pos):
        length = pos.k_frame.numel()
        group = 0 if self.sharing == "layers" else layer

        def square(n):
            # (n, H', r) x (n, H', r) -> (H, n, n), a sum of r products: in float32 whatever the
            # model's dtype (the attention casts the bias it adds)
            dtype = at_least_float32(self.p_q.dtype)
            table = torch.einsum("qhr,khr->hqk", self.p_q[group, :n].to(dtype), self.p_k[group, :n].to(dtype))
            return table.expand(self.num_heads, n, n)

        def build():
            return gather_square(self.table(("diet_abs", group), length, square, self.max_positions), pos)

        return self.shared(("diet_abs", group, pos.padded) + pos.key, build)
