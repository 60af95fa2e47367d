"""A checkpoint is loaded as the model it was trained as: its position settings (every plugin option
the model uses, :data:`~.config.ALL_CONFIGS`: the encoding, its ``config``'s fields, the general
position flags, the segment bias's) against those of the model it is loaded into, on every path that
loads one: fairseq-train going on from ``checkpoint_last.pt`` or ``--restore-file``,
``--finetune-from-model``, and every model rebuilt from a checkpoint (fairseq-generate with
``--model-overrides``, the hub, a distillation teacher: ``load_model_ensemble_and_task``). A
difference is refused in one line naming both, before the weights are loaded, except for the
options of :data:`MAY_CHANGE`, which say where and why they may differ (docs/encodings.md);
such a difference is logged with the label the model runs under. FLOATER's warm start
(``--floater-init-from``) loads a model of another encoding by design: there the general position
settings must match (:func:`refuse_other_general_settings`).

A setting the saved configuration does not hold (a checkpoint of before its flag) is not compared:
its weights decide, as they did; unless its field's ``metadata["before"]`` says what such a
checkpoint was trained with (``--randomized-decoder``: the decoder drew before the flag existed).
"""
import argparse
import dataclasses
import functools
import logging
import os
from typing import Dict, List, Optional

from ..compat import PosencError

logger = logging.getLogger(__name__)

DECODE, RESUME, FINETUNE = "decode", "resume", "finetune"

_LEARNING = "how the model learns, not what it computes; the weights carry it (rescaled on load, or refused by its own check)"
#: options never compared: they are not the model's (its weights carry what matters of them)
NOT_THE_MODEL = {
    "floater_init_from": "the start of a run, not the model (the weights say whether it was warm-started)",
    "floater_solve_every": _LEARNING,
    "floater_lr_scale": _LEARNING,
    "position_bias_scale": _LEARNING,
    "floater_adjoint": "the same gradient in less memory",
}
_SPACING = "the spacing of positions, which a decode may rescale for inputs longer than trained"
#: option -> (the paths on which it may differ from the saved value, why); logged with the label
MAY_CHANGE = {
    "floater_solver": ((DECODE, RESUME, FINETUNE), "how closely the same ODE is solved"),
    "floater_step": ((DECODE, RESUME, FINETUNE), "how closely the same ODE is solved"),
    "rope_theta": ((DECODE,), _SPACING),
    "floater_dt": ((DECODE,), _SPACING),
    "rnn_dt": ((DECODE,), _SPACING),
    "rope_ntk_factor": ((DECODE,), _SPACING),
    "rope_pi_factor": ((DECODE,), _SPACING),
    "rope_yarn_factor": ((DECODE,), _SPACING),
}
#: options a model is never trained with (positions/rope_scaling.py): refused by fairseq-train
#: away from their default, also on a fresh run (MAY_CHANGE refuses them on resume and finetune)
DECODE_ONLY = ("rope_ntk_factor", "rope_pi_factor", "rope_yarn_factor")


def refuse_decode_only(args):
    """One line where a training run's model ``args`` sets a decode-only option."""
    for f in _fields():
        value = getattr(args, f.name, f.default)
        if f.name in DECODE_ONLY and value is not None and value != f.default:
            raise PosencError(f"--{f.name.replace('_', '-')} {_flag(f.name, value).split()[-1]} is applied at decoding "
                              "only: train without it, then give it to fairseq-generate's --model-overrides")

#: id of a checkpoint's weights -> (its file, its saved model configuration, how it is loaded), set
#: by the loaders just before fairseq hands the weights to the model's ``load_state_dict``
_pending: Dict[int, tuple] = {}


def _fields():
    from .config import ALL_CONFIGS

    return [f for config in ALL_CONFIGS for f in dataclasses.fields(config) if not f.name.startswith("_")]


def _flag(name: str, value) -> str:
    from .label import number

    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {number(float(value)) if isinstance(value, float) else value}"


