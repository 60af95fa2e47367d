"""ALiBi (Press et al., 2022): a fixed linear penalty on the distance between query and key.

Press et al. define ALiBi for causal attention: the decoder's bias is -m_h (i - j) for keys
j <= i, the causal mask hiding the rest. An encoder sees both sides, and the paper says nothing
about it; ``--alibi-encoder`` chooses the form:

- ``symmetric`` (the default): -m_h |i - j| in every head, the published form for
  bidirectional attention (MosaicBERT, JinaBERT-v2, data2vec 2.0, x-transformers). The bias
  depends on the distance only, so the encoder is equivariant to reversing the whole sequence:
  the reversed input is encoded as the reversed encoding, and only tokens that occur at one end
  (the end-of-sentence token) tell a sentence from its mirror image.
- ``split``: even heads (0, 2, ...) see only keys at or before the query (j <= i), odd heads
  (1, 3, ...) only keys at or after it (j >= i), each with -m_h |i - j| on the side it sees;
  the other side is masked (-inf). Every head keeps its slope m_h of the usual sequence, so
  each side gets every other slope, from steep to shallow. With an odd head count the last head
  is even and sees the left: the left side has one head more. One head alone would make the
  encoder causal, so ``split`` needs at least two.
- ``crossed``: every head sees both sides with separate slopes, m_h on the left and
  m_(H-1-h) (the same sequence in reverse head order) on the right: the first heads look far
  right and near left, the last heads the opposite (for H a power of two; for other H the slope
  list of :func:`alibi_slopes` is not monotone and is reversed as it is). With an odd H the
  middle head is symmetric; with one head crossed is symmetric and is refused.

``split`` and ``crossed`` tell left from right, symmetric does not (but by the end token):
``tests/unit/test_sequence_direction.py`` measures it for every encoding. The default is the
published form: a row called "alibi" is the ALiBi the literature means, and reports name the
others (``alibi (split)``, :meth:`ALiBi.form`). docs/encodings.md compares the forms.

ALiBi has no parameters, so nothing in a state dict tells the form by its shape: the encoder's
form is stored in a persistent integer buffer (``encoder_form``, its index in
:data:`ENCODER_FORMS`), and a state dict loads the form it names: that is what the weights were
trained with.
"""
import logging
import math
from dataclasses import dataclass, field
from typing import List

import torch
from torch import Tensor

from ..compat import PosencError
from .base import PositionEncoding, at_least_float32
from .values import Values

logger = logging.getLogger(__name__)

#: the encoder forms; a checkpoint stores the index, so new forms are appended, never inserted
ENCODER_FORMS = ("symmetric", "split", "crossed")
DEFAULT_ENCODER_FORM = "symmetric"


@dataclass
class ALiBiConfig:
    alibi_encoder: str = field(
        default=DEFAULT_ENCODER_FORM,
        metadata={"label": "{}", "values": Values(choices=ENCODER_FORMS, noun="a form"),
                  "help": "alibi: the encoder's bias, one of " + ", ".join(ENCODER_FORMS) + " (symmetric: the published "
                  "-m|i-j|; split and crossed tell left from right: docs/encodings.md). The decoder is causal"},
    )


