from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from .base import PositionEncoding, at_least_float32, gather_square
from .bias_scale import INIT_STD, BiasScaleConfig, ScaledBiases, bias_scale
from .sharing import SharingConfig, resolve_sharing
from .values import Values


@dataclass
class DietAbsConfig(SharingConfig, BiasScaleConfig):
    diet_rank: Optional[int] = field(
        default=None, metadata={"values": Values(low=1),
                                "help": "diet_abs: rank k of P_Q P_K^T per head (DIET-ABS-Rank-k); default head dim"}
    )


class DietAbs(ScaledBiases, PositionEncoding):
    """DIET-ABS (Chen et al., 2021): a learned low-rank bias P_Q P_K^T over absolute positions,
    added to each head's logits. Its tables end at --max-source/target-positions.

    ``--position-bias-scale`` S scales each factor: P_Q = S * p_q and P_K = S * p_k, each stored
    at its initialisation / S, so P_Q P_K^T at step 0 is unchanged. Adam moves p_q and p_k by
    about lr per step whatever S is (it normalises their gradients, which S also multiplies), so
    each factor moves S times as far, and so does the product's first-order change
    dP_Q P_K^T + P_Q dP_K^T; its second-order part dP_Q dP_K^T grows S^2 times, small while a step
    is small against the factors. Scaling the product by S instead (S * p_q p_k^T, i.e. sqrt(S)
    on each factor) would make it learn only sqrt(S) times faster. Unlike the scalar biases,
    P_Q P_K^T is a product, not a table of parameters: no entry of it is bounded by S * sum(lr)
    (:mod:`fairseq_posenc.bias_bound`)."""

    config = DietAbsConfig
    scaled_parameters = ("p_q", "p_k")
    keeps_tables = True
    extrapolates = False
    #: its bias is a product of parameters, which S * sum(lr) does not bound (bias_bound.py)
    bias_is_product = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        self.sharing, groups, heads = resolve_sharing(self.option("position_sharing"), num_layers, num_heads)
        self.rank = self.option("diet_rank")
        self.bias_scale = bias_scale(cfg)
        # (groups, positions, heads, rank)
        self.p_q = nn.Parameter(torch.empty(groups, self.max_positions, heads, self.rank))
        self.p_k = nn.Parameter(torch.empty(groups, self.max_positions, heads, self.rank))
        nn.init.normal_(self.p_q, std=self.rank**-0.5 / self.bias_scale)
        nn.init.normal_(self.p_k, std=INIT_STD / self.bias_scale)

    @classmethod
    def initial_stds(cls, args, head_dim):
        return ((getattr(args, "diet_rank", None) or head_dim) ** -0.5, INIT_STD)

    def published_options(self):
        return {**super().published_options(), "diet_rank": self.head_dim, "position_sharing": "layers"}

    @staticmethod
    def largest_bias(state, scale: float) -> float:
        """The largest |P_Q P_K^T| entry over all groups, heads and positions, from this scheme's
        state dict (keys without the stack's prefix) and its --position-bias-scale."""
        p_q, p_k = state["p_q"].float(), state["p_k"].float()
        # one group at a time: (L, H', r) x (L, H', r) -> (H', L, L)
        return scale * scale * max(torch.einsum("qhr,khr->hqk", q, k).abs().max().item()
                                   for q, k in zip(p_q, p_k))

    def attention_bias(self, layer, q, pos):
        length = pos.k_frame.numel()
        group = 0 if self.sharing == "layers" else layer

        def square(n):
            # (n, H', r) x (n, H', r) -> (H, n, n), a sum of r products: in float32 whatever the
            # model's dtype (the attention casts the bias it adds)
            dtype = at_least_float32(self.p_q.dtype)
            p_q = self.p_q[group, :n].to(dtype) * self.bias_scale
            p_k = self.p_k[group, :n].to(dtype) * self.bias_scale
            table = torch.einsum("qhr,khr->hqk", p_q, p_k)
            return table.expand(self.num_heads, n, n)

        def build():
            return gather_square(self.table(("diet_abs", group), length, square, self.max_positions), pos)

        return self.shared(("diet_abs", group, pos.padded) + pos.key, build)