def _published(model, name: str, default):
    """What the model makes of option ``name`` left at None, per stack (Shaw's distance 16, the
    head size embed dim / heads)."""
    values = []
    for stack in (model.encoder, model.decoder):
        if name == "attention_head_dim":
            attention = stack.layers[0].self_attn if len(stack.layers) else None
            values.append(attention.embed_dim // attention.num_heads if attention is not None else None)
        else:
            values.append(stack.position_encoding.published_options().get(name, default))
    return tuple(values)


def _value(args, f, model):
    value = getattr(args, f.name, f.default)
    return _published(model, f.name, f.default) if value is None else (value, value)


def _describe(args, names, fields) -> str:
    """``args``' values of the options ``names``, as flags (those left at None or off omitted)."""
    return " ".join(_flag(f.name, getattr(args, f.name, f.default)) for f in fields
                    if f.name in names and getattr(args, f.name, f.default) is not None
                    and getattr(args, f.name, f.default) is not False
                    and not (f.name in DECODE_ONLY and getattr(args, f.name, f.default) == f.default))


def _own_options(args) -> List[str]:
    """The option names of ``args``'s encoding worth naming beside it: its ``config``'s that the
    model uses (one whose switch is off is not: config.flags_in_use)."""
    from .config import flags_in_use, scheme_flags
    from ..positions import get_position_encoding

    own = scheme_flags(get_position_encoding(args.position_encoding))
    return sorted(own & flags_in_use(args) - set(NOT_THE_MODEL))


def _advice(how: str) -> str:
    if how == DECODE:
        return ("a decode runs the model as trained: drop the position settings from --model-overrides (those a "
                "decode may change: docs/encodings.md)")
    if how == FINETUNE:
        return ("--finetune-from-model trains the same model on: give its flags (FLOATER from a sinusoidal model: "
                "--floater-init-from)")
    return "a run goes on as the model it was trained as: give its flags, or another --save-dir for a new model"


def differences(saved, model, how: str):
    """(refused, allowed): the differences between the saved configuration ``saved`` and the built
    ``model``'s (``model.args``), each (field, saved value, given value)."""
    from .config import flags_in_use

    given = model.args
    fields = _fields()
    encoding = next(f for f in fields if f.name == "position_encoding")
    if getattr(saved, "position_encoding", encoding.default) != given.position_encoding:
        return [(encoding, saved.position_encoding, given.position_encoding)], []
    names = flags_in_use(saved) | flags_in_use(given)
    refused, allowed = [], []
    for f in fields:
        if f.name not in names or f.name in NOT_THE_MODEL or not hasattr(saved, f.name):
            continue
        if _value(saved, f, model) != _value(given, f, model):
            entry = (f, getattr(saved, f.name), getattr(given, f.name, f.default))
            (allowed if how in MAY_CHANGE.get(f.name, ((),))[0] else refused).append(entry)
    return refused, allowed


def refuse_other_settings(saved, model, path: str, how: str):
    """One line (:class:`PosencError`) where the saved configuration ``saved`` of checkpoint ``path``
    differs from the built ``model``'s in a setting that may not change on path ``how``. Returns the
    differences that may (for :func:`log_allowed`, once the weights are loaded)."""
    refused, allowed = differences(saved, model, how)
    what = "this decode gives" if how == DECODE else "this run gives"
    name = f"{path} (--finetune-from-model)" if how == FINETUNE else path
    if refused:
        if refused[0][0].name == "position_encoding":
            saved_text = _describe(saved, {"position_encoding", *_own_options(saved)}, _fields())
            given_text = _describe(model.args, {"position_encoding", *_own_options(model.args)}, _fields())
        else:
            encoding = f"--position-encoding {saved.position_encoding} "
            saved_text = encoding + " ".join(_flag(f.name, _shown(s, f, model)) for f, s, _ in refused)
            given_text = encoding + " ".join(_flag(f.name, _shown(g, f, model)) for f, _, g in refused)
        raise PosencError(f"{name} was trained with {saved_text}; {what} {given_text}: {_advice(how)}")
    return allowed


def _shown(value, f, model):
    return _published(model, f.name, f.default)[0] if value is None else value


def log_allowed(allowed, saved, model, path: str):
    """The differences a path allows, and the label the model runs under, in one log line."""
    if not allowed:
        return
    from .label import model_label

    given = " ".join(_flag(f.name, _shown(g, f, model)) for f, _, g in allowed)
    trained = " ".join(_flag(f.name, _shown(s, f, model)) for f, s, _ in allowed)
    why = "; ".join(sorted({MAY_CHANGE[f.name][1] for f, *_ in allowed}))
    logger.info(f"{path}: runs with {given} (trained with {trained}: {why}); the model is {model_label(model)}")


def check_pending(model, state_dict):
    """Called by the model's ``load_state_dict`` before anything of ``state_dict`` is read: where a
    loader announced these weights (:data:`_pending`), refuse other settings. Returns what to log
    once they are loaded (:func:`log_allowed`'s arguments), or None."""
    pending = _pending.pop(id(state_dict), None)
    if pending is None:
        return None
    path, saved, how = pending
    if not _is_posenc(saved):
        return None
    return refuse_other_settings(saved, model, path, how), saved, model, path


def _is_posenc(args) -> bool:
    """A configuration of one of the plugin's models (by the registered class's package: the model
    module imports this one)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    cls = ARCH_MODEL_REGISTRY.get(getattr(args, "arch", None)) if args is not None else None
    return cls is not None and cls.__module__.startswith(__name__.rsplit(".", 2)[0] + ".")


def saved_model_args(state) -> Optional[argparse.Namespace]:
    """A copy of the model configuration a fairseq checkpoint state was saved with (``cfg.model``,
    a Namespace for the legacy architectures, or ``args`` of older checkpoints), or None. A field it
    lacks that declares ``metadata["before"]`` gets that value: what the checkpoint was trained with."""
    cfg = state.get("cfg")
    args = cfg.get("model") if cfg is not None else None
    args = args if args is not None else state.get("args")
    if not isinstance(args, argparse.Namespace):
        return None
    before = {f.name: f.metadata["before"] for f in _fields() if "before" in f.metadata and not hasattr(args, f.name)}
    return argparse.Namespace(**vars(args), **before)


def _announce(state, path: str, how: str):
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        _pending[id(state["model"])] = (path, saved_model_args(state), how)


def _apply_overrides(state, overrides):
    """``overrides`` on a checkpoint state, as fairseq's ``load_checkpoint_to_cpu`` applies them."""
    from fairseq.dataclass.utils import overwrite_args_by_name

    if state.get("args") is not None:
        for name, value in overrides.items():
            setattr(state["args"], name, value)
    if state.get("cfg") is not None:
        overwrite_args_by_name(state["cfg"], overrides)


def check_loaded_models():
    """Every model rebuilt from a checkpoint (``load_model_ensemble_and_task``: fairseq-generate, the
    hub, a teacher): the state is read without the overrides, its saved configuration kept, then
    overridden as fairseq does, so that the model's ``load_state_dict`` compares the two. A state
    given by the caller (a teacher) is not overridden by fairseq: it is built as saved."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_model_ensemble_and_task
    if getattr(load, "posenc_checks_settings", False):
        return

    @functools.wraps(load)
    def load_checked(filenames, arg_overrides=None, task=None, strict=True, suffix="", num_shards=1, state=None):
        if num_shards != 1 or (state is None and suffix):  # sharded names are fairseq's to find
            return load(filenames, arg_overrides, task, strict, suffix, num_shards, state)
        ensemble, cfg = [], None
        for filename in filenames:
            own = state
            if own is None:
                own = checkpoint_utils.load_checkpoint_to_cpu(filename)
                _announce(own, filename, DECODE)
                if arg_overrides:
                    _apply_overrides(own, arg_overrides)
            else:
                _announce(own, filename, DECODE)
            try:
                models, cfg, task = load([filename], arg_overrides, task, strict, suffix, num_shards, own)
            finally:
                _pending.pop(id(own.get("model")) if isinstance(own, dict) else None, None)
            ensemble += models
        return ensemble, cfg, task

    load_checked.posenc_checks_settings = True
    checkpoint_utils.load_model_ensemble_and_task = load_checked


def check_training_loads():
    """fairseq-train's ``Trainer.load_checkpoint`` (checkpoint_last.pt, --restore-file,
    --finetune-from-model): the state it reads is announced with the run's path and kind, so that the
    model's ``load_state_dict`` compares its saved configuration with the run's. Under several
    workers the rank that reads the checkpoint checks it."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    original = Trainer.load_checkpoint
    if getattr(original, "posenc_checks_settings", False):
        return

    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        # every fairseq-train run asks for its checkpoint before the first update, fresh or not
        refuse_decode_only(getattr(self.cfg, "model", None))
        how = FINETUNE if filename == getattr(self.cfg.checkpoint, "finetune_from_model", None) else RESUME
        read = checkpoint_utils.load_checkpoint_to_cpu
        states = []

        def read_and_announce(path, *a, **k):
            state = read(path, *a, **k)
            _announce(state, filename, how)
            states.append(state)
            return state

        checkpoint_utils.load_checkpoint_to_cpu = read_and_announce
        try:
            return original(self, filename, *args, **kwargs)
        finally:
            checkpoint_utils.load_checkpoint_to_cpu = read
            for state in states:
                _pending.pop(id(state.get("model")), None)

    load_checkpoint.posenc_checks_settings = True
    Trainer.load_checkpoint = load_checkpoint


