"""recipes/run.sh's arguments: the study files among them (an existing *.yaml or *.yml that is no
option's value, as Snakemake's own parser would take the words), each read as YAML first, so that
a syntax error is one line naming its file and line. Prints the study files' positions among the
arguments (from 0, one line); exits 1 with one line on stderr.
    python run_args.py ARG...
"""
import math
import os
import sys

STUDY = (".yaml", ".yml")


def is_study(word: str) -> bool:
    return word.endswith(STUDY) and os.path.isfile(word)


def _actions():
    from snakemake.cli import get_argument_parser

    return get_argument_parser()._option_string_actions


def takes(word: str, actions) -> tuple:
    """(at least, at most, KEY=VALUE only) words after the option ``word``, as argparse takes them."""
    if word.startswith("--"):
        if "=" in word:
            return 0, 0, False
        action = actions.get(word)
        if action is None:  # argparse's unique prefix (--dry for --dry-run)
            matches = {a for name, a in actions.items() if name.startswith(word)}
            action = matches.pop() if len(matches) == 1 else None
    else:  # -n, -c4, -nc4, -c 4: the first letter taking a value takes the rest of the word, or what follows
        action = None
        for k, letter in enumerate(word[1:], 1):
            action = actions.get("-" + letter)
            if action is None or action.nargs != 0:
                if k + 1 < len(word):
                    return 0, 0, False
                break
    if action is None or action.nargs == 0:
        return 0, 0, False
    low, high = {None: (1, 1), "?": (0, 1), "*": (0, math.inf), "+": (1, math.inf)}.get(
        action.nargs, (action.nargs, action.nargs))
    return low, high, "=" in str(action.metavar or "")


def study_positions(args) -> list:
    options = [i for i, word in enumerate(args) if word.startswith("-") and word != "-"]
    if not options or not any(is_study(word) for word in args[options[0]:]):
        return [i for i, word in enumerate(args) if is_study(word)]  # none after an option: no parser needed
    actions, positions, left, pairs = _actions(), [], 0, False
    for i, word in enumerate(args):
        if word == "--":  # targets only after it
            break
        if word.startswith("-") and word != "-":
            _, left, pairs = takes(word, actions)
        elif left and not (pairs and "=" not in word):  # an option's value (--config's are KEY=VALUE)
            left -= 1
        else:
            left = 0
            if is_study(word):
                positions.append(i)
    return positions


def check(path: str):
    """None, or the one line that says why ``path`` is no study file Snakemake can read."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        return f"{path} line {mark.line + 1}: {e.problem or e.context}"
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        return f"{path}: not YAML ({e})"
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        return f"{path}: {what}, not settings (section: {{field: value}})"
    return None


def main(args) -> int:
    positions = study_positions(args)
    for i in positions:
        problem = check(args[i])
        if problem:
            print(f"run.sh: {problem}", file=sys.stderr)
            return 1
    print(" ".join(map(str, positions)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
