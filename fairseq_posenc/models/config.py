"""The plugin's own model flags, in one place (fairseq's Transformer flags come from fairseq)."""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..positions import POSITION_ENCODINGS

PositionEncodingChoice = ChoiceEnum(list(POSITION_ENCODINGS))


@dataclass
class PosencConfig(FairseqDataclass):
    position_encoding: PositionEncodingChoice = field(
        default="sinusoidal",
        metadata={"help": "how the model knows where its tokens are"},
    )
    attention_head_dim: Optional[int] = field(
        default=None,
        metadata={
            "help": "size of each attention head, independent of embed dim / heads "
            "(Bhojanapalli et al., 2020); logits scaled by 1/sqrt(N). Default: embed dim / heads"
        },
    )
