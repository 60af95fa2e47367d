#!/usr/bin/env python
"""The main job: a small length-generalisation study, one model per position encoding, trained
and decoded through fairseq's CLI, on a toy language pair the project generates (or your corpus).

    make demo                                             # every encoding, about 5 minutes on 2 cores
    python scripts/demo.py --encodings sinusoidal t5 --max-update 1500 --out demo_output

The default toy pair (--toy-pair reorder) is made of nouns, some preceded by an adjective; its
translation maps every word to its own target word and moves each adjective after its noun, as
English to French does, so a model must know which words are neighbours (--toy-pair reverse:
the whole sentence is reversed). Models train on sentences of 3-12 words and are tested on
sentences as long (in range) and longer (13-30 words). For each encoding the table gives
parameters, training time and SacreBLEU per source-length bin (beam 4, length penalty 0.6, the
last 3 epoch checkpoints averaged).

With --seeds, each encoding is trained once per seed (``--seeds 3``: seeds 1, 2, 3; or a list,
``--seeds 1 5 9``), and the report gives per bin SacreBLEU, chrF and the length ratio hyp/ref as
mean ± std over seeds, with a paired bootstrap 95% interval of each encoding's BLEU difference
from --baseline (fairseq_posenc/study_report.py): Markdown and JSON, and a two-panel PNG plot.
Beside the report, positions_ENC.png draws what each encoding looks like in the first seed's best
checkpoint (scripts/plot_positions.py).
With --data-bin, the study runs on your own preprocessed corpus instead (its test set binned):
say how it is segmented (--bpe) and what the bins count (--unit); BLEU is on detokenized text.

--encodings takes row specs: ENC, or ENC:--flag=value[,--flag=value...] to train that encoding
with those flags added (``alibi:--alibi-encoder=split``, ``floater:--floater-solve-every=10``),
so that one encoding can be compared under several settings. Each row is reported under the label
of its trained model (fairseq_posenc/labels.py: ``alibi (split)``, ``floater (solve every 10)``),
read from the averaged checkpoint, not from the flags; two rows with the same label are refused.

With --warm-start N, FLOATER trains as its paper does: warm-started from the best checkpoint of
the sinusoidal model of the same seed and trained N more updates at half the lr; beside it the
control, that sinusoidal model trained on from the same checkpoint for the same N updates at the
same lr (fairseq's --finetune-from-model), reported as vanilla_continued. FLOATER's difference
from the control is what FLOATER does; its difference from sinusoidal also holds the N updates.
"""
import argparse
import concurrent.futures
import json
import logging
import os
import re
import shutil
import sys
import threading
import time

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # plot_positions, when imported
from fairseq_posenc import bias_bound, labels, pipeline, study_report, toy_data  # noqa: E402
from fairseq_posenc.length_bins import write_text_atomically  # noqa: E402
from fairseq_posenc.models.from_flags import MODEL_SIZES  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402
from fairseq_posenc.positions.bias_scale import uses_bias_scale  # noqa: E402
from fairseq_posenc.recipe.scoring import remove_bpe  # noqa: E402
from fairseq_posenc.recipe.text import detokenize_line  # noqa: E402

MAX_POSITIONS = 1024
# fairseq-generate stops at a * source length + b target tokens: 1.5x + 50 lets a model that runs
# on show it (FLOATER ran to 1.57x on a real corpus) and is never below recipes' x + 50
MAX_LEN_A, MAX_LEN_B = 1.5, 50

# Per-encoding settings that keep the study within its time budget on 2 CPU cores: FLOATER's
# paper default (rk4 with step dt / 5) costs 5x the solver steps of one step per position.
OVERRIDES = {"floater": ["--floater-step", "0.1"]}
# bias_bound rebuilds each model's initial parameters by reseeding torch's global generator
_TORCH_RNG = threading.Lock()

def toy_corpus(out: str, args) -> str:
    top = max(args.long_max_len, args.train_max_len + 1)
    splits = {
        "train": (args.train_size, 3, args.train_max_len),
        "valid": (200, 3, args.train_max_len),
        "test": (args.test_size, 3, top),
    }
    print(f"| writing the {args.toy_pair} toy corpus to {out}/raw: train {args.train_size} pairs of 3-{args.train_max_len} "
          f"words, test {args.test_size} pairs of 3-{top} words", flush=True)
    prefixes = toy_data.write_toy_corpus(os.path.join(out, "raw"), splits, seed=args.data_seed, pair=args.toy_pair)
    return pipeline.preprocess(prefixes, os.path.join(out, "bin"))


