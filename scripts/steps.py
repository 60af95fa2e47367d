#!/usr/bin/env python
"""Step markers of the recipes: a step is done when its marker records the settings it ran with
and the run of the step before it; it is stale (redone, and so is every step after it) when a
setting changed, its marker is missing, or the step before it ran again since.

    # exit 0: up to date; exit 1: stale, with one line saying why
    python scripts/steps.py check --dir data/x/.done --name learn_bpe --after tokenize \\
        --settings BPE=subword-nmt BPE_SIZE=40000
    # record that the step finished with these settings (after its outputs are written)
    python scripts/steps.py done --dir data/x/.done --name learn_bpe --after tokenize \\
        --settings BPE=subword-nmt BPE_SIZE=40000

A marker is JSON: {"settings": {...}, "after": STAMP of the previous step, "stamp": this run's}.
The stamp changes every time a step runs, so redoing a step makes every later one stale.
``--input NAME=PATH`` declares a file or directory the step reads: its content fingerprint is a
setting, so another corpus at the same path, or the same corpus re-prepared with other settings,
redoes the step, and the same content at another path does not.

A training stage (one fairseq-train into one --save-dir) is more than done or not done: it can
be resumed. Its record, SAVE_DIR/stage.json, holds the settings it started with, the stamp of
the stage it starts from, its budget (--max-update, --max-epoch) and, once finished, its stamp:

    # prints start | resume | skip | restart and why; exit 2 (one line) when it must refuse
    python scripts/steps.py stage --save-dir runs/x/floater --settings lr=3.5e-4 ... \
        --after-dir runs/x/vanilla --max-update - --max-epoch 10 [--on-change restart] [--act]
    python scripts/steps.py stage-done --save-dir runs/x/floater --max-update - --max-epoch 10
"""
import argparse
import glob
import hashlib
import json
import os
import sys
import uuid
from typing import Dict, List, Optional


def parse_settings(items: List[str]) -> Dict[str, str]:
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a setting is KEY=VALUE, got {item!r}")
        settings[key] = value
    return settings


def read_marker(directory: str, name: str) -> Optional[dict]:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            marker = json.load(f)
        return marker if isinstance(marker, dict) and "stamp" in marker else {}
    except (ValueError, UnicodeDecodeError):
        return {}  # an empty marker of an older recipe: no settings recorded


def stale_reason(directory: str, name: str, after: str, settings: Dict[str, str]) -> Optional[str]:
    """None when the step is up to date, else why it must run."""
    marker = read_marker(directory, name)
    if marker is None:
        return "not done yet"
    if not marker:
        return "its marker records no settings (an older recipe's): redoing it"
    old = marker.get("settings", {})
    changed = [f"{k} {old.get(k, '(unset)')} -> {settings.get(k, '(unset)')}"
               for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if changed:
        return "settings changed: " + ", ".join(changed)
    if after:
        previous = read_marker(directory, after)
        if not previous or previous.get("stamp") != marker.get("after"):
            return f"step {after} ran again since"
    return None


def mark_done(directory: str, name: str, after: str, settings: Dict[str, str]):
    previous = read_marker(directory, after) if after else None
    marker = {"settings": settings, "after": (previous or {}).get("stamp"), "stamp": uuid.uuid4().hex}
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marker, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(directory, name))


# ------------------------------------------------------------------------------------------------
# content fingerprints
WHOLE_FILE_LIMIT = 64 << 20  # larger files: their size and first and last 4 MB
PART = 4 << 20


def _file_digest(path: str, digest) -> None:
    size = os.path.getsize(path)
    digest.update(str(size).encode())
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_LIMIT:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        else:
            digest.update(f.read(PART))
            f.seek(size - PART)
            digest.update(f.read(PART))


TRAINING_DATA = ("dict.*", "train.*", "valid.*")  # what fairseq-train reads of a data-bin


