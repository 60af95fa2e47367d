#!/usr/bin/env python
"""The reports of recipes/Snakefile's studies, from the models' files (each under
OUT/models/NAME/seedS: trained.json, averaged.pt, label.txt, test.txt, score.txt).

    # the score lines of every model, one file, each under its row's name
    python recipes/posenc_workflow/report.py results --models DIR... --out OUT/results.txt
    # per bin of source length: SacreBLEU, chrF, length ratio over seeds, each row against the baseline
    python recipes/posenc_workflow/report.py length --study STUDY.json --models DIR... --out OUT/bleu_by_length
    # the demo's tables (parameters, training time, learned biases) and its length report and plots
    python recipes/posenc_workflow/report.py demo --study STUDY.json --models DIR... --out OUT

A row (results.txt's ``enc=``, the length report's rows) is named by its models' label (label.txt,
read from the averaged checkpoint by ``python -m fairseq_posenc.labels``; every seed of a row must
have the same one) and the options in which its training differs from the other rows', read from
averaged.pt's stored configuration (recipes/posenc_workflow/row_names.py): ``sinusoidal`` and
``sinusoidal (--encoder-layers 3)``.
"""
import argparse
import json
import logging
import os
import sys
from collections import OrderedDict
from typing import Dict, List

logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from posenc_workflow import length_report  # noqa: E402
from posenc_workflow.decoding_limit import decoding_limit_note, read_decoding_limit  # noqa: E402
from posenc_workflow.generation import parse_generate_output  # noqa: E402
from posenc_workflow.length_bins import write_text_atomically  # noqa: E402

CONTROL = "vanilla_continued"
MAX_POSITIONS = 1024
MAX_LEN_A, MAX_LEN_B = 1.5, 50


class ReportError(ValueError):
    pass


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _generation(path: str):
    """fairseq-generate's output in ``path``; refused where a source sentence id repeats."""
    return parse_generate_output(_read(path), path)


def rows_of(model_dirs: List[str]) -> "OrderedDict[str, List[str]]":
    """row name -> its model directories (seeds in the order given)."""
    rows: "OrderedDict[str, List[str]]" = OrderedDict()
    for path in model_dirs:
        rows.setdefault(os.path.basename(os.path.dirname(os.path.normpath(path))), []).append(path)
    return rows


def labelled(model_dirs: List[str]) -> "OrderedDict[str, List[str]]":
    """row name -> the row's model directories: each row under its models' one label and the
    options of its training in which it differs from the other rows (recipes/posenc_workflow/row_names.py,
    from the first seed's averaged.pt), rows trained from a start or a teacher compared with each
    other, the rest with each other (a warm start's lower lr and a student's size are their kind's)."""
    from posenc_workflow import row_names

    rows = rows_of(model_dirs)
    labels, groups, options = {}, OrderedDict(), {}
    for name, dirs in rows.items():
        found = {d: _read(os.path.join(d, "label.txt")).strip() for d in dirs}
        if len(set(found.values())) != 1:
            raise ReportError(f"row {name}: its seeds' models have different labels ("
                              + ", ".join(f"{os.path.basename(d)}: {label}" for d, label in found.items()) + ")")
        labels[name] = next(iter(found.values()))
        keyed = json.loads(_read(os.path.join(dirs[0], "trained.json"))).get("keyed", {})
        groups.setdefault(tuple(k for k in ("start", "teacher") if k in keyed), []).append(name)
        options[name] = row_names.training_options(row_names.stored_config(os.path.join(dirs[0], "averaged.pt")))
    named = {}
    for members in groups.values():
        named.update(zip(members, row_names.row_names([labels[m] for m in members], [options[m] for m in members])))
    out: "OrderedDict[str, List[str]]" = OrderedDict()
    names = {}
    for name, dirs in rows.items():
        label = named[name]
        if label in out:
            raise ReportError(f"rows {names[label]} and {name} trained the same model, {label!r}")
        names[label] = name
        out[label] = dirs
    return out


def row_name_of(model_dirs: List[str]) -> Dict[str, str]:
    """model directory -> its row's name in the length report (:func:`labelled`), each test set's
    decodes (OUT/WHERE/NAME/seedS, WHERE: models or tests/TEST) named among themselves."""
    sets: "OrderedDict[str, List[str]]" = OrderedDict()
    for path in model_dirs:
        sets.setdefault(os.path.dirname(os.path.dirname(os.path.normpath(path))), []).append(path)
    return {d: name for dirs in sets.values() for name, row in labelled(dirs).items() for d in row}


