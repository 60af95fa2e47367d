"""fairseq_posenc/labels.py: a report's row names the published form plainly and every other
form in brackets, read from the model's own state (buffers, extra state)."""
import pytest
import torch

from fairseq_posenc.labels import model_label
from toy import build_model


def label(*flags):
    return model_label(build_model("transformer_posenc", *flags))


@pytest.mark.parametrize("flags, expected", [
    (("--position-encoding", "alibi"), "alibi"),
    (("--position-encoding", "alibi", "--alibi-encoder", "symmetric"), "alibi"),
    (("--position-encoding", "alibi", "--alibi-encoder", "split"), "alibi (split)"),
    (("--position-encoding", "alibi", "--alibi-encoder", "crossed"), "alibi (crossed)"),
    (("--position-encoding", "t5"), "t5"),
    (("--position-encoding", "t5", "--position-bias-scale", "10"), "t5 (bias scale 10)"),
    (("--position-encoding", "diet_rel", "--position-bias-scale", "2.5"), "diet_rel (bias scale 2.5)"),
    (("--position-encoding", "sinusoidal"), "sinusoidal"),
    (("--position-encoding", "rope", "--attention-head-dim", "16"), "rope (head size 16)"),
    (("--position-encoding", "learned", "--position-blocks", "all"), "learned (blocks all)"),
    (("--position-encoding", "sinusoidal", "--position-blocks", "input"), "sinusoidal"),
])
def test_labels_name_what_differs_from_the_published_form(flags, expected):
    assert label(*flags) == expected


@torch.no_grad()
def test_the_label_is_read_from_the_loaded_state_not_the_flags_the_model_was_built_with():
    split = build_model("transformer_posenc", "--position-encoding", "alibi", "--alibi-encoder", "split")
    built_symmetric = build_model("transformer_posenc", "--position-encoding", "alibi", seed=2)
    assert model_label(built_symmetric) == "alibi"
    built_symmetric.load_state_dict(split.state_dict())
    assert model_label(built_symmetric) == "alibi (split)"
    # T5's weights learned with S = 10, loaded into a model built with S = 1: rescaled to compute
    # the same biases, and labelled with the S they learned with
    scaled = build_model("transformer_posenc", "--position-encoding", "t5", "--position-bias-scale", "10")
    plain = build_model("transformer_posenc", "--position-encoding", "t5", seed=2)
    plain.load_state_dict(scaled.state_dict())
    assert model_label(plain) == "t5 (bias scale 10)"


def test_forms_of_the_two_stacks_are_named_once_or_by_side():
    from fairseq_posenc.labels import model_forms

    model = build_model("transformer_posenc", "--position-encoding", "t5", "--position-bias-scale", "10")
    # both stacks learned at S = 10: said once
    assert model.encoder.position_encoding.form() == model.decoder.position_encoding.form() == ["bias scale 10"]
    assert model_forms(model) == ["bias scale 10"]
    model.decoder.position_encoding.trained_bias_scale = 3.0
    assert model_forms(model) == ["encoder bias scale 10", "decoder bias scale 3"]