def fingerprint(path: str, patterns=None) -> str:
    """12 hex digits of the content of a file, or of a directory's files (names relative to it),
    those matching ``patterns`` only if given: not the path, not modification times.
    fairseq-preprocess also writes a dated preprocess.log into a data-bin: logs are left out."""
    import fnmatch

    digest = hashlib.sha1()
    if os.path.isdir(path):
        files = sorted(os.path.relpath(f, path) for f in glob.glob(os.path.join(path, "**"), recursive=True)
                       if os.path.isfile(f) and not f.endswith(".log") and "/." not in f[len(path):])
        if patterns:
            files = [f for f in files if any(fnmatch.fnmatch(os.path.basename(f), p) for p in patterns)]
        if not files:
            raise ValueError(f"{path} holds no file to fingerprint")
        for name in files:
            digest.update(name.encode() + b"\0")
            _file_digest(os.path.join(path, name), digest)
    elif os.path.isfile(path):
        _file_digest(path, digest)
    else:
        raise ValueError(f"no file or directory {path} to fingerprint")
    return digest.hexdigest()[:12]


def input_settings(items: List[str]) -> Dict[str, str]:
    """``NAME=PATH`` inputs as settings ``input.NAME=FINGERPRINT``."""
    return {f"input.{name}": fingerprint(path) for name, path in parse_settings(items).items()}


# ------------------------------------------------------------------------------------------------
# training stages
class Refusal(Exception):
    """A stage that must not run as asked: the message is the one line the user sees."""


RECORD = "stage.json"


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def checkpoints(save_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(save_dir, "checkpoint*.pt")))


def progress(save_dir: str):
    """(updates, finished epochs) of SAVE_DIR/checkpoint_last.pt, or None without one."""
    path = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(path):
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_plan import read_progress

    return read_progress(path)


def reached(done, max_update: Optional[int], max_epoch: Optional[int]) -> str:
    """'' when training stopped short of the budget, 'at' when exactly at it (where fairseq stops),
    'past' when beyond it."""
    updates, epochs = done
    if (max_update and updates > max_update) or (max_epoch and epochs > max_epoch):
        return "past"
    if (max_update and updates == max_update) or (max_epoch and epochs == max_epoch):
        return "at"
    return ""


def _budget(max_update, max_epoch) -> Dict[str, Optional[int]]:
    return {"max_update": max_update, "max_epoch": max_epoch}