def cmd_results(args):
    """Every score line, its ``enc=LABEL`` (scoring.py's --label, from label.txt) replaced by the
    row's name: two rows of one label (sinusoidal and sinusoidal:--encoder-layers=1) are told apart."""
    names = row_name_of(args.models)
    out = []
    for d in args.models:
        label = _read(os.path.join(d, "label.txt")).strip()
        for line in _read(os.path.join(d, "score.txt")).splitlines():
            out.append(line.replace(f" | enc={label} ", f" | enc={names[d]} ", 1))
    lines = "".join(line + "\n" for line in out)
    write_text_atomically(args.out, lines)
    print(lines, end="")


def _baseline(study: dict, rows: Dict[str, List[str]], names: Dict[str, str]) -> str:
    asked = study["models"].get("baseline") or ("sinusoidal" if "sinusoidal" in names.values() else None)
    for label, dirs in rows.items():
        if asked in (label, names[label]):
            return label
    return next(iter(rows))


def _names(rows: Dict[str, List[str]]) -> Dict[str, str]:
    """label -> the row's name (its directory), for --baseline given as a row."""
    return {label: os.path.basename(os.path.dirname(os.path.normpath(dirs[0]))) for label, dirs in rows.items()}


def _spec_names(study: dict) -> Dict[str, str]:
    """row slug -> its spec, as models.encodings gives it."""
    import re

    out = {}
    for spec in study["models"]["encodings"]:
        encoding, _, rest = spec.partition(":")
        out[encoding + ("-" + re.sub(r"[^A-Za-z0-9.]+", "-", rest).strip("-.") if rest else "")] = spec
    return out


def _controls(rows: Dict[str, List[str]]) -> Dict[str, str]:
    if CONTROL not in rows:
        return {}
    return {label: CONTROL for label, dirs in rows.items()
            if label != CONTROL and os.path.basename(os.path.dirname(os.path.normpath(dirs[0]))).startswith(("floater", "rnn"))}


def _study_rows(args):
    """(the study's configuration, label -> model directories, label -> the row's spec)."""
    study = json.loads(_read(args.study))
    rows = labelled(args.models)
    spec = _spec_names(study)
    return study, rows, {label: spec.get(name, name) for label, name in _names(rows).items()}


def cmd_length(args):
    from posenc_workflow.segments import decoded_segmentation, length_bins

    # every generation read first: a file that would lose sentences is refused before anything else
    generations = {d: _generation(os.path.join(d, "test.detok.txt")) for d in args.models}
    study, rows, names = _study_rows(args)
    runs = {label: [generations[d] for d in dirs] for label, dirs in rows.items()}
    texts = [_read(os.path.join(d, "test.log")) for dirs in rows.values() for d in dirs]
    limits = {limit for limit in map(read_decoding_limit, texts) if limit is not None}
    longest = max(len(s.split()) for gens in runs.values() for g in gens for s in g.sources) + 1
    footer = " ".join(decoding_limit_note(a, b, longest) for a, b in sorted(limits))
    bins, unit = length_bins(study) or (None, "words")
    segmented = decoded_segmentation(study)
    if unit == "words" and segmented != "none":
        # decoded in a split's subwords (S- lines too): report.bins count the words they make
        from posenc_workflow.scoring import remove_bpe

        for gens in runs.values():
            for gen in gens:
                gen.sources = [remove_bpe(source, segmented) for source in gen.sources]
    report = length_report.build_report(runs, bins, unit, _baseline(study, rows, names),
                                        seeds=study["models"]["seeds"], footer=footer, controls=_controls(rows))
    title = (study.get("report") or {}).get("title") or study["out"]
    paths = length_report.write_report(report, args.out, title)
    print(_read(paths["markdown"]))


# ------------------------------------------------------------------------------------------------
# the demo
def parameters(checkpoint: str) -> int:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    # tied embeddings appear under three names; FLOATER's stored solution, ALiBi's encoder form
    # and the stacks' longest training input are buffers, and --position-bias-scale is kept as
    # extra state: not parameters
    buffers = ("version", "_float_tensor", ".solution", ".fingerprint", ".encoder_form", "._extra_state",
               ".longest_trained", ".pending_gradient", ".pending_updates")
    seen, total = set(), 0
    for name, tensor in state.items():
        if name.endswith(buffers) or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel()
    return total


