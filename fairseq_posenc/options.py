"""Every option the plugin adds to fairseq's parsers, with what selects it: each plugin model's
``configs`` (its ``add_args``), and each plugin criterion's dataclass less the fields of the fairseq
criterion it extends. A new model or criterion's options are found here without a list: the flag
errors (:func:`..compat.one_line_flag_errors`) and tests/fairseq/test_flag_values.py use it."""
import dataclasses
from typing import Dict, Tuple


def _plugin(cls) -> bool:
    return cls.__module__.startswith(__package__)


def plugin_options() -> Dict[str, Tuple[dataclasses.Field, str]]:
    """{flag: (its dataclass field, what selects it: "--arch transformer_posenc", ...)}."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import MODEL_REGISTRY

    found = {}
    # (selector, configs, the fields fairseq's class it extends adds already)
    selected = [(f"--arch {name}", cls.configs, set()) for name, cls in MODEL_REGISTRY.items() if _plugin(cls)]
    for name, cls in CRITERION_REGISTRY.items():
        config = getattr(cls, "__dataclass", None)
        if _plugin(cls) and config is not None:
            inherited = {f.name for base in config.__mro__[1:] if dataclasses.is_dataclass(base)
                         for f in dataclasses.fields(base)}
            selected.append((f"--criterion {name}", [config], inherited))
    for selector, configs, skip in selected:
        for config in configs:
            for f in dataclasses.fields(config):
                if not f.name.startswith("_") and f.name not in skip:
                    found.setdefault("--" + f.name.replace("_", "-"), (f, selector))
    return found


def plugin_flags() -> Dict[str, str]:
    """{flag: what selects it}."""
    return {flag: selector for flag, (_, selector) in plugin_options().items()}
