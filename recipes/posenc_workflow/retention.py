"""Which checkpoints a training keeps (fairseq-train's --keep-interval-updates and
--keep-last-epochs: evaluate.average's count), kept out of what a model is: lowering the average
reuses the kept checkpoints and retrains nothing; raising it past what a finished training kept is
refused in one line naming the models, since their other checkpoints are gone.

The train rule passes these flags in a param derived from its output (recipes/rules/train.smk):
Snakemake's params trigger leaves such params out, and train_config leaves the fields out of the
checkpoint directory's hash."""
import json
import os
from typing import Dict, List, Optional, Tuple

#: fairseq-train's options of retention, with the number of values each takes
FLAGS = {"--keep-interval-updates": 1, "--keep-last-epochs": 1, "--keep-best-checkpoints": 1,
         "--keep-interval-updates-pattern": 1}
#: the option keeping the checkpoints that evaluate.checkpoints averages
KEEPS = {"update": "--keep-interval-updates", "epoch": "--keep-last-epochs"}


def split(command: List[str]) -> Tuple[List[str], List[str]]:
    """(the command without its retention flags, those flags)."""
    rest, kept, i = [], [], 0
    while i < len(command):
        item = str(command[i])
        if item in FLAGS:
            kept += [item, *map(str, command[i + 1:i + 1 + FLAGS[item]])]
            i += 1 + FLAGS[item]
        else:
            rest.append(command[i])
            i += 1
    return rest, kept


def kept(command: List[str], kind: str) -> Optional[int]:
    """How many checkpoints of ``kind`` (update, epoch) ``command`` keeps; None: every one (fairseq's
    default, -1)."""
    flag, value = KEEPS[kind], None
    for i, item in enumerate(command[:-1]):
        if str(item) == flag:
            value = int(command[i + 1])
    return None if value is None or value < 0 else value


def unservable(study, resolved: Dict[str, Tuple[dict, str]], code_key) -> List[Tuple[str, int, str, str]]:
    """The models whose finished training (trained.json, the same configuration and code: it will
    not train again) kept fewer checkpoints than the study averages: (the setting, its count,
    ``NAME/seedS kept N``, the checkpoint directory) each."""
    kind = study.evaluate["checkpoints"]
    short = []
    for model in study.evaluated():
        path = os.path.join(study.model_dir(model), "trained.json")
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            keyed, command = record["keyed"], record["command"]
        except (OSError, ValueError, KeyError):
            continue
        if keyed.get("config") != resolved[model.key][1] or keyed.get("code") != code_key(model.encoding):
            continue  # it trains again, keeping what this study asks
        have, want = kept(command, kind), study.average(model)
        if have is not None and have < want:
            short.append((FIELD.get(model.kind, "evaluate.average"), want, f"{model.name}/seed{model.seed} kept {have}",
                          record.get("checkpoints", "")))
    return short


#: the setting that counts the checkpoints averaged, by the kind of model (Study.average)
FIELD = {"warm": "warm_start.average", "control": "warm_start.average", "distilled": "distillation.average"}


def refusal(study, short) -> str:
    """One line: what the averaging needs, what was kept, and how to train again."""
    field, want = short[0][:2]
    models = ", ".join(entry[2] for entry in short)
    dirs = " ".join(sorted({entry[3] for entry in short if entry[3]}))
    return (f"{field} {want} ({study.evaluate['checkpoints']} checkpoints): more than the finished trainings kept "
            f"({models}); lower it, or train them again: delete their checkpoint directories ({dirs}) and run again")
