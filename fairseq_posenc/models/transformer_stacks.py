"""Encoder and decoder stacks: fairseq's, with the plugin's layers and position encoding.

Each stack owns its :class:`~fairseq_posenc.positions.PositionEncoding` and hands it to every
attention layer, so that tables shared by the layers are built once per forward in one place.

Each stack also records the longest input it was trained on (``longest_trained``, real tokens,
end-of-sentence included), for plots of its positions (scripts/plot_positions.py) to mark. It is
an int64 buffer, so it is saved in the checkpoint, survives --restore-file and is left alone by
model.half(); 0 means unknown (never trained, or a checkpoint from before it) and is not saved,
so an untrained model's state dict stays fairseq's transformer's key for key. Under several
workers each keeps its own and the checkpoint holds worker 0's.
"""
import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..compat import PosencError
from ..modules import PosencDecoderLayer, PosencEncoderLayer, PositionalAttention
from ..positions import get_position_encoding, kept
from ..positions.segments import SegmentBias


def _wrap_layer(layer, cfg):
    # As fairseq's build_*_layer: activation checkpointing, then FSDP wrapping.
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def _head_dim(cfg, layers_cfg):
    head_dim = getattr(cfg, "attention_head_dim", None)
    return layers_cfg.embed_dim // layers_cfg.attention_heads if head_dim is None else head_dim


def _build_position_encoding(cfg, side, layers_cfg):
    scheme = get_position_encoding(cfg.position_encoding)
    return scheme(cfg, side, layers_cfg.layers, layers_cfg.attention_heads, _head_dim(cfg, layers_cfg))


def _check_table_sizes(stack, state_dict, name: str):
    """A table-bound encoding cannot be loaded with more positions than it was trained with
    (``--model-overrides`` raising --max-*-positions, as the extrapolating ones allow): one line
    instead of torch's size-mismatch traceback."""
    scheme = stack.position_encoding
    if scheme.extrapolates:
        return
    own = {f"{name}.{key}": tensor for key, tensor in stack.state_dict().items()
           if key.startswith(("embed_positions.", "position_encoding."))}
    for key, tensor in own.items():
        stored = state_dict.get(key)
        if stored is not None and stored.shape != tensor.shape:
            raise PosencError(
                f"{key} holds {tuple(stored.shape)} where this model has {tuple(tensor.shape)}: "
                f"{type(scheme).__name__} cannot extrapolate, its table ends at the {scheme.length_flag} it "
                f"was trained with; do not raise that with --model-overrides")


def _refuse_earlier_forms(stack, state_dict, name: str):
    """The settings a position encoding saves beside its weights (buffers, extra states) must be there
    in the form this code saves them; of a kept result (FLOATER's solution, which grows) the number of
    dimensions and whether it is floating point. A checkpoint of an earlier form of the plugin is
    refused in one line, not loaded through branches that guess what it held."""
    with kept.not_saving():
        own = stack.state_dict()
    parameters, results = {n for n, _ in stack.named_parameters()}, kept.kept_result_keys(stack)

    def form(key, tensor):
        tensor = torch.as_tensor(tensor)
        return (tensor.dim(), tensor.is_floating_point()) if key in results else tensor.shape

    for key, tensor in own.items():
        if not key.startswith(("position_encoding.", "segment_bias.")) or key in parameters:
            continue
        stored = state_dict.get(f"{name}.{key}")
        if stored is None and key in results:  # kept results are saved when there are some
            continue
        if stored is None or form(key, stored) != form(key, tensor):
            held = "has no" if stored is None else f"holds {tuple(torch.as_tensor(stored).shape)} for"
            raise PosencError(f"the checkpoint {held} {name}.{key}: it was saved by an earlier version of "
                              "fairseq_posenc, whose checkpoints this one does not load; train the model again")


class LongestTrained:
    """Mixin for a stack: ``longest_trained``, updated by :meth:`_record_length` while training."""

    KEY = "longest_trained"

    def _init_longest_trained(self):
        self.register_buffer(self.KEY, torch.zeros((), dtype=torch.long))
        self.register_state_dict_post_hook(LongestTrained._drop_unknown)

    @staticmethod
    def _drop_unknown(module, state_dict, prefix, local_metadata):
        if int(state_dict.get(prefix + LongestTrained.KEY, 1)) == 0:
            del state_dict[prefix + LongestTrained.KEY]

    def _record_length(self, tokens):
        if self.training:
            longest = tokens.ne(self.padding_idx).sum(-1).max()
            # in place and on the device: no host sync per forward
            torch.maximum(self.longest_trained, longest, out=self.longest_trained)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # fairseq loads strictly: checkpoints from before the record, fairseq's own transformer,
        # and untrained models (which do not save it) load as unknown
        state_dict.setdefault(prefix + self.KEY, torch.zeros((), dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _attach(layers, terms, cross_terms=()):
    for idx, layer in enumerate(layers):
        for module in layer.modules():
            if isinstance(module, PositionalAttention):
                module.attach(terms if module.self_attention else cross_terms, idx)


class PosencTransformerEncoder(LongestTrained, TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.position_encoding = _build_position_encoding(cfg, "encoder", cfg.encoder)
        self.position_encoding.padding_idx = self.padding_idx  # where it reads the sentences' lengths
        terms = [self.position_encoding]
        if getattr(cfg, "segment_attention", False):
            separator = dictionary.index(cfg.segment_separator)
            if separator == dictionary.unk():
                raise PosencError(
                    f"--segment-separator {cfg.segment_separator!r} is not in the source dictionary; "
                    "it must be a token of the preprocessed data"
                )
            self.segment_bias = SegmentBias(
                cfg, cfg.encoder.layers, cfg.encoder.attention_heads, _head_dim(cfg, cfg.encoder), separator
            )
            terms.append(self.segment_bias)
        self.position_terms = tuple(terms)
        _attach(self.layers, self.position_terms)
        self._init_longest_trained()

    def upgrade_state_dict_named(self, state_dict, name):
        _check_table_sizes(self, state_dict, name)
        _refuse_earlier_forms(self, state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(PosencEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        self._record_length(src_tokens)
        for term in self.position_terms:
            term.begin_forward(src_tokens)
        return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class PosencTransformerDecoder(LongestTrained, TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.position_encoding = _build_position_encoding(cfg, "decoder", cfg.decoder)
        self.position_encoding.padding_idx = self.padding_idx
        _attach(self.layers, (self.position_encoding,), (self.position_encoding,))
        self._init_longest_trained()

    def upgrade_state_dict_named(self, state_dict, name):
        _check_table_sizes(self, state_dict, name)
        _refuse_earlier_forms(self, state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(PosencDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features(self, prev_output_tokens, encoder_out, incremental_state=None, **kwargs):
        # a non-empty incremental state: a later step of one decode (fairseq's generator starts
        # each batch with an empty one)
        self._record_length(prev_output_tokens)
        self.position_encoding.begin_forward(prev_output_tokens, continues=bool(incremental_state))
        return super().extract_features(prev_output_tokens, encoder_out, incremental_state, **kwargs)
