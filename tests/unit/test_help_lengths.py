"""Every option the plugin adds to fairseq-train has a help of at most 200 characters, fairseq's
style: a line or two that says what the option does; why and what it measured belong in the docs.

The options are taken from fairseq's own training parser, extended as fairseq-train extends it for
each model and criterion the plugin registers, less those of the fairseq model and criterion each
one derives from: a new option, of a new encoding or a new criterion, is walked without a list."""
import pytest
from fairseq import options
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_INV_REGISTRY, MODEL_REGISTRY

import fairseq_posenc  # noqa: F401  (registers the plugin's models, criterions and flags)
from helpers.registries import fairseq_base, plugin, registered

MAX_HELP = 200


def _actions(arch, criterion):
    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data-bin", "--arch", arch, "--criterion", criterion], parse_known=True)
    return {action.option_strings[-1]: action for action in parser._actions if action.option_strings}


def _plugin_models():
    return {name: cls for name, cls in MODEL_REGISTRY.items() if plugin(cls)}


def _plugin_criterions():
    return {name: cls for name, cls in CRITERION_REGISTRY.items() if plugin(cls)}


def plugin_options():
    """{flag: help} of every option the plugin adds to fairseq-train's parser."""
    found = {}
    for model, cls in _plugin_models().items():
        for criterion, criterion_cls in _plugin_criterions().items():
            ours = _actions(ARCH_MODEL_INV_REGISTRY[model][0], criterion)
            base_model = fairseq_base(MODEL_REGISTRY, cls)
            theirs = _actions(ARCH_MODEL_INV_REGISTRY[base_model][0], fairseq_base(CRITERION_REGISTRY, criterion_cls))
            found.update({flag: action.help or "" for flag, action in ours.items() if flag not in theirs})
    return found


OPTIONS = plugin_options()


def test_the_walk_finds_the_options_of_each_kind():
    """Options of the general config, of an encoding, of the segment bias and of the criterion: a
    broken walk would check nothing."""
    assert {"--position-encoding", "--floater-lr-scale", "--alibi-encoder", "--segment-attention",
            "--relation-heads"} <= set(OPTIONS)
    assert not {"--encoder-layers", "--label-smoothing", "--lr"} & set(OPTIONS)  # fairseq's own


@pytest.mark.parametrize("flag", sorted(OPTIONS))
def test_help_is_at_most_200_characters(flag):
    text = OPTIONS[flag]
    assert text, f"{flag} has no help"
    assert len(text) <= MAX_HELP, f"{flag}'s help is {len(text)} characters (at most {MAX_HELP}): {text}"
