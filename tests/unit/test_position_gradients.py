"""Every position parameter learns: a non-zero gradient, and a value that moves under Adam.

Being in the autograd graph is not enough (DDP without --find-unused-parameters proves only
that): a parameter whose gradient is always zero, like FLOATER's dynamics after a warm start
that zeroed them all, passes that check and never learns. This one asserts the gradient itself,
for every registered encoding, from its default initialisation and, where the scheme has one,
from its warm start.
"""
import pytest
import torch

from fairseq_posenc.positions import POSITION_ENCODINGS
from helpers.toy import build_model, full_log_probs, toy_batch

STEPS = 3


def _position_parameters(model):
    """The parameters that carry position: the schemes', fairseq's learned input embedding
    (--position-encoding learned) and DIET's segment bias."""
    return {name: p for name, p in model.named_parameters()
            if "position_encoding" in name or "embed_positions" in name or "segment_bias" in name}


def _learn(model):
    """``STEPS`` Adam updates on toy batches of lengths 9-23 (every DIET-REL/Shaw offset up to
    16 occurs); the position parameters' gradients at the last step, and how far each moved."""
    parameters = _position_parameters(model)
    start = {name: p.detach().clone() for name, p in parameters.items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for step in range(STEPS):
        optimizer.zero_grad()
        src, lengths, prev = toy_batch(model.encoder.dictionary, [23, 9, 14], tgt_len=20, seed=step)
        target = torch.roll(prev, -1, dims=1)
        loss = -full_log_probs(model, src, lengths, prev).gather(-1, target[..., None]).mean()
        loss.backward()
        grads = {name: p.grad for name, p in parameters.items()}
        optimizer.step()
    moved = {name: (p.detach() - start[name]).abs().max().item() for name, p in parameters.items()}
    return grads, moved


def _assert_every_parameter_learns(grads, moved, slow=()):
    """``slow``: names ending in one of a scheme's ``slow_parameters`` (a gradient, a move, not Adam's lr)."""
    for name, grad in grads.items():
        assert grad is not None, f"{name} is not in the graph"
        assert grad.abs().max() > 0, f"{name} has an all-zero gradient"
        # Adam's first steps move a parameter by about lr = 1e-3 per step
        least = 0 if any(name.endswith("position_encoding." + s) for s in slow) else 1e-4
        assert moved[name] > least, f"{name} moved by {moved[name]:.1e}"


@pytest.mark.parametrize("encoding", list(POSITION_ENCODINGS))
def test_every_position_parameter_learns_from_the_default_initialisation(encoding):
    model = build_model("transformer_posenc", "--position-encoding", encoding, "--dropout", "0.0")
    grads, moved = _learn(model)
    if encoding not in ("sinusoidal", "none", "alibi", "rope", "xpos"):  # fixed functions of position
        assert grads, f"{encoding} has no position parameters"
    _assert_every_parameter_learns(grads, moved, getattr(POSITION_ENCODINGS[encoding], "slow_parameters", ()))


def test_the_segment_bias_learns_on_multi_segment_input():
    from helpers.toy import ToyTask

    task = ToyTask()
    task.source_dictionary.add_symbol("<sep>")
    model = build_model("transformer_posenc", "--position-encoding", "diet_rel", "--segment-attention",
                        "--dropout", "0.0", task=task)
    original = model.encoder.forward
    sep = task.source_dictionary.index("<sep>")

    def with_separators(src_tokens, *args, **kwargs):  # two segments per sentence
        src_tokens = src_tokens.clone()
        src_tokens[:, -5] = sep
        return original(src_tokens, *args, **kwargs)

    model.encoder.forward = with_separators
    grads, moved = _learn(model)
    assert "encoder.segment_bias.weight" in grads
    _assert_every_parameter_learns(grads, moved)


def test_a_warm_started_floater_learns_every_position_parameter(tmp_path):
    path = tmp_path / "vanilla.pt"
    torch.save({"model": build_model("transformer_posenc", "--dropout", "0.0", seed=5).state_dict()}, path)
    model = build_model("transformer_posenc", "--position-encoding", "floater", "--dropout", "0.0",
                        "--floater-init-from", str(path))
    grads, moved = _learn(model)
    assert {name.rsplit(".", 1)[-1] for name in grads} >= {"initial", "weight", "bias", "time1", "time2"}
    _assert_every_parameter_learns(grads, moved)
