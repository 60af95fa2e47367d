"""Small in-memory models and batches for the tests: no data on disk, no downloads."""
import os

import torch
from fairseq.data import Dictionary

import fairseq_posenc  # noqa: F401  (registers the plugin)
from fairseq_posenc.models import from_flags

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]


class ToyTask:
    def __init__(self, vocab_size=30):
        self.source_dictionary = self.target_dictionary = toy_dictionary(vocab_size)


def toy_dictionary(vocab_size=30):
    d = Dictionary()
    for i in range(vocab_size):
        d.add_symbol(f"w{i}")
    return d


def model_args(arch, *flags, max_positions=64):
    return from_flags.model_args(arch, [*TINY, *flags], max_positions)


def build_model(arch, *flags, seed=1, task=None, max_positions=64, from_checkpoint=False):
    return from_flags.build_from_flags(arch, [*TINY, *flags], task or ToyTask(), max_positions, seed, from_checkpoint)


def toy_batch(dictionary, lengths, tgt_len=7, seed=0, left_pad_source=True):
    """Source (left-padded, as fairseq's translation task) and target-side inputs."""
    g = torch.Generator().manual_seed(seed)
    bsz, src_len = len(lengths), max(lengths)
    low, high = dictionary.nspecial, len(dictionary)
    src = torch.full((bsz, src_len), dictionary.pad())
    for b, n in enumerate(lengths):
        tokens = torch.randint(low, high, (n,), generator=g)
        tokens[-1] = dictionary.eos()
        if left_pad_source:
            src[b, src_len - n:] = tokens
        else:
            src[b, :n] = tokens
    prev = torch.randint(low, high, (bsz, tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    return src, torch.tensor(lengths), prev


def with_strong_positions(model, std=0.5):
    """Scale up the position parameters so that the tests see their effect (their
    initialisation is deliberately small), then put the model in eval mode."""
    g = torch.Generator().manual_seed(7)
    for stack in (model.encoder, model.decoder):
        for module in stack.position_encoding.modules():
            # a linear layer (FLOATER's dynamics) keeps unit gain, or its ODE would blow up
            scale = std / module.in_features**0.5 if isinstance(module, torch.nn.Linear) else std
            # a parameter the scheme keeps positive (KERPLE's r1, r2: clamped) is drawn as a magnitude,
            # one in units of many positions (FIRE's L = 512 m) in positions
            positive = getattr(module, "positive_parameters", ())
            units = getattr(module, "parameter_units", {})
            for name, p in module.named_parameters(recurse=False):
                draw = torch.randn(p.shape, generator=g) * scale / units.get(name, 1)
                p.data.copy_(draw.abs() if name in positive else draw)
    return model.eval()


def incremental_log_probs(model, src, lengths, prev):
    """Decode ``prev`` step by step with fairseq's incremental state: (B, T, V) log-probs."""
    encoder_out = model.encoder(src, lengths)
    state = {}
    steps = []
    for t in range(prev.size(1)):
        out, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
        steps.append(model.get_normalized_probs((out, None), log_probs=True))
    return torch.cat(steps, dim=1)


def full_log_probs(model, src, lengths, prev):
    return model.get_normalized_probs(model(src, lengths, prev), log_probs=True)


def model_that_saved(checkpoint, data_bin):
    """(the model of a fairseq-train checkpoint, in eval mode, and its dictionary)."""
    from fairseq_posenc.models.transformer_posenc import PosencTransformerModel

    state = torch.load(checkpoint, map_location="cpu")
    dictionary = Dictionary.load(os.path.join(data_bin, "dict.src.txt"))

    class Task:
        source_dictionary = target_dictionary = dictionary

    model = PosencTransformerModel.build_model(state["cfg"]["model"], Task())
    model.load_state_dict(state["model"], strict=True)
    return model.eval(), dictionary
