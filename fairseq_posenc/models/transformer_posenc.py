"""``transformer_posenc``: fairseq's Transformer with a choice of position encoding.

With ``--position-encoding sinusoidal`` (the default) it has the same parameters, initialised
in the same order, as fairseq's ``transformer``: it is the baseline every encoding is compared
with. Architectures below only set defaults, in fairseq's style.
"""
import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from ..positions import POSITION_ENCODINGS, get_position_encoding
from ..compat import PosencError
from .checkpoint_settings import check_pending, check_warm_start, log_allowed
from .config import (ALL_CONFIGS, mark_positions_removed_given, refuse_misplaced_blocks, refuse_unused_flags,
                     set_defaults)
from .transformer_stacks import PosencTransformerDecoder, PosencTransformerEncoder


@register_model("transformer_posenc")
class PosencTransformerModel(TransformerModel):
    #: the dataclasses of the options it adds to fairseq's (fairseq_posenc/options.py)
    configs = ALL_CONFIGS

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        mark_positions_removed_given(parser)
        for config in cls.configs:
            gen_parser_from_dataclass(parser, config(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        posenc_base_architecture(args)
        scheme = get_position_encoding(args.position_encoding)
        # The scheme decides fairseq's input position embedding; fairseq's own flags for it
        # would contradict the one choice flag (--no-token-positional-embeddings: refused by
        # set_defaults when the flags are parsed).
        learned = scheme.input_embedding == "learned"
        if (args.encoder_learned_pos or args.decoder_learned_pos) and not learned:
            raise PosencError(
                "use --position-encoding learned instead of --encoder-learned-pos/--decoder-learned-pos"
            )
        args.encoder_learned_pos = args.decoder_learned_pos = learned
        if scheme.input_embedding is None and not args.keep_input_positions:
            args.no_token_positional_embeddings = True
        model = super().build_model(args, task)
        refuse_misplaced_blocks(args)
        check_warm_start(model, args)
        scheme.finish_model(model, args)
        # after the build, so that the schemes' own refusals (--position-blocks, rnn's ODE flags)
        # speak first; a tiny model builds in milliseconds, and no update has run
        refuse_unused_flags(args)
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        # a checkpoint announced by a loader is refused before its weights are read where its position
        # settings differ from this model's (checkpoint_settings)
        checked = check_pending(self, state_dict)
        loaded = super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        if checked is not None:
            log_allowed(*checked)
        return loaded

    def prepare_for_inference_(self, cfg):
        # fairseq-generate halves a model for --fp16 but never casts it for --bf16: without this
        # a --bf16 decode would run in float32
        common = getattr(cfg, "common", None)
        if getattr(common, "bf16", False) and not getattr(common, "fp16", False):
            self.to(torch.bfloat16)
        super().prepare_for_inference_(cfg)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return PosencTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return PosencTransformerDecoder(
            TransformerConfig.from_namespace(args),
            tgt_dict,
            embed_tokens,
            no_encoder_attn=args.no_cross_attention,
        )


@register_model_architecture("transformer_posenc", "transformer_posenc")
def posenc_base_architecture(args):
    set_defaults(args, base_architecture)


@register_model_architecture("transformer_posenc", "transformer_posenc_wmt_en_de")
def transformer_posenc_wmt_en_de(args):
    posenc_base_architecture(args)


@register_model_architecture("transformer_posenc", "transformer_posenc_wmt_en_de_big")
def transformer_posenc_wmt_en_de_big(args):
    set_defaults(args, transformer_vaswani_wmt_en_de_big)


# fairseq's transformer_iwslt_de_en (d 512, ffn 1024, 4 heads, 6 + 6 layers): the size of
# fairseq's IWSLT'14 German-English example and of recipes/iwslt14_de_en
@register_model_architecture("transformer_posenc", "transformer_posenc_iwslt_de_en")
def transformer_posenc_iwslt_de_en(args):
    set_defaults(args, transformer_iwslt_de_en)


def _with_encoding(name, architecture):
    def arch(args):
        args.position_encoding = getattr(args, "position_encoding", name)
        architecture(args)

    return arch


# transformer_E_wmt_en_de, transformer_E_wmt_en_de_big and transformer_E_iwslt_de_en for every
# registered encoding E
for _name in POSITION_ENCODINGS:
    register_model_architecture("transformer_posenc", f"transformer_{_name}_wmt_en_de")(
        _with_encoding(_name, transformer_posenc_wmt_en_de)
    )
    register_model_architecture("transformer_posenc", f"transformer_{_name}_wmt_en_de_big")(
        _with_encoding(_name, transformer_posenc_wmt_en_de_big)
    )
    register_model_architecture("transformer_posenc", f"transformer_{_name}_iwslt_de_en")(
        _with_encoding(_name, transformer_posenc_iwslt_de_en)
    )
