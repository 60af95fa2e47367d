#!/usr/bin/env python
"""Step markers of the recipes: a step is done when its marker records the settings it ran with
and the run of the step before it; it is stale (redone, and so is every step after it) when a
setting changed, its marker is missing, or the step before it ran again since.

    # exit 0: up to date; exit 1: stale, with one line saying why
    python fairseq_posenc/recipe/steps.py check --dir data/x/.done --name learn_bpe --after tokenize \\
        --settings BPE=subword-nmt BPE_SIZE=40000
    # record that the step finished with these settings (after its outputs are written)
    python fairseq_posenc/recipe/steps.py done --dir data/x/.done --name learn_bpe --after tokenize \\
        --settings BPE=subword-nmt BPE_SIZE=40000

A marker is JSON: {"settings": {...}, "after": STAMP of the previous step, "stamp": this run's}.
The stamp changes every time a step runs, so redoing a step makes every later one stale.
``--input NAME=PATH`` declares a file or directory the step reads: its content fingerprint is a
setting, so another corpus at the same path, or the same corpus re-prepared with other settings,
redoes the step, and the same content at another path does not.

A training stage (one fairseq-train into one --save-dir) is more than done or not done: it can
be resumed. fairseq_posenc/recipe/stages.py decides it from its record, SAVE_DIR/stage.json,
which holds the resolved fairseq configuration it started with (fairseq's own parser reads the
argument list after --), the settings fairseq's configuration does not hold, the stamp of the
stage it starts from, and, once finished, its own stamp:

    # prints start | resume | skip | restart and why; exit 2 (one line) when it must refuse
    python fairseq_posenc/recipe/steps.py stage --save-dir runs/x/floater --settings data=FINGERPRINT stage=floater \
        --after-dir runs/x/vanilla [--on-change restart] [--act] -- DATA_BIN --arch ... --save-dir runs/x/floater
    # after fairseq-train: finished (its checkpoints say so, whatever its exit code) or exit 2
    python fairseq_posenc/recipe/steps.py stage-end --save-dir runs/x/floater --exit-code $?

Resolving a configuration imports fairseq (seconds). The resolved configurations are kept in a
cache keyed by everything a resolution reads (train_config.cache_key: the argument list, the
plugin's source, the versions of fairseq and its stack, the GPUs torch sees), so a stage decided
again (a re-run, a pre-flight) or resolved ahead (``resolve -- ARGS ::: ARGS ...``: FLOATER's
stages in one process) costs no import. FAIRSEQ_POSENC_CACHE names its directory (default
~/.cache/fairseq_posenc); empty, nothing is cached.
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
# training stages: decided in fairseq_posenc/recipe/stages.py from the resolved fairseq configuration
def _stages():
    """The two modules alone, not the plugin package (which imports fairseq and registers models):
    ending a stage reads checkpoints only, and fairseq is imported where a configuration is resolved."""
    try:
        from . import stages, train_config
    except ImportError:  # run as a file, as the recipes do: this folder is on sys.path
        import stages
        import train_config

    return stages, train_config


def _programs():
    try:
        from . import programs
    except ImportError:  # run as a file
        import programs

    return programs


def main(argv: Optional[List[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # stage: everything after "--" is fairseq-train's argument list, as the recipe will run it
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["check", "done", "fingerprint", "stage", "stage-end", "stage-key", "resolve"],
                        help="check: exit 1 if stale; done: write the marker; fingerprint PATH...: print content "
                             "fingerprints; stage: what a training stage must do (fairseq-train's arguments after "
                             "--); stage-end: after fairseq-train, whether the stage finished; stage-key: 12 hex "
                             "digits naming the run of fairseq-train's arguments after -- wherever it lies; resolve: "
                             "the configurations of several argument lists after --, separated by :::, into the "
                             "cache in one process (one fairseq import for the stage calls that follow)")
    parser.add_argument("paths", nargs="*", help="fingerprint: the files or directories")
    parser.add_argument("--training-data", action="store_true",
                        help="fingerprint: of a data-bin, only what fairseq-train reads (dictionaries, train, valid)")
    parser.add_argument("--dir", help="the markers' directory (WORK/.done)")
    parser.add_argument("--name", help="the step")
    parser.add_argument("--after", default="", help="the step before it (its redoing makes this one stale)")
    parser.add_argument("--settings", nargs="*", default=[],
                        help="KEY=VALUE settings the outputs depend on (a stage: what fairseq's configuration "
                             "does not hold)")
    parser.add_argument("--program", nargs="*", default=[], metavar="PATH|COMMAND",
                        help="check/done: programs the step runs (a Python file, or a command of the Python "
                             "environment): settings program.NAME keyed by their code (recipe/programs.py)")
    parser.add_argument("--input", nargs="*", default=[], metavar="NAME=PATH",
                        help="files or directories the step reads: their content fingerprints are settings")
    parser.add_argument("--save-dir", help="stage: the directory fairseq-train writes")
    parser.add_argument("--after-dir", default="", help="stage: the save dir of the stage it starts from")
    parser.add_argument("--on-change", choices=["refuse", "restart"], default="refuse",
                        help="stage: checkpoints trained with another configuration are refused (train.sh) or "
                             "replaced (STAGE_ON_CHANGE=restart; the extrapolation recipe, which owns its models)")
    parser.add_argument("--adopt", action="store_true", help="stage: checkpoints without a record were trained "
                                                             "with this configuration (ADOPT_RUN=1)")
    parser.add_argument("--preflight", action="store_true",
                        help="stage: before the stage it starts from (re)trains, check only that its checkpoints "
                             "are of this configuration (exit 2 when they are not)")
    parser.add_argument("--act", action="store_true", help="stage: also prepare SAVE_DIR for the decision "
                                                           "(the first node only)")
    parser.add_argument("--launch", default="", help="stage: an id every node of one launch shares; with --act "
                                                     "it is recorded with the decision")
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="stage: take the decision the first node recorded for --launch, waiting up to SECONDS; "
                             "stage-end --not-first: wait up to SECONDS for the first node's last save")
    parser.add_argument("--exit-code", type=int, default=0, help="stage-end: fairseq-train's exit code")
    parser.add_argument("--split-for", default="", metavar="ENCODING",
                        help="stage-key: first print --flags split into the flags both of FLOATER's stages take and "
                             "ENCODING's own (two lines), then the key of the arguments with the first kind appended")
    parser.add_argument("--flags", default="", help="stage-key --split-for: the model flags (MODEL_FLAGS EXTRA_FLAGS)")
    parser.add_argument("--not-first", action="store_true",
                        help="stage-end: on a node other than the first (it reads the record, writes nothing)")
    args = parser.parse_intermixed_args(argv)
    try:
        settings = parse_settings(args.settings)
        settings.update(input_settings(args.input))
        if args.program:
            settings.update(_programs().program_settings(args.program))
        if args.command == "fingerprint":
            for path in args.paths:
                print(fingerprint(path, TRAINING_DATA if args.training_data else None))
            return
        if args.command in ("stage", "stage-end", "stage-key", "resolve"):
            stages, train_config = _stages()
            if args.command == "resolve":
                lists, current = [], []
                for arg in train_args + [":::"]:
                    if arg == ":::":
                        lists.append(current)
                        current = []
                    else:
                        current.append(arg)
                for one in lists:
                    try:  # one fairseq would refuse: the stage call that follows says why
                        train_config.resolve(one, None, config_cache())
                    except ValueError:
                        pass
                return
            if args.command == "stage-key":
                if args.split_for:  # FLOATER's protocol: its two kinds of model flags first (recipe/flags.py)
                    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
                    from fairseq_posenc.recipe import flags

                    both, own = flags.split(args.split_for, args.flags.split())
                    print(" ".join(both))
                    print(" ".join(own))
                    train_args = train_args + both
                print(train_config.identity(train_config.resolve(train_args, fingerprint, config_cache()),
                                            settings_list(settings)))
                return
            if not args.save_dir:
                parser.error(f"{args.command} needs --save-dir")
            if args.command == "stage-end":
                print(stages.stage_end(args.save_dir, args.exit_code, first=not args.not_first, wait=args.wait))
                return
            if args.wait:
                print(f"{stages.wait_for_decision(args.save_dir, args.launch, args.wait)} as the first node decided")
                return
            if not train_args:
                parser.error("stage needs fairseq-train's arguments after --")
            config = train_config.resolve(train_args, fingerprint, config_cache())
            decision, reason = stages.decide(args.save_dir, settings, config, args.after_dir, args.on_change,
                                             args.adopt, args.preflight)
            if args.act:
                stages.act(args.save_dir, decision, settings, config, args.after_dir, args.launch)
            print(f"{decision} {reason}")
            return
    except ValueError as e:  # stages.Refusal included
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


def config_cache() -> Optional[str]:
    """Where resolved fairseq configurations are kept (train_config.resolve: keyed by everything
    the resolution reads, so never stale): FAIRSEQ_POSENC_CACHE/train-configs, by default under
    XDG_CACHE_HOME or ~/.cache; FAIRSEQ_POSENC_CACHE= (empty) resolves every time."""
    root = os.environ.get("FAIRSEQ_POSENC_CACHE")
    if root is None:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fairseq_posenc")
    return os.path.join(root, "train-configs") if root else None


def settings_list(settings: Dict[str, str]) -> List[str]:
    return [f"{k}={v}" for k, v in sorted(settings.items())]


if __name__ == "__main__":
    main()