def stage_decision(save_dir: str, settings: Dict[str, str], after_dir: str, max_update: Optional[int],
                   max_epoch: Optional[int], on_change: str = "refuse", adopt: bool = False):
    """(decision, reason): what a re-run of the stage must do so that what SAVE_DIR holds is the
    stage asked for, and nothing is trained twice:

    - start: nothing trained yet;
    - resume: the same stage, stopped short of its budget (interrupted, or the budget grew);
    - skip: the same stage, at its budget (fairseq-train would train one more update);
    - restart: the stage it starts from ran again since, or (``on_change=restart``) its settings
      changed: its checkpoints are of another model.
    Refused: checkpoints with no record of their settings (trained before records existed), other
    settings under ``on_change=refuse``, a budget below what was trained (the averaged window
    would not be the stage's last)."""
    upstream = None
    if after_dir:
        upstream = _read_json(os.path.join(after_dir, RECORD))
        if not upstream or not upstream.get("finished"):
            raise Refusal(f"{save_dir} starts from {after_dir}, which has not finished")
    if not checkpoints(save_dir):
        return "start", "nothing trained yet"
    record = _read_json(os.path.join(save_dir, RECORD))
    if record is None:
        if not adopt:
            raise Refusal(f"{save_dir} holds checkpoints but no record of the settings they were trained with "
                          f"({RECORD}; trained by an older recipe or by hand): fairseq-train would resume them "
                          "under the settings asked now. Use another OUT, delete them to start over, or set "
                          "ADOPT_RUN=1 to declare that they were trained with these settings")
        record = {"settings": settings, "after": (upstream or {}).get("stamp"), "budget": _budget(max_update, max_epoch)}
    if upstream and record.get("after") != upstream.get("stamp"):
        return "restart", f"{after_dir} was trained again since this stage started from it"
    old = record.get("settings", {})
    changed = [f"{k} {old.get(k, '(unset)')} -> {settings.get(k, '(unset)')}"
               for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if changed:
        why = "settings changed: " + ", ".join(changed)
        if on_change == "restart":
            return "restart", why
        raise Refusal(f"{save_dir} holds checkpoints of a run with other settings ({why}); fairseq-train would "
                      "resume it: use another OUT, or delete its checkpoints to start over")
    done = progress(save_dir)
    if done is None:  # interval checkpoints but no checkpoint_last.pt: interrupted while saving
        return "restart", "no checkpoint_last.pt to resume from"
    where = reached(done, max_update, max_epoch)
    if where == "past":
        raise Refusal(f"{save_dir} was trained to update {done[0]} (epoch {done[1]} finished), past the budget "
                      f"asked now ({_describe(max_update, max_epoch)}): its averaged checkpoints would not be the "
                      "stage's last; use another OUT, or delete its checkpoints to start over")
    if where == "at":
        return "skip", f"finished at update {done[0]} ({_describe(max_update, max_epoch)})"
    return "resume", f"stopped at update {done[0]} of {_describe(max_update, max_epoch)}"


def _describe(max_update, max_epoch) -> str:
    return " / ".join(x for x in (max_update and f"update {max_update}", max_epoch and f"epoch {max_epoch}") if x)


def act(save_dir: str, decision: str, settings: Dict[str, str], after_dir: str, max_update, max_epoch,
        launch: str = ""):
    """Make SAVE_DIR ready for the decision: a restart removes the old checkpoints and averages;
    a start or restart records what the stage starts with. With several nodes only the first
    acts; the record then carries the launch and the decision, which the others wait for
    (``wait_for_decision``) instead of deciding on files the first node is changing."""
    os.makedirs(save_dir, exist_ok=True)
    if decision == "restart":
        for path in checkpoints(save_dir) + glob.glob(os.path.join(save_dir, "averaged*.pt")):
            os.remove(path)
    if decision in ("start", "restart") or not os.path.isfile(os.path.join(save_dir, RECORD)):
        upstream = _read_json(os.path.join(after_dir, RECORD)) if after_dir else None
        _write_json(os.path.join(save_dir, RECORD), {"settings": settings, "after": (upstream or {}).get("stamp"),
                                                     "budget": _budget(max_update, max_epoch), "finished": False})
        if decision == "skip":  # adopted, and finished: a new stamp, so stages started from it restart
            stage_done(save_dir, max_update, max_epoch)
    elif decision == "resume":
        record = _read_json(os.path.join(save_dir, RECORD))
        record.update(budget=_budget(max_update, max_epoch), finished=False)
        _write_json(os.path.join(save_dir, RECORD), record)
    if launch:
        record = _read_json(os.path.join(save_dir, RECORD))
        record.update(launch=launch, decision=decision)
        _write_json(os.path.join(save_dir, RECORD), record)


def wait_for_decision(save_dir: str, launch: str, timeout: float, poll: float = 2.0) -> str:
    """The decision the first node recorded for this launch (see ``act``)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        record = _read_json(os.path.join(save_dir, RECORD)) or {}
        if record.get("launch") == launch and record.get("decision"):
            return record["decision"]
        if time.monotonic() > deadline:
            raise Refusal(f"waited {timeout:.0f} s for the first node to decide on {save_dir} (launch {launch})")
        time.sleep(poll)


def stage_done(save_dir: str, max_update, max_epoch):
    """The stage reached its budget: a new stamp, so that every stage started from an older one
    restarts."""
    record = _read_json(os.path.join(save_dir, RECORD)) or {}
    record.update(budget=_budget(max_update, max_epoch), finished=True, stamp=uuid.uuid4().hex)
    _write_json(os.path.join(save_dir, RECORD), record)


def _optional_int(value: str) -> Optional[int]:
    return None if value in ("", "-") else int(value)


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["check", "done", "fingerprint", "stage", "stage-done"],
                        help="check: exit 1 if stale; done: write the marker; fingerprint PATH...: print content "
                             "fingerprints; stage: what a training stage must do; stage-done: record its end")
    parser.add_argument("paths", nargs="*", help="fingerprint: the files or directories")
    parser.add_argument("--training-data", action="store_true",
                        help="fingerprint: of a data-bin, only what fairseq-train reads (dictionaries, train, valid)")
    parser.add_argument("--dir", help="the markers' directory (WORK/.done)")
    parser.add_argument("--name", help="the step")
    parser.add_argument("--after", default="", help="the step before it (its redoing makes this one stale)")
    parser.add_argument("--settings", nargs="*", default=[], help="KEY=VALUE settings the outputs depend on")
    parser.add_argument("--input", nargs="*", default=[], metavar="NAME=PATH",
                        help="files or directories the step reads: their content fingerprints are settings")
    parser.add_argument("--save-dir", help="stage: the directory fairseq-train writes")
    parser.add_argument("--after-dir", default="", help="stage: the save dir of the stage it starts from")
    parser.add_argument("--max-update", default="-", help="stage: its --max-update ('-' for none)")
    parser.add_argument("--max-epoch", default="-", help="stage: its --max-epoch ('-' for none)")
    parser.add_argument("--on-change", choices=["refuse", "restart"], default="refuse",
                        help="stage: checkpoints trained with other settings are refused (train.sh) or replaced "
                             "(the extrapolation recipe, which owns its models)")
    parser.add_argument("--adopt", action="store_true", help="stage: checkpoints without a record were trained "
                                                             "with these settings (ADOPT_RUN=1)")
    parser.add_argument("--act", action="store_true", help="stage: also prepare SAVE_DIR for the decision "
                                                           "(the first node only)")
    parser.add_argument("--launch", default="", help="stage: an id every node of one launch shares; with --act "
                                                     "it is recorded with the decision")
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="stage: take the decision the first node recorded for --launch, waiting up to SECONDS")
    args = parser.parse_intermixed_args(argv)
    try:
        settings = parse_settings(args.settings)
        settings.update(input_settings(args.input))
        if args.command == "fingerprint":
            for path in args.paths:
                print(fingerprint(path, TRAINING_DATA if args.training_data else None))
            return
        if args.command in ("stage", "stage-done"):
            if not args.save_dir:
                parser.error(f"{args.command} needs --save-dir")
            max_update, max_epoch = _optional_int(args.max_update), _optional_int(args.max_epoch)
            if args.command == "stage-done":
                stage_done(args.save_dir, max_update, max_epoch)
                return
            if args.wait:
                print(f"{wait_for_decision(args.save_dir, args.launch, args.wait)} as the first node decided")
                return
            decision, reason = stage_decision(args.save_dir, settings, args.after_dir, max_update, max_epoch,
                                              args.on_change, args.adopt)
            if args.act:
                act(args.save_dir, decision, settings, args.after_dir, max_update, max_epoch, args.launch)
            print(f"{decision} {reason}")
            return
    except (ValueError, Refusal) as e:
        parser.exit(2, f"steps.py: error: {e}\n")
    if not (args.dir and args.name):
        parser.error(f"{args.command} needs --dir and --name")
    if args.command == "done":
        mark_done(args.dir, args.name, args.after, settings)
        return
    reason = stale_reason(args.dir, args.name, args.after, settings)
    if reason:
        print(reason)
        sys.exit(1)


if __name__ == "__main__":
    main()