CONTROL = "vanilla_continued"


class Row:
    """One row of the study: an encoding and the flags its spec adds (``ENC`` or
    ``ENC:--flag=value[,--flag=value...]``), the directory name it trains in (``slug``), and the
    label its trained model gets (:func:`fairseq_posenc.labels.model_label`)."""

    def __init__(self, spec: str, encoding: str, flags: list):
        self.spec, self.encoding, self.flags = spec, encoding, flags
        self.slug = encoding + ("-" + re.sub(r"[^A-Za-z0-9.]+", "-", spec.split(":", 1)[1]).strip("-.") if flags else "")
        self.label = spec  # until the model is built (preflight_label) and trained (run_one)

    def __repr__(self):
        return f"Row({self.spec!r})"


def parse_row(spec: str) -> Row:
    """``ENC`` or ``ENC:--flag=value[,--flag=value...]`` (a flag without ``=value`` is a switch)."""
    encoding, _, rest = spec.partition(":")
    if encoding not in POSITION_ENCODINGS and encoding != CONTROL:
        raise ValueError(f"--encodings {spec}: {encoding!r} is not an encoding; choose one of "
                         f"{', '.join(POSITION_ENCODINGS)}, each optionally with :--flag=value[,--flag=value...]")
    if encoding == CONTROL:
        raise ValueError(f"--encodings {spec}: {CONTROL} is --warm-start's control row, added by it")
    flags = []
    if ":" in spec:
        for item in rest.split(","):
            name, eq, value = item.partition("=")
            if not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name) or (eq and not value):
                raise ValueError(f"--encodings {spec}: {item!r} is not --flag=value or --flag")
            flags += [name, value] if eq else [name]
        if not flags:
            raise ValueError(f"--encodings {spec}: no flags after ':'")
    return Row(spec, encoding, flags)


def parse_rows(specs) -> list:
    rows = [parse_row(spec) for spec in specs]
    slugs = {}
    for row in rows:
        if row.slug in slugs:
            raise ValueError(f"--encodings {slugs[row.slug].spec} and {row.spec} are the same row")
        slugs[row.slug] = row
    return rows


