#!/usr/bin/env python
"""The length-generalisation report for one or more models, each decoded once per training seed:
per bin of source length SacreBLEU, chrF, the length ratio hyp/ref and the sentences, as mean ±
std over seeds, with a 95% interval of each model's BLEU difference from a baseline; a Markdown
table, JSON, and a two-panel plot (BLEU, length ratio).

    python scripts/bleu_by_length.py --generation sinusoidal=gen.sin.s1.txt,gen.sin.s2.txt \\
        t5=gen.t5.s1.txt,gen.t5.s2.txt none=gen.none.s1.txt,gen.none.s2.txt --baseline sinusoidal \\
        --out results/length [--bins 80 100 120 140] [--unit subwords] [--decoding-log gen.sin.s1.log ...]

--checkpoint MODEL=CHECKPOINT names a model's rows by the label of its trained model, read from the
checkpoint (fairseq_posenc/labels.py: ``alibi (split)``, ``t5 (bias scale 10)``), not from how it
was meant to be trained, and each option of its stored configuration in which it differs from the
other checkpoints' models (recipes/posenc_workflow/row_names.py: ``sinusoidal (--encoder-layers 3)``).

Each generation file is the output of ``fairseq-generate`` (its S-, T- and H- lines), one per seed
(comma-separated, the same seeds in the same order for every model); the bins are over the source
as it prints it (pass --remove-bpe to fairseq-generate to count words). A seed decoded on several
test sets gives their files joined by ``+`` (``sin=test1.s1.txt+test2.s1.txt,...``): read apart and
reported as one set, every sentence kept. A file in which a source sentence's id repeats (two
outputs concatenated, each counting from 0) is refused: one of the two sentences would be lost. Give a model trained with
``--position-encoding none`` too: it is the floor that tells what any position information buys.

The interval (recipes/posenc_workflow/significance.py) is the paired bootstrap over test sentences; with
two or more seeds per model the difference is that of the mean BLEU over seeds and its interval
also covers the spread between seeds (Welch's t on the per-seed BLEU). With one seed it cannot,
and the report marks each of its stars with a dagger that says so: two seeds of one model can
differ by more than the test set's noise.

The report's footer says whether fairseq-generate's --max-len-a/-b allowed 1.5x + 10 target
tokens at every source length up to the longest: it reads them from the config line of
fairseq-generate's log (its stderr; the demo's generation files hold it), given with
--decoding-log or found in the generation files themselves.
"""
import argparse
import logging

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
from posenc_workflow import length_report  # noqa: E402
from posenc_workflow.decoding_limit import decoding_limit_note, read_decoding_limit  # noqa: E402
from posenc_workflow.generation import join, parse_generate_output  # noqa: E402
from posenc_workflow.length_bins import DEFAULT_EDGES, read_lines  # noqa: E402
from posenc_workflow.significance import N_BOOTSTRAP  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generation", nargs="+", required=True, metavar="MODEL=FILE[+FILE...][,FILE...]",
                        help="fairseq-generate output of each model, named; one per seed, comma-separated; a "
                             "seed's several test sets joined by +")
    parser.add_argument("--baseline", help="model the others are compared with (default: sinusoidal if given, "
                                           "else the first)")
    parser.add_argument("--control", nargs="+", default=[], metavar="MODEL=CONTROL",
                        help="also compare MODEL with CONTROL, the model trained with MODEL's schedule from the same "
                             "start without what MODEL adds (FLOATER and its vanilla-continued control)")
    parser.add_argument("--checkpoint", nargs="+", default=[], metavar="MODEL=CHECKPOINT",
                        help="name MODEL's rows by the label of its trained model, read from the checkpoint's state "
                             "(fairseq_posenc/labels.py: alibi (split), t5 (bias scale 10)); --baseline and "
                             "--control may still name it MODEL")
    parser.add_argument("--out", required=True, help="output prefix: writes PREFIX.md, PREFIX.json, PREFIX.png")
    parser.add_argument("--bins", type=int, nargs="+", default=list(DEFAULT_EDGES),
                        help="left edges of the bins; the last is open-ended")
    parser.add_argument("--unit", default="words", help="what the source's space-separated tokens are")
    parser.add_argument("--title", default="", help="plot title")
    parser.add_argument("--bootstrap-samples", type=int, default=N_BOOTSTRAP,
                        help="paired bootstrap resamples of the test sentences (the test-set part of the interval)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="the training seed of each generation file, in order, for the report (default: 1 2 ...)")
    parser.add_argument("--decoding-log", nargs="+", default=[],
                        help="fairseq-generate logs (stderr) to read --max-len-a/-b from, for the footer's check")
    parser.add_argument("--decoded-source", help="the source file the model decoded (segmented), to count the "
                                                 "longest source in the model's tokens (default: the S- lines)")
    args = parser.parse_args(argv)
    if args.bootstrap_samples < 40:
        parser.error(f"--bootstrap-samples must be at least 40 for a 95% interval, got {args.bootstrap_samples}")

    def fail(message):
        parser.exit(2, f"bleu_by_length.py: error: {message}\n")

    controls = {}
    for item in args.control:
        model, sep, control = item.partition("=")
        if not sep or not model or not control:
            parser.error(f"--control takes MODEL=CONTROL, got {item!r}")
        controls[model] = control
    runs, texts = {}, []
    for item in args.generation:
        name, sep, paths = item.rpartition("=")  # a label may hold "=" (rnn(rnn-layers=2)), a path not
        if not sep or not name or not paths or "" in paths.replace("+", ",").split(","):
            parser.error(f"--generation takes MODEL=FILE[,FILE...], got {item!r}")
        if name in runs:
            parser.error(f"--generation names {name} twice")
        runs[name] = []
        for seed_paths in paths.split(","):
            parts = []
            for path in seed_paths.split("+"):
                try:
                    text = "\n".join(read_lines(path))
                    generation = parse_generate_output(text, path)
                except (OSError, ValueError) as e:
                    fail(e)
                if not generation.hypotheses:
                    fail(f"{path} has no H- lines: is it fairseq-generate output?")
                parts.append(generation)
                texts.append(text)
            runs[name].append(join(parts))
    counts = {name: len(gens) for name, gens in runs.items()}
    if len(set(counts.values())) > 1:
        fail("every model needs one generation per seed, the same number: got "
             + ", ".join(f"{name} {n}" for name, n in counts.items()))
    n_seeds = next(iter(counts.values()))
    renamed, options = {}, {}
    for item in args.checkpoint:
        model, sep, path = item.partition("=")
        if not sep or model not in runs or not path:
            parser.error(f"--checkpoint takes MODEL=CHECKPOINT with MODEL one of --generation's, got {item!r}")
        from posenc_workflow import row_names
        from fairseq_posenc.labels import checkpoint_label

        try:
            renamed[model] = checkpoint_label(path)
            options[model] = row_names.training_options(row_names.stored_config(path))
        except Exception as e:  # noqa: BLE001  (fairseq's load raises many kinds)
            fail(f"--checkpoint {item}: {type(e).__name__}: {e}")
    if renamed:
        # the label and each option of its training in which a model differs from the others named
        renamed = dict(zip(renamed, row_names.row_names(list(renamed.values()), list(options.values()))))
        labels = [renamed.get(name, name) for name in runs]
        if len(set(labels)) < len(labels):
            fail("two models have the same label: " + ", ".join(f"{n} = {renamed.get(n, n)}" for n in runs))
        runs = {renamed.get(name, name): gens for name, gens in runs.items()}
        controls = {renamed.get(m, m): renamed.get(c, c) for m, c in controls.items()}
        if args.baseline:
            args.baseline = renamed.get(args.baseline, args.baseline)
    if args.seeds is not None and len(args.seeds) != n_seeds:
        fail(f"--seeds names {len(args.seeds)} seeds but each model has {n_seeds} generation files")
    try:
        for path in args.decoding_log:
            texts.append("\n".join(read_lines(path)))
        sources = read_lines(args.decoded_source) if args.decoded_source else runs[next(iter(runs))][0].sources
        footer = decoding_footer(texts, sources)
        report = length_report.build_report(runs, args.bins, args.unit, args.baseline, args.bootstrap_samples,
                                            seeds=args.seeds or list(range(1, n_seeds + 1)), footer=footer,
                                            controls=controls)
    except (OSError, ValueError) as e:
        fail(e)
    paths = length_report.write_report(report, args.out, args.title)
    print(open(paths["markdown"]).read())
    print("| wrote " + ", ".join(paths.values()))


def decoding_footer(texts, sources) -> str:
    limits = {limit for limit in map(read_decoding_limit, texts) if limit is not None}
    if not limits:
        return ("Decoding limit: not checked (no fairseq-generate config line found; pass its log with "
                "--decoding-log).")
    # +1: fairseq counts the end-of-sentence token in the source length
    longest = max(len(s.split()) for s in sources) + 1
    # one note per distinct limit, when the runs used several
    return " ".join(decoding_limit_note(a, b, longest) for a, b in sorted(limits))


if __name__ == "__main__":
    main()
