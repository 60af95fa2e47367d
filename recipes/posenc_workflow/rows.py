"""A study's rows and its models: ``models.encodings``' specs (``ENC`` or
``ENC:--flag=value[,--flag=value...]``) parsed and refused when ENC is not in the position-encoding
registry or a flag would change nothing (each row's model is built, tiny, as fairseq-train builds
it: :func:`preflight_label`); the models trained of them, one per row and seed, with FLOATER's
protocol (the encodings of :data:`WARM_STARTED` start from a sinusoidal model: its own ``vanilla``
stage, or a row of the study) and its control, and the distilled students."""
import argparse
import dataclasses
import os
import re
import tempfile
import threading
from typing import List, Optional

from posenc_workflow.base import CONTROL, VANILLA, WARM_STARTED, ConfigError

# building a model reseeds torch's global generator: one at a time, the state put back
_TORCH_RNG = threading.Lock()


@dataclasses.dataclass
class Row:
    """One row of a study: an encoding and the flags its spec adds, the name its models train under
    (``slug``: a wildcard of the workflow's jobs), and, once built, its model's label."""
    spec: str
    encoding: str
    flags: List[str]
    slug: str
    label: str = ""


def parse_row(spec: str) -> Row:
    """``ENC`` or ``ENC:--flag=value[,--flag=value...]`` (a flag without ``=value`` is a switch)."""
    from fairseq_posenc.positions import POSITION_ENCODINGS  # the plugin's registry: torch, fairseq (seconds)

    encoding, _, rest = str(spec).partition(":")
    if encoding in (CONTROL, VANILLA):
        raise ConfigError(f"models.encodings {spec}: {encoding} is FLOATER's protocol's own model, added by "
                          "warm_start")
    if encoding not in POSITION_ENCODINGS:
        raise ConfigError(f"models.encodings {spec}: {encoding!r} is not a position encoding; choose one of "
                          f"{', '.join(POSITION_ENCODINGS)}, each optionally with :--flag=value[,--flag=value...]")
    flags = []
    if ":" in str(spec):
        for item in rest.split(","):
            name, eq, value = item.partition("=")
            if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name) or (eq and not value):
                raise ConfigError(f"models.encodings {spec}: {item!r} is not --flag=value or --flag")
            flags += [name, value] if eq else [name]
        if not flags:
            raise ConfigError(f"models.encodings {spec}: no flags after ':'")
    slug = encoding + ("-" + re.sub(r"[^A-Za-z0-9.]+", "-", rest).strip("-.") if flags else "")
    return Row(str(spec), encoding, flags, slug, str(spec))


def parse_rows(specs) -> List[Row]:
    rows, slugs = [], {}
    for spec in specs:
        row = parse_row(spec)
        if row.slug in slugs:
            raise ConfigError(f"models.encodings {slugs[row.slug].spec} and {row.spec} are the same row")
        slugs[row.slug] = row
        rows.append(row)
    return rows


def preflight_label(encoding: str, flags: List[str], size: str = "tiny", warm_start: bool = False) -> str:
    """Build the model of ``--position-encoding encoding`` with ``flags`` (no data, no training) as
    fairseq-train will, at the demo's ``size``: a flag that would change nothing is refused here
    (models/config.py), and the row's label is known before any work. ``warm_start``: built
    warm-started as FLOATER's protocol trains it (from an untrained vanilla model of its size),
    which decides its lr scale and its label. The report's labels are read from the trained
    checkpoints (fairseq_posenc/labels.py), never from here."""
    # the plugin imports torch and fairseq (seconds): where a model is built, not with the module
    import torch
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from fairseq_posenc import labels
    from fairseq_posenc.models.from_flags import size_flags

    class Task:
        source_dictionary = target_dictionary = Dictionary()

    for symbol in ("a", "b", "<sep>"):
        Task.source_dictionary.add_symbol(symbol)

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line under the caller's own error, not a second program's
            raise ConfigError(message)

    parser = Parser(argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY["transformer_posenc"].add_args(parser)

    def build(encoding, flags):
        model_args, _ = parser.parse_known_args(["--position-encoding", encoding, *size_flags(size), *flags])
        model_args.arch = "transformer_posenc"
        ARCH_CONFIG_REGISTRY["transformer_posenc"](model_args)
        with _TORCH_RNG:
            state = torch.random.get_rng_state()
            try:
                return ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(model_args, Task())
            finally:
                torch.random.set_rng_state(state)

    if not (warm_start and encoding in WARM_STARTED):
        return labels.model_label(build(encoding, flags))
    with tempfile.TemporaryDirectory() as tmp:
        vanilla = os.path.join(tmp, "vanilla.pt")
        torch.save({"model": build("sinusoidal", []).state_dict()}, vanilla)
        return labels.model_label(build(encoding, [*flags, "--floater-init-from", vanilla]))


@dataclasses.dataclass
class Model:
    name: str  # the row's slug, vanilla, vanilla_continued or distilled-SLUG
    seed: int
    encoding: str
    kind: str  # scratch | vanilla | warm | control | distilled
    flags: List[str] = dataclasses.field(default_factory=list)  # the row's own
    start: Optional[str] = None  # the model (name) whose checkpoint_best.pt it starts from
    teacher: Optional[str] = None  # distilled: the model (name) whose average teaches it

    @property
    def key(self) -> str:
        return f"{self.name}/seed{self.seed}"


def start_name(rows: List[Row], warm: dict) -> str:
    """The model FLOATER's protocol starts from: its own vanilla stage, or a row's (warm_start.start)."""
    start = warm.get("start", VANILLA)
    if start == VANILLA:
        return VANILLA
    return next(r.slug for r in rows if start in (r.spec, r.slug))


def study_models(rows: List[Row], seeds: List[int], warm: dict, distillation: dict) -> List[Model]:
    """Every model of a study, seed by seed: its rows (warm-started where warm_start is enabled),
    FLOATER's vanilla stage and control, then the distilled students of distillation.teacher."""
    enabled = bool(warm.get("enabled"))
    models = []
    for seed in seeds:
        for row in rows:
            if enabled and row.encoding in WARM_STARTED:
                models.append(Model(row.slug, seed, row.encoding, "warm", row.flags, start=start_name(rows, warm)))
            else:
                models.append(Model(row.slug, seed, row.encoding, "scratch", row.flags))
        if enabled and start_name(rows, warm) == VANILLA:
            models.append(Model(VANILLA, seed, "sinusoidal", "vanilla"))
        if enabled and warm.get("control", True):
            models.append(Model(CONTROL, seed, "sinusoidal", "control", start=start_name(rows, warm)))
    if distillation.get("teacher"):
        teacher = next((r.slug for r in rows if distillation["teacher"] in (r.spec, r.slug)), None)
        if teacher is None:
            raise ConfigError(f"distillation.teacher {distillation['teacher']}: not one of models.encodings")
        for seed in seeds:
            for spec in distillation.get("students", ["sinusoidal"]):
                row = parse_row(spec)
                models.append(Model(f"distilled-{row.slug}", seed, row.encoding, "distilled", row.flags,
                                    teacher=teacher))
    return models