def summary_table(rows, note="") -> str:
    lines = ["| encoding | parameters | training (s) |", "|---|---|---|"]
    for row in rows:
        seconds = row["train_seconds"]
        lines.append(f"| {row['encoding']} | {row['parameters']:,} | {sum(seconds) / len(seconds):.0f} |")
    return "\n".join(lines) + f"\n\nParameters and training time (mean over seeds).{note}\n"


def mean_bias(reports):
    """bias_bound.checkpoint_bias_report of each seed -> the means over seeds, and the seeds' own."""
    def mean(values):
        return None if None in values else sum(values) / len(values)

    names = reports[0]["trained"]
    return {"position_bias_scale": reports[0]["position_bias_scale"], "updates": mean([r["updates"] for r in reports]),
            "lr_sum": mean([r["lr_sum"] for r in reports]),
            **{key: {name: mean([r[key][name] for r in reports]) for name in names}
               for key in ("trained", "initial", "bound")},
            "seeds": reports}


def bias_table(rows) -> str:
    """The largest learned logit bias of each encoding that has one, next to what Adam allows."""
    rows = [row for row in rows if row.get("bias")]
    if not rows:
        return ""
    lines = ["", "| encoding | bias | largest trained | initial | reach: initial + S x sum(lr) |",
             "|---|---|---|---|---|"]
    for row in rows:
        bias = row["bias"]
        for name, trained in bias["trained"].items():
            bound = bias["bound"][name]
            lines.append(f"| {row['encoding']} | {name} | {trained:.3f} | {bias['initial'][name]:.3f} | "
                         + ("- (a product)" if bound is None else f"{bound:.3f}") + " |")
    sums = sorted({(row["bias"]["position_bias_scale"], row["bias"]["lr_sum"], row["bias"]["updates"]) for row in rows})
    products = [row["encoding"] for row in rows if None in row["bias"]["bound"].values()]
    return "\n".join(lines) + (
        "\n\nLargest |bias| each learned bias adds to the attention logits (mean over seeds). Adam moves a "
        "parameter by about lr per update, so a learned scalar ends within about S x sum(lr) of where it began "
        "(its reach; at most 1.70 times that with the demo's Adam betas (0.9, 0.98), where gradients grow as "
        "fast as Adam's averages allow: fairseq_posenc/bias_bound.py): "
        + "; ".join(f"S = {s:g}, sum(lr) = {total:.3f} over the {n:g} updates of the newest checkpoint averaged"
                    for s, total, n in sums) + "."
        + (f" {', '.join(products)}: a product of parameters, which that does not bound." if products else "")
        + "\n")


