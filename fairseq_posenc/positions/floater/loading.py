"""Loading into FLOATER: weights saved with another ``--floater-lr-scale`` (rescaled on load) and the
warm start from a vanilla Transformer's checkpoint (``--floater-init-from``)."""
import logging
import math
import os

import torch

from ...compat import PosencError
from .schedule import FLOW

logger = logging.getLogger(__name__)

#: the extra state of FLOATER's dynamics: the C its weights (and the initial states) were saved with
SCALE_KEY = "dynamics._extra_state"


def rescale_on_load(ode, state_dict, prefix: str):
    """A load pre-hook of :class:`~.ode.FloaterODE`, for weights saved with a C other than the
    model's. Without ``--floater-lr-scale`` the model takes the stored C, so that a resumed run goes
    on with the C it was trained with (a warm-started run's 1, whatever the default rule says for
    the flags of the resume). A training run that asks for another C is refused, naming both; a
    model rebuilt from a checkpoint with another C (``--model-overrides``) gets the weights rescaled
    so that it computes what was saved (as ``--position-bias-scale`` does). Whether the model is
    rebuilt from a checkpoint is the model's configuration (:data:`~..base.FROM_CHECKPOINT`)."""
    if getattr(ode, "dynamics", None) is None:  # the RNN's subclass has no dynamics
        return
    key, current = prefix + SCALE_KEY, ode.lr_scale
    stored = float(state_dict[key])
    if not math.isclose(stored, current, rel_tol=1e-9):
        if not ode._lr_scale_given:
            logger.info(f"{prefix.rstrip('.')}: the weights were trained with --floater-lr-scale {stored:g}: the "
                        f"model goes on with it (the default for its flags is {current:g})")
            ode.set_lr_scale(stored)
            current = stored
        elif not ode._from_checkpoint:
            raise PosencError(f"--floater-lr-scale {current:g}: the FLOATER weights loaded were trained with "
                              f"--floater-lr-scale {stored:g}; drop the flag to go on with {stored:g}, or start a new "
                              "run for another C")
    # the C the weights were trained with, for the model's label (FloaterPositionEncoding.form)
    ode.dynamics._trained_scale = stored
    # averaging checkpoints sums C in float64: equal up to its rounding is equal
    if not math.isclose(stored, current, rel_tol=1e-9):
        for name in FLOW:
            if prefix + name in state_dict:
                state_dict[prefix + name] = state_dict[prefix + name] * (stored / current)
        logger.info(f"{prefix.rstrip('.')}: weights saved with --floater-lr-scale {stored:g} loaded into a model "
                    f"with {current:g}: h and the initial states multiplied by {stored / current:g}, so that "
                    "they compute what was saved")
    state_dict[key] = torch.tensor(current, dtype=torch.float64)


def _saved_model_flags(state):
    """The model flags a fairseq checkpoint was trained with (``cfg.model``: a Namespace for
    architectures registered the legacy way, as here; ``args`` in older checkpoints), or None."""
    cfg = state.get("cfg")
    model = cfg.get("model") if cfg is not None else None
    return model if model is not None else state.get("args")


def _flag(flags, name, default):
    if flags is None:
        return default
    return flags.get(name, default) if isinstance(flags, dict) else getattr(flags, name, default)


def warm_start(model, path: str):
    """Load a vanilla (sinusoidal) model's parameters into a FLOATER model of the same size and
    start FLOATER at h = 0, zero initial states: the result computes exactly what the vanilla
    model computes (Liu et al.'s warm start), and every parameter of h can learn
    (:meth:`~.ode.FloaterODE.reset_to_vanilla`)."""
    if not os.path.isfile(path):
        raise PosencError(f"--floater-init-from: no checkpoint at {path}")
    state = torch.load(path, map_location="cpu")
    vanilla = state.get("model") if isinstance(state, dict) else None
    if vanilla is None:
        raise PosencError(f"--floater-init-from: {path} is not a fairseq checkpoint (no 'model' entry)")
    # a sinusoidal model at every block (--position-blocks all) has the same parameters, no more:
    # only its saved flags tell that the warm start would drop its Eq. 7 terms
    saved = _saved_model_flags(state)
    encoding, blocks = _flag(saved, "position_encoding", "sinusoidal"), _flag(saved, "position_blocks", None)
    if encoding != "sinusoidal" or blocks not in (None, "input"):
        raise PosencError(f"--floater-init-from: {path} is a --position-encoding {encoding}"
                         f"{' --position-blocks ' + blocks if blocks else ''} model; the warm start needs the vanilla "
                         "Transformer (sinusoidal at the input block) for FLOATER to start as that model exactly")
    ode = model.encoder.position_encoding.ode
    ode_keys = {f"encoder.position_encoding.ode.{k}" for k in ode.state_dict()}
    own = model.state_dict()
    mismatched = [k for k, v in vanilla.items() if k in own and own[k].shape != v.shape]
    missing = sorted(set(own) - set(vanilla) - ode_keys)
    # the stacks' longest_trained is saved only once trained (models/transformer_stacks.py)
    unexpected = sorted(k for k in set(vanilla) - set(own) if not k.endswith(".longest_trained"))
    if mismatched or missing or unexpected:
        details = "; ".join(f"{name}: {', '.join(keys[:3])}" for name, keys in
                            (("different shape", mismatched), ("missing", missing), ("unexpected", unexpected)) if keys)
        raise PosencError(f"--floater-init-from: {path} is not a sinusoidal Transformer of this model's size "
                          f"({details})")
    model.load_state_dict({**own, **vanilla}, strict=True)
    ode.reset_to_vanilla()