def alibi_slopes(num_heads: int) -> Tensor:
    """Per-head slopes of ALiBi (Press et al., 2022).

    For ``n`` a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). For other
    head counts, as the authors' code: the slopes of the largest power of two below ``n``, then
    every other slope of twice that power until there are ``n``.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")

    def geometric(n: int) -> List[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes)


def alibi_bias(slopes: Tensor, offsets: Tensor, form: str = "symmetric") -> Tensor:
    """The bias of each head at each offset: ``slopes`` (H,), ``offsets`` (N,) key position minus
    query position (j - i) -> (H, N).

    ``symmetric``: -m_h |j - i|. ``split``: the same on the side head h sees (even h: j <= i,
    odd h: j >= i), -inf on the other. ``crossed``: -m_h (i - j) for j <= i and
    -m_(H-1-h) (j - i) for j > i. The causal decoder uses ``symmetric``: its mask hides j > i.
    """
    distance = offsets.abs().to(slopes.dtype)
    if form == "crossed":
        right = slopes.flip(0)
        return -torch.where(offsets[None, :] > 0, right[:, None], slopes[:, None]) * distance
    bias = -slopes[:, None] * distance
    if form == "split":
        sees_left = torch.arange(slopes.numel(), device=offsets.device) % 2 == 0
        hidden = torch.where(sees_left[:, None], offsets[None, :] > 0, offsets[None, :] < 0)
        bias = bias.masked_fill(hidden, -math.inf)
    elif form != "symmetric":
        raise ValueError(f"--alibi-encoder {form!r} is not a form; choose one of {', '.join(ENCODER_FORMS)}")
    return bias


class ALiBi(PositionEncoding):
    """A fixed linear penalty on distance per head; no parameters. Causal in the decoder, in
    the encoder the form ``--alibi-encoder`` chooses (see the module doc)."""

    config = ALiBiConfig
    keeps_tables = True

    def __init__(self, cfg, side, num_layers, num_heads, head_dim):
        super().__init__(cfg, side, num_layers, num_heads, head_dim)
        # model.half() / .bfloat16() round this buffer; it tells the kept table where the
        # model lives, and the bias is computed from float32 slopes
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)
        self.bias_form = "symmetric"  # the decoder's bias, before its causal mask
        if side == "encoder":
            # before the first update: the model is built before training starts
            self.bias_form = self._check_form(getattr(cfg, "alibi_encoder", DEFAULT_ENCODER_FORM))
            # an integer: averaging checkpoints and model.half() leave it as it is
            self.register_buffer("encoder_form", torch.tensor(ENCODER_FORMS.index(self.bias_form)))

    @property
    def bias_masks_keys(self) -> bool:
        """The split encoder hides one side of every head (-inf); the other forms are finite."""
        return self.bias_form == "split"

    @property
    def tells_left_from_right(self) -> bool:
        """The symmetric bias sees |i - j| only; split and crossed give each side its own slope."""
        return self.bias_form != "symmetric"

    def carried_options(self) -> dict:
        """The encoder's form as the weights carry it (the ``encoder_form`` buffer once loaded), not
        the flag's. The decoder is causal: the flag does not apply, its form is the published one."""
        form = self.bias_form if self.side == "encoder" else DEFAULT_ENCODER_FORM
        return {**super().carried_options(), "alibi_encoder": form}

    def _check_form(self, form: str) -> str:
        if form == "split" and self.num_heads < 2:
            raise PosencError(f"--alibi-encoder split needs at least 2 encoder attention heads, one per side, got "
                             f"{self.num_heads}; one head would see only the left (a causal encoder)")
        if form == "crossed" and self.num_heads < 2:
            raise PosencError("--alibi-encoder crossed with 1 encoder attention head is --alibi-encoder symmetric "
                              "(its one head has the same slope on both sides): use symmetric")
        return form

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "encoder_form"
        if self.side == "encoder" and key in state_dict:  # (a missing one: torch's strict load says so)
            index = int(state_dict[key])
            if not 0 <= index < len(ENCODER_FORMS):
                raise PosencError(f"{key} is {index}, not an --alibi-encoder form this code knows "
                                  f"({', '.join(f'{i}: {f}' for i, f in enumerate(ENCODER_FORMS))})")
            stored = self._check_form(ENCODER_FORMS[index])
            if stored != self.bias_form:
                # the weights were trained with the stored form: they keep it, whatever the flag
                logger.warning(f"{key}: the weights were trained with --alibi-encoder {stored}; they load with it, "
                               f"not with the --alibi-encoder {self.bias_form} this model was built with")
            self.bias_form = stored
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def attention_bias(self, layer, q, pos):
        def per_offset(offsets):
            # in float32: slope x distance grows with the distance, and half precision would
            # round both the slopes that are not powers of two and the product
            slopes = alibi_slopes(self.num_heads).to(offsets.device, at_least_float32(self.slopes.dtype))
            return alibi_bias(slopes, offsets, self.bias_form)

        # the form is in the name: a kept table of one form must not serve another after a load
        return self.relative_bias(("alibi", self.bias_form), pos, per_offset)