def plot_positions(rows: Dict[str, List[str]], seed_index: int, out: str, length: int) -> list:
    """positions_NAME.png: what each row's encoding looks like in the first seed's best checkpoint,
    over the test set's source lengths (scripts/plot_positions.py)."""
    import importlib.util

    # a script of the checkout, not a module of an installed package: loaded from its file
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                        "plot_positions.py")
    spec = importlib.util.spec_from_file_location("plot_positions", path)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)

    figures = []
    for label, dirs in rows.items():
        directory = dirs[seed_index]
        name = os.path.basename(os.path.dirname(os.path.normpath(directory)))
        checkpoint = os.path.join(directory, "checkpoints", "checkpoint_best.pt")
        figure = os.path.join(out, f"positions_{name}.png")
        try:
            model, _ = plot.load_model(checkpoint)
            plot.plot(plot.position_arrays(model, length), figure,
                      f"{label}: {os.path.basename(directory)}'s checkpoint_best.pt, positions 0-{length - 1}")
        except Exception as e:  # the study is done: a figure that fails must not lose it
            print(f"| {os.path.basename(figure)} not written: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        figures.append(figure)
    return figures


def demo_note(study: dict, rows_specs: List[str]) -> str:
    corpus, train, warm = study["corpus"], study["train"], study.get("warm_start") or {}
    toy = corpus["toy"]
    note = f" Toy pair {toy['pair']}; training sources had 3-{toy['train_max_len']} words."
    note += (f" {train['max_update']} updates of {train['max_tokens']} tokens, peak lr {float(train['lr']):g}, size "
             f"{study['models']['arch']}, seeds {' '.join(map(str, study['models']['seeds']))};"
             f" {train['threads']} thread(s) a model.")
    encodings = list(dict.fromkeys(spec.partition(":")[0] for spec in rows_specs))
    for encoding in encodings:
        extra = (train.get("encoding_flags") or {}).get(encoding)
        if extra:
            note += f" {encoding}: {' '.join(map(str, extra))}."
    if warm.get("enabled"):
        n = warm["second"]["max_update"]
        note += (f" warm start {n}: floater and {CONTROL} trained {n} more updates at lr "
                 f"{float(train['lr']) * warm['lr_scale']:g} from sinusoidal's best checkpoint of each seed "
                 f"({train['max_update'] + n} in all); training time is that stage's.")
    return note


def cmd_demo(args):
    from fairseq_posenc import bias_bound

    study, rows, specs = _study_rows(args)
    names = _names(rows)
    runs, table = {}, []
    for label, dirs in rows.items():
        gens, seconds, biases, params = [], [], [], None
        for d in dirs:
            gens.append(_generation(os.path.join(d, "test.txt")))
            seconds.append(json.loads(_read(os.path.join(d, "trained.json")))["train_seconds"])
            averaged = os.path.join(d, "averaged.pt")
            params = parameters(averaged)
            bias = bias_bound.checkpoint_bias_report(averaged)
            if bias:
                biases.append(bias)
        runs[label] = gens
        row = {"encoding": label, "spec": specs[label], "slug": names[label], "parameters": params,
               "train_seconds": seconds}
        if biases:
            row["bias"] = mean_bias(biases)
        table.append(row)
    seeds = study["models"]["seeds"]
    toy = study["corpus"]["toy"]
    bins = study["report"].get("bins") or [3] + list(range(toy["train_max_len"] + 1, toy["long_max_len"] + 1, 6))
    longest = max(len(s.split()) for gens in runs.values() for s in gens[0].sources)
    footer = decoding_limit_note(MAX_LEN_A, MAX_LEN_B, longest + 1, MAX_POSITIONS,
                                 what="the demo's fairseq-generate")
    baseline = _baseline(study, rows, specs)
    report = length_report.build_report(runs, bins, "words", baseline, seeds=seeds, footer=footer,
                                        controls=_controls(rows))
    scale = study["train"].get("position_bias_scale")
    paths = length_report.write_report(
        report, os.path.join(args.out, "bleu_by_length"),
        title=f"Trained on sources of at most {toy['train_max_len']} words"
        + (f", {len(seeds)} seeds" if len(seeds) > 1 else "")
        + (f", --position-bias-scale {scale:g}" if scale not in (None, 1, 1.0) else ""))
    note = demo_note(study, study["models"]["encodings"])
    note += "".join(f" {label}: {specs[label]}." for label in rows if ":" in specs[label])
    summary = summary_table(table, note) + bias_table(table) + "\n" + length_report.markdown(report)
    write_text_atomically(os.path.join(args.out, "results.md"), summary)
    write_text_atomically(os.path.join(args.out, "results.json"), json.dumps(
        {"unit": "words", "edges": bins, "seeds": seeds, "max_update": study["train"]["max_update"],
         "size": study["models"]["arch"], "max_tokens": study["train"]["max_tokens"], "lr": study["train"]["lr"],
         "toy_pair": toy["pair"], "position_bias_scale": scale,
         "warm_start": (study.get("warm_start") or {}).get("second", {}).get("max_update")
         if (study.get("warm_start") or {}).get("enabled") else 0,
         "rows": table, "report": report}, indent=2) + "\n")
    figures = plot_positions(rows, 0, args.out, longest + 1)
    print("\n" + summary)
    print(f"| wrote {args.out}/results.md, results.json, "
          + ", ".join(os.path.basename(p) for p in list(paths.values()) + figures))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("results", help="the score lines of every model")
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_results)
    for name, fn in (("length", cmd_length), ("demo", cmd_demo)):
        p = sub.add_parser(name)
        p.add_argument("--study", required=True, help="the study's configuration (JSON)")
        p.add_argument("--models", nargs="+", required=True, help="model directories, row by row, seeds in order")
        p.add_argument("--out", required=True)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    try:
        args.fn(args)
    except (ReportError, OSError, ValueError) as e:
        parser.exit(2, f"report.py {args.command}: error: {e}\n")


if __name__ == "__main__":
    main()
