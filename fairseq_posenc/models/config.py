"""The plugin's model flags, in one place: the general ones here, each encoding's own from its
``config`` dataclass (fairseq's Transformer flags come from fairseq)."""
import dataclasses
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
    keep_input_positions: bool = field(
        default=False,
        metadata={
            "help": "also add fairseq's sinusoidal input embedding to an encoding that lives "
            "inside attention (by default such encodings drop it)"
        },
    )
    attention_head_dim: Optional[int] = field(
        default=None,
        metadata={
            "help": "size of each attention head, independent of embed dim / heads "
            "(Bhojanapalli et al., 2020); logits scaled by 1/sqrt(N). Default: embed dim / heads"
        },
    )
    segment_attention: bool = field(
        default=False,
        metadata={"help": "DIET segment attention in the encoder: a learned scalar per "
                  "(query segment, key segment) pair per head, on top of the position encoding"},
    )
    segment_separator: str = field(
        default="<sep>", metadata={"help": "source token that ends a segment (--segment-attention)"}
    )
    max_segments: int = field(
        default=8, metadata={"help": "segments with their own parameters; later ones share the last"}
    )


def _scheme_fields():
    """The fields of every encoding's config, each name once (schemes may share a flag)."""
    seen = {}
    for scheme in POSITION_ENCODINGS.values():
        for f in dataclasses.fields(scheme.config) if scheme.config else ():
            seen.setdefault(f.name, f)
    return [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in seen.values()]


PositionFlags = dataclasses.make_dataclass("PositionFlags", _scheme_fields(), bases=(FairseqDataclass,))
ALL_CONFIGS = (PosencConfig, PositionFlags)


def set_defaults(args):
    """Architecture-style defaults (``args.x = getattr(args, "x", default)``) for every flag."""
    for config in ALL_CONFIGS:
        for f in dataclasses.fields(config):
            if not f.name.startswith("_"):
                setattr(args, f.name, getattr(args, f.name, f.default))