def model_flags(encoding: str, args) -> list:
    """The model flags every row of ``encoding`` gets: positions, --position-bias-scale, OVERRIDES."""
    positions = ["--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS)]
    if uses_bias_scale(POSITION_ENCODINGS[encoding]):
        positions += ["--position-bias-scale", repr(args.position_bias_scale)]
    return positions + OVERRIDES.get(encoding, [])


def preflight_label(row: Row, args) -> str:
    """Build the row's model (no data, no training) as fairseq-train will: its flags refused here
    where they would change nothing (models/config.py), and its label known before any work. With
    --warm-start a FLOATER row is built warm-started, as :func:`warm_start_flags` trains it (from a
    vanilla model of its size: here an untrained one), which decides its lr scale and its label."""
    import argparse as argparse_
    import tempfile

    import torch
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq_posenc.models.from_flags import size_flags

    class Task:
        source_dictionary = target_dictionary = Dictionary()

    for symbol in ("a", "b", "<sep>"):
        Task.source_dictionary.add_symbol(symbol)

    class Parser(argparse_.ArgumentParser):
        def error(self, message):  # one line under the demo's own error, not a second program's
            raise ValueError(message)

    parser = Parser(argument_default=argparse_.SUPPRESS)
    ARCH_MODEL_REGISTRY["transformer_posenc"].add_args(parser)

    def build(encoding, flags):
        flags = ["--position-encoding", encoding, *size_flags(args.size), *model_flags(encoding, args), *flags]
        model_args, _ = parser.parse_known_args(flags)  # training flags (--lr ...) are fairseq-train's to check
        model_args.arch = "transformer_posenc"
        ARCH_CONFIG_REGISTRY["transformer_posenc"](model_args)
        with _TORCH_RNG:
            return ARCH_MODEL_REGISTRY["transformer_posenc"].build_model(model_args, Task())

    if not (args.warm_start and row.encoding == "floater"):
        return labels.model_label(build(row.encoding, row.flags))
    with tempfile.TemporaryDirectory() as tmp:
        vanilla = os.path.join(tmp, "vanilla.pt")
        torch.save({"model": build("sinusoidal", []).state_dict()}, vanilla)
        return labels.model_label(build(row.encoding, [*row.flags, "--floater-init-from", vanilla]))


def train_flags(row: Row, seed: int, args) -> list:
    flags = pipeline.toy_train_flags(row.encoding, args.max_update, seed, size=args.size, lr=args.lr,
                                     max_tokens=args.max_tokens)
    return flags + model_flags(row.encoding, args) + row.flags


def parameters(checkpoint: str) -> int:
    import torch

    state = torch.load(checkpoint, map_location="cpu")["model"]
    # tied embeddings appear under three names; FLOATER's stored solution, ALiBi's encoder form
    # and the stacks' longest training input are buffers, and --position-bias-scale is kept as
    # extra state: not parameters
    buffers = ("version", "_float_tensor", ".solution", ".fingerprint", ".encoder_form", "._extra_state",
               ".longest_trained", ".pending_gradient")
    seen, total = set(), 0
    for name, tensor in state.items():
        if name.endswith(buffers) or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel()
    return total


def data_languages(data_bin: str):
    """(source, target) of a fairseq-preprocess directory, from its test set's file names."""
    for name in sorted(os.listdir(data_bin)):
        m = re.match(r"^test\.([^.]+)-([^.]+)\.\1\.bin$", name)
        if m:
            return m.group(1), m.group(2)
    raise FileNotFoundError(f"no test set (test.SRC-TGT.SRC.bin) in {data_bin}: run fairseq-preprocess with --testpref")


def postprocess(generation: pipeline.Generation, args, tgt_lang: str) -> pipeline.Generation:
    """Words for the bins when --unit words, detokenized text for scoring, as the recipes do: BLEU
    on subword tokens is not BLEU. The toy corpus is words already and stays as it is."""
    if not args.data_bin:
        return generation
    seg = args.bpe
    sources = generation.sources if args.unit == "subwords" else [remove_bpe(s, seg) for s in generation.sources]
    return pipeline.Generation([detokenize_line(tgt_lang, remove_bpe(h, seg)) for h in generation.hypotheses],
                               [detokenize_line(tgt_lang, remove_bpe(t, seg)) for t in generation.references],
                               sources, generation.ids)


def warm_start_flags(row: Row, seed: int, out: str, args) -> list:
    """--warm-start: a FLOATER row from the sinusoidal model of ``seed`` (its best checkpoint, as
    the paper) with the row's own flags, or the control, the sinusoidal model trained on; N
    updates at half the lr, each."""
    start = os.path.join(out, "checkpoints", "sinusoidal", f"seed{seed}", "checkpoint_best.pt")
    encoding = "floater" if row.encoding == "floater" else "sinusoidal"
    flags = pipeline.toy_train_flags(encoding, args.warm_start, seed, size=args.size, lr=args.lr / 2,
                                     max_tokens=args.max_tokens)
    if encoding == "floater":
        return flags + ["--floater-init-from", start] + model_flags(encoding, args) + row.flags
    return flags + model_flags(encoding, args) + ["--finetune-from-model", start]


def run_one(n: int, total: int, row: Row, seed: int, data_bin: str, out: str, args, tgt_lang: str):
    """Train, average and decode one model (row, seed); label it from its averaged checkpoint."""
    save_dir = os.path.join(out, "checkpoints", row.slug, f"seed{seed}")
    encoding = row.spec
    warm = args.warm_start and row.encoding in ("floater", CONTROL)
    updates = (f"{args.warm_start} updates from sinusoidal seed {seed}'s best checkpoint at lr {args.lr / 2:g}" if warm
               else f"{args.max_update} updates")
    print(f"| [{n}/{total}] training {encoding} seed {seed} for {updates} (log: {save_dir}/train.log)", flush=True)
    start = time.time()
    pipeline.train(data_bin, save_dir, warm_start_flags(row, seed, out, args) if warm
                   else train_flags(row, seed, args))
    train_seconds = time.time() - start
    averaged = pipeline.average_checkpoints(save_dir, 3, os.path.join(save_dir, "averaged.pt"))
    log = os.path.join(out, "generations", f"{row.slug}.seed{seed}.txt")
    raw = pipeline.generate(data_bin, averaged, subset="test", beam=4, lenpen=0.6, log=log,
                            extra=["--max-len-a", f"{MAX_LEN_A:g}", "--max-len-b", str(MAX_LEN_B)])
    generation = postprocess(raw, args, tgt_lang)
    print(f"| [{n}/{total}] {encoding} seed {seed} trained in {train_seconds:.0f} s, decoded "
          f"{len(generation.hypotheses)} test sentences (output: {log})", flush=True)
    with _TORCH_RNG:
        bias = bias_bound.checkpoint_bias_report(averaged)
        label = CONTROL if row.encoding == CONTROL else labels.checkpoint_label(averaged)
    return {"spec": row.spec, "label": label, "encoding": row.encoding, "seed": seed,
            "parameters": parameters(averaged), "train_seconds": round(train_seconds, 1), "bias": bias}, raw, generation


def parse_seeds(values):
    """``--seeds 3`` is seeds 1, 2, 3; several values are the seeds themselves."""
    seeds = list(range(1, values[0] + 1)) if len(values) == 1 else list(values)
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds takes a count N >= 1 or distinct non-negative seeds, got {values}")
    return seeds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="demo_output", help="working and output directory")
    parser.add_argument("--encodings", nargs="+", default=list(POSITION_ENCODINGS), metavar="ENC[:--FLAG=VALUE,...]",
                        help="rows to train and compare: position encodings (" + ", ".join(POSITION_ENCODINGS)
                             + "; default: all), each optionally with flags added to its training, e.g. "
                             "alibi:--alibi-encoder=split or floater:--floater-solve-every=10,--floater-lr-scale=1; "
                             "each row is reported under its trained model's label (alibi (split))")
    parser.add_argument("--baseline", default=None,
                        help="row the others are compared with, by its spec or its label (default: sinusoidal, "
                             "else the first)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1],
                        help="training seeds: one count N for seeds 1..N (--seeds 3), or several seeds "
                             "(--seeds 1 5 9); one model per encoding and seed (default: seed 1)")
    parser.add_argument("--size", choices=list(MODEL_SIZES), default="tiny",
                        help="model size, all models the same: " + ", ".join(
                            f"{name} (d={d}, {n}+{n} layers)" for name, (n, d, _, _) in MODEL_SIZES.items()))
    parser.add_argument("--max-update", type=int, default=800, help="training updates per model")
    parser.add_argument("--max-tokens", type=int, default=1000, help="tokens per batch")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (inverse-sqrt schedule)")
    parser.add_argument("--position-bias-scale", type=float, default=1.0,
                        help="fairseq's --position-bias-scale S for the encodings that take it (" + ", ".join(
                            e for e, scheme in POSITION_ENCODINGS.items() if uses_bias_scale(scheme))
                        + "): their learned logit biases learn S times faster (default 1: as the papers)")
    parser.add_argument("--toy-pair", choices=list(toy_data.PAIRS), default="reorder",
                        help="the generated language pair: adjectives move after their nouns (reorder), "
                             "or the whole sentence is reversed (reverse)")
    parser.add_argument("--train-size", type=int, default=4000, help="toy training sentence pairs")
    parser.add_argument("--test-size", type=int, default=400, help="toy test sentence pairs")
    parser.add_argument("--train-max-len", type=int, default=12, help="longest toy training source, in words")
    parser.add_argument("--long-max-len", type=int, default=30, help="longest toy test source, in words")
    parser.add_argument("--data-seed", type=int, default=1, help="seed of the toy corpus (the same for every model)")
    parser.add_argument("--bins", type=int, nargs="+", default=None,
                        help="left edges of the source-length bins (default: 3, then every 6 words past training)")
    parser.add_argument("--data-bin", help="your own fairseq-preprocess output (train, valid, test; joined dictionary)")
    parser.add_argument("--bpe", choices=["none", "subword_nmt", "sentencepiece"], default="none",
                        help="how the --data-bin corpus is segmented; hypotheses and references are de-segmented "
                             "and Moses-detokenized before scoring")
    parser.add_argument("--unit", choices=["words", "subwords"], default="words",
                        help="what the bins count in the --data-bin test sources: words (segmentation removed) "
                             "or subwords (the tokens the model reads)")
    parser.add_argument("--warm-start", type=int, default=0, metavar="N",
                        help="FLOATER as its paper trains it: from the best checkpoint of the sinusoidal model of the "
                             "same seed, N more updates at half the lr; and its control (vanilla_continued): the "
                             "sinusoidal model trained on N updates the same way. Needs sinusoidal and floater in "
                             "--encodings (default 0: FLOATER from scratch like the others)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="models trained at once, sharing the cores (default: one per core, at most 2)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if not 0 < args.position_bias_scale < float("inf"):
        parser.error(f"--position-bias-scale must be a positive finite number, got {args.position_bias_scale}")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        parser.error(str(e))
    try:
        specs = parse_rows(args.encodings)
    except ValueError as e:
        parser.error(str(e))
    baseline = args.baseline or ("sinusoidal" if "sinusoidal" in args.encodings else args.encodings[0])
    if not args.data_bin and (args.bpe != "none" or args.unit != "words"):
        parser.error("--bpe and --unit describe a --data-bin corpus; the toy corpus is words")
    if args.data_bin and args.bpe == "none" and args.unit == "subwords":
        parser.error("--unit subwords needs --bpe (subword_nmt or sentencepiece): without it a token is a word")
    if args.warm_start < 0 or (args.warm_start and not ("sinusoidal" in args.encodings
                                                        and any(r.encoding == "floater" for r in specs))):
        parser.error(f"--warm-start {args.warm_start}: a number of updates >= 0, with sinusoidal (the start) and "
                     "floater among --encodings")
    # every row's model built before any work: a flag that would change nothing is refused here,
    # and two rows that would train the same model are
    seen = {}
    for row in specs:
        try:
            row.label = preflight_label(row, args)
        except (ValueError, SystemExit) as e:
            parser.error(f"--encodings {row.spec}: {e}")
        if row.label in seen:
            parser.error(f"--encodings {seen[row.label].spec} and {row.spec} are the same model, {row.label!r}")
        seen[row.label] = row
    named = [r for r in specs if baseline in (r.spec, r.label)]
    if not named:
        parser.error(f"--baseline {baseline} is not among --encodings (specs {' '.join(args.encodings)}; labels "
                     f"{', '.join(r.label for r in specs)})")
    encodings = specs + ([Row(CONTROL, CONTROL, [])] if args.warm_start else [])

    out = os.path.abspath(args.out)
    for stale in ("bin", "checkpoints", "generations"):  # a re-run starts over rather than resuming old runs
        shutil.rmtree(os.path.join(out, stale), ignore_errors=True)
    try:
        data_bin = args.data_bin or toy_corpus(out, args)
        _, tgt_lang = data_languages(data_bin)
    except (OSError, pipeline.CommandFailed) as e:
        parser.exit(2, f"demo.py: error: {e}\n")
    edges = args.bins or [3] + list(range(args.train_max_len + 1, args.long_max_len + 1, 6))
    start_all = time.time()

    # Small models use two threads poorly: by default each core trains its own model.
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    # with --warm-start, FLOATER and its control start from the sinusoidal models: a second round
    warm = ("floater", CONTROL) if args.warm_start else ()
    rounds = [[(e, seed) for seed in seeds for e in encodings if e.encoding not in warm],
              [(e, seed) for seed in seeds for e in encodings if e.encoding in warm]]
    jobs = [job for jobs_of_round in rounds for job in jobs_of_round]
    done = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for first, jobs_of_round in zip((1, len(rounds[0]) + 1), rounds):
            done += list(pool.map(lambda job: run_one(job[0], len(jobs), *job[1], data_bin, out, args, tgt_lang),
                                  enumerate(jobs_of_round, first)))
    # each row under the label of its trained models (the same for every seed)
    for e in encodings:
        trained = {r["label"] for r, _, _ in done if r["spec"] == e.spec}
        if len(trained) != 1:
            parser.exit(2, f"demo.py: error: --encodings {e.spec}: its seeds' models have different labels "
                           f"({', '.join(sorted(trained))})\n")
        e.label = trained.pop()
    by_label = {}
    for e in encodings:
        if e.label in by_label:
            parser.exit(2, f"demo.py: error: --encodings {by_label[e.label].spec} and {e.spec} trained the same model, "
                           f"{e.label!r}\n")
        by_label[e.label] = e
    baseline = next(r.label for r in encodings if baseline in (r.spec, r.label))
    controls = {e.label: CONTROL for e in encodings if e.encoding == "floater"} if args.warm_start else {}
    runs = {e.label: [next(gen for row, _, gen in done if row["spec"] == e.spec and row["seed"] == s) for s in seeds]
            for e in encodings}
    rows = [{"encoding": e.label, "spec": e.spec, "slug": e.slug,
             "parameters": next(r["parameters"] for r, _, _ in done if r["spec"] == e.spec),
             "train_seconds": [r["train_seconds"] for r, _, _ in done if r["spec"] == e.spec]}
            for e in encodings]
    for row in rows:
        biases = [r["bias"] for r, _, _ in done if r["spec"] == row["spec"] and r["bias"]]
        if biases:
            row["bias"] = mean_bias(biases)

    unit = args.unit if args.data_bin else "words"
    # the decoder's limit counts the tokens it reads (subwords with BPE), whatever the bins count
    # (+1: fairseq counts the end-of-sentence token in the source length)
    longest = max(len(s.split()) for _, raw, _ in done for s in raw.sources)
    footer = study_report.decoding_limit_note(MAX_LEN_A, MAX_LEN_B, longest + 1, MAX_POSITIONS,
                                              what="demo.py's fairseq-generate")
    report = study_report.build_report(runs, edges, unit, baseline, seeds=seeds, footer=footer, controls=controls)
    paths = study_report.write_report(
        report, os.path.join(out, "bleu_by_length"),
        title=(f"Trained on sources of at most {args.train_max_len} {unit}" if not args.data_bin else "")
        + (f", {len(seeds)} seeds" if len(seeds) > 1 else "")
        + (f", --position-bias-scale {args.position_bias_scale:g}" if args.position_bias_scale != 1 else ""))
    note = "" if args.data_bin else f" Toy pair {args.toy_pair}; training sources had 3-{args.train_max_len} words."
    note += (f" {args.max_update} updates of {args.max_tokens} tokens, peak lr {args.lr:g}, size {args.size},"
             f" seeds {' '.join(map(str, seeds))}; {args.jobs} model(s) trained at a time,"
             f" {os.environ['OMP_NUM_THREADS']} thread(s) each.")
    note += "".join(f" {e}: {' '.join(OVERRIDES[e])}." for e in dict.fromkeys(r.encoding for r in specs) if e in OVERRIDES)
    note += "".join(f" {r.label}: {r.spec}." for r in specs if r.flags)
    if args.warm_start:
        note += (f" --warm-start {args.warm_start}: floater and {CONTROL} trained {args.warm_start} more updates at lr "
                 f"{args.lr / 2:g} from sinusoidal's best checkpoint of each seed ({args.max_update + args.warm_start} "
                 "in all); training time is that stage's.")
    scaled = list(dict.fromkeys(r.encoding for r in specs if uses_bias_scale(POSITION_ENCODINGS[r.encoding])))
    if scaled:
        note += f" --position-bias-scale {args.position_bias_scale:g} for {', '.join(scaled)}."
    summary = summary_table(rows, note) + bias_table(rows) + "\n" + study_report.markdown(report)
    write_text_atomically(os.path.join(out, "results.md"), summary)
    write_text_atomically(os.path.join(out, "results.json"), json.dumps(
        {"unit": unit, "edges": edges, "seeds": seeds, "max_update": args.max_update, "size": args.size,
         "max_tokens": args.max_tokens, "lr": args.lr, "toy_pair": None if args.data_bin else args.toy_pair,
         "position_bias_scale": args.position_bias_scale, "warm_start": args.warm_start,
         "rows": rows, "report": report}, indent=2) + "\n")
    figures = plot_positions(encodings, seeds[0], out, longest + 1)
    print("\n" + summary)
    print(f"| total {time.time() - start_all:.0f} s; wrote {out}/results.md, results.json, "
          + ", ".join(os.path.basename(p) for p in list(paths.values()) + figures))


def plot_positions(encodings, seed: int, out: str, length: int) -> list:
    """positions_ENC.png beside the report: what each encoding looks like in the best checkpoint
    of ``seed``, over the test set's source lengths (scripts/plot_positions.py)."""
    import plot_positions as plot

    figures = []
    for row in encodings:
        checkpoint = os.path.join(out, "checkpoints", row.slug, f"seed{seed}", "checkpoint_best.pt")
        figure = os.path.join(out, f"positions_{row.slug}.png")
        try:
            model, _ = plot.load_model(checkpoint)
            plot.plot(plot.position_arrays(model, length), figure,
                      f"{row.label}: seed {seed}'s checkpoint_best.pt, positions 0-{length - 1}")
        except Exception as e:  # the study is done: a figure that fails must not lose it
            print(f"| {os.path.basename(figure)} not written: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        figures.append(figure)
    return figures


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


if __name__ == "__main__":
    main()
