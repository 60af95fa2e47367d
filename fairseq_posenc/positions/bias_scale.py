"""``--position-bias-scale``: how fast the learned logit biases learn, as a reparametrisation.

Under Adam a parameter moves by at most about lr per update, so a learned scalar added to the
attention logits (T5's per-bucket bias, DIET-REL's per-offset bias, DIET's segment scalars) can
end a run at most about sum(lr) from its initial value (:mod:`fairseq_posenc.bias_bound`;
docs/encodings.md gives the demo's and the WMT base recipe's). With S = ``--position-bias-scale``
a scheme stores w and uses bias = S * w, w initialised at init / S: the model at step 0 is the
same, and each Adam step moves the bias S times as far. DIET-ABS's P_Q and P_K are scaled each,
which makes the first-order step of P_Q P_K^T S times larger (:class:`.diet_abs.DietAbs` says
why).

Why a reparametrisation and not a per-parameter learning rate: fairseq's
``FairseqOptimizer.set_lr`` writes one lr into every parameter group at each update, and
``--fp16`` flattens all parameters into one tensor; scaling a gradient does nothing under Adam,
which divides it by its own running magnitude.

The parameters keep their names, and S is saved beside them (the module's ``_extra_state``), not
only in the checkpoint's args: weights loaded into a model of another S (``--finetune-from-model``,
``--restore-file`` with a changed flag, ``load_state_dict`` by hand) are rescaled on load so that
the model computes the same biases, where they would otherwise be multiplied by S_new / S_old
(DIET-ABS's product by its square).
"""
import logging
import math
from dataclasses import dataclass, field
from typing import Tuple

import torch

from .float_bounds import position_bias_scale_range, position_bias_scale_stds
from .values import Values

logger = logging.getLogger(__name__)

FLAG = "--position-bias-scale"
#: the standard deviation of a learned logit bias's initialisation, N(0, INIT_STD^2), stored / S
INIT_STD = 0.02


def _range(args):
    return position_bias_scale_range(position_bias_scale_stds(args))


@dataclass
class BiasScaleConfig:
    position_bias_scale: float = field(
        default=1.0,
        metadata={
            "label": "bias scale {}",
            "values": Values(low=lambda args: _range(args)[0], high=lambda args: _range(args)[1],
                             why="S and the initial weights / S in float32's normal range"),
            "help": "t5, diet_rel, diet_abs, --segment-attention: learn the attention-logit biases S times "
            "faster under Adam, as S * w with w starting at init / S (the same model at step 0). Default 1"
        },
    )


def bias_scale(cfg) -> float:
    """``cfg``'s ``--position-bias-scale`` (1.0 where it has none, as in older checkpoints)."""
    scale = getattr(cfg, "position_bias_scale", None)
    scale = 1.0 if scale is None else float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"{FLAG} must be a positive finite number, got {scale}")
    return scale


class ScaledBiases:
    """Mixin for a module that uses ``self.bias_scale`` x the parameters named in
    ``scaled_parameters``: keeps S in the state dict and rescales those parameters when weights
    saved with another S are loaded (see the module doc)."""

    #: names (in the module's state dict) of the parameters used as S x w
    scaled_parameters: Tuple[str, ...] = ()
    bias_scale: float

    @classmethod
    def initial_stds(cls, args, head_dim: int) -> Tuple[float, ...]:
        """The standard deviation of each scaled parameter's initialisation (before / S), for a
        stack of head size ``head_dim``; none for parameters initialised at 0 (the bounds of S,
        :func:`.float_bounds.position_bias_scale_range`)."""
        return (INIT_STD,)

    def carried_options(self) -> dict:
        """S as the loaded weights were trained with it (their ``_extra_state``; a load into a model
        of another S rescales them, and the model computes the same biases, but they learned at the
        stored S), else the S this module was built with."""
        trained = getattr(self, "trained_bias_scale", self.bias_scale)
        return {**super().carried_options(), "position_bias_scale": trained}

    def get_extra_state(self):
        # a float64 tensor, not a buffer: model.half() would round a buffer (and S with it)
        return torch.tensor(self.bias_scale, dtype=torch.float64)

    def set_extra_state(self, state):
        """Nothing: ``_load_from_state_dict`` has already read and applied it."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "_extra_state"
        stored = float(state_dict[key])
        #: what the weights learned with, for :meth:`carried_options` (the label of a report)
        self.trained_bias_scale = stored
        # averaging checkpoints sums S in float64: equal up to its rounding is equal
        if not math.isclose(stored, self.bias_scale, rel_tol=1e-9):
            ratio = stored / self.bias_scale
            for name in self.scaled_parameters:
                if prefix + name in state_dict:
                    state_dict[prefix + name] = state_dict[prefix + name] * ratio
            logger.info(f"{prefix.rstrip('.')}: weights saved with {FLAG} {stored:g} loaded into a model with "
                        f"{FLAG} {self.bias_scale:g}: {', '.join(self.scaled_parameters)} multiplied by "
                        f"{ratio:g}, so the biases are those that were saved")
        state_dict[key] = self.get_extra_state()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def uses_bias_scale(scheme: type) -> bool:
    """Whether a registered position encoding takes ``--position-bias-scale``."""
    return scheme.config is not None and issubclass(scheme.config, BiasScaleConfig)