def install():
    check_loaded_models()
    check_training_loads()


def refuse_other_general_settings(saved, model, path: str, flag: str):
    """For a load that changes the encoding by design (FLOATER's warm start from a sinusoidal model):
    the general position settings and the segment bias's (every option but the encodings' own) must be
    the saved ones."""
    from .config import PosencConfig, flags_in_use
    from ..positions.segments import SegmentBias

    if saved is None or not hasattr(saved, "position_encoding"):  # fairseq's transformer: nothing to compare
        return
    general = {f.name for f in dataclasses.fields(PosencConfig)} - {"position_encoding"}
    segment = {f.name for f in dataclasses.fields(SegmentBias.config)}
    names = (general | segment) & (flags_in_use(saved) | flags_in_use(model.args))
    names -= set(NOT_THE_MODEL)
    for f in _fields():
        if f.name in names and hasattr(saved, f.name) and _value(saved, f, model) != _value(model.args, f, model):
            raise PosencError(
                f"{flag}: {path} was trained with {_flag(f.name, _shown(getattr(saved, f.name), f, model))}; this run "
                f"gives {_flag(f.name, _shown(getattr(model.args, f.name, f.default), f, model))}: the warm start "
                "keeps the vanilla model's other settings, give its flags")


def check_warm_start(model, args):
    """--floater-init-from, before the warm start loads the vanilla model (positions/floater/loading.py,
    which refuses another encoding itself): the general and segment settings must be the saved ones.
    Here, in the models layer, so that FLOATER's loading needs nothing above it."""
    path = getattr(args, "floater_init_from", None)
    if not path or not os.path.isfile(path):
        return
    import torch

    state = torch.load(path, map_location="cpu", mmap=True)
    saved = saved_model_args(state) if isinstance(state, dict) else None
    if saved is not None and getattr(saved, "position_encoding", "sinusoidal") == "sinusoidal":
        refuse_other_general_settings(saved, model, path, "--floater-init-from")
