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
"""
import argparse
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


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["check", "done"], help="check: exit 1 if stale; done: write the marker")
    parser.add_argument("--dir", required=True, help="the markers' directory (WORK/.done)")
    parser.add_argument("--name", required=True, help="the step")
    parser.add_argument("--after", default="", help="the step before it (its redoing makes this one stale)")
    parser.add_argument("--settings", nargs="*", default=[], help="KEY=VALUE settings the step's outputs depend on")
    args = parser.parse_args(argv)
    try:
        settings = parse_settings(args.settings)
    except ValueError as e:
        parser.error(str(e))
    if args.command == "done":
        mark_done(args.dir, args.name, args.after, settings)
        return
    reason = stale_reason(args.dir, args.name, args.after, settings)
    if reason:
        print(reason)
        sys.exit(1)


if __name__ == "__main__":
    main()
