#!/usr/bin/env python
"""The main job: a small length-generalisation study, one model per position encoding, trained
and decoded through fairseq's CLI, on a toy language pair the project generates. It runs the
recipes' workflow (recipes/Snakefile) with recipes/conf/demo.yaml and what its flags change
(OUT/demo_config.yaml); a re-run trains only what changed.

    make demo                                             # every encoding, about 10 minutes on 2 cores
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
from --baseline (recipes/posenc_workflow/length_report.py): Markdown and JSON, and a two-panel PNG plot.
Beside the report, positions_ENC.png draws what each encoding looks like in the first seed's best
checkpoint (scripts/plot_positions.py).
Your own corpus: a study of the workflow with its corpus's configuration (recipes/README.md).

--encodings takes row specs: ENC, or ENC:--flag=value[,--flag=value...] to train that encoding
with those flags added (``alibi:--alibi-encoder=split``, ``floater:--floater-solve-every=10``),
so that one encoding can be compared under several settings. Each row is reported under the label
of its trained model (fairseq_posenc/labels.py: ``alibi (split)``, ``floater (solve every 10)``),
read from the averaged checkpoint (python -m fairseq_posenc.labels), not from the flags; two
rows with the same label are refused before any work.

With --warm-start N, FLOATER trains as its paper does: warm-started from the best checkpoint of
the sinusoidal model of the same seed and trained N more updates at half the lr; beside it the
control, that sinusoidal model trained on from the same checkpoint for the same N updates at the
same lr (fairseq's --finetune-from-model), reported as vanilla_continued. FLOATER's difference
from the control is what FLOATER does; its difference from sinusoidal also holds the N updates.
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import time

import yaml

# before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py)
logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fairseq_posenc.models.from_flags import MODEL_SIZES  # noqa: E402
from fairseq_posenc.positions import POSITION_ENCODINGS  # noqa: E402
from fairseq_posenc.positions.bias_scale import uses_bias_scale  # noqa: E402
from posenc_workflow import toy_data  # noqa: E402
from posenc_workflow import workflow as wf  # noqa: E402  (not "workflow": snakemake.utils.validate reads that name)

SNAKEFILE = os.path.join(ROOT, "recipes", "Snakefile")
DEMO_CONFIG = os.path.join(ROOT, "recipes", "conf", "demo.yaml")
SCHEMA = os.path.join(ROOT, "recipes", "conf", "schema.yaml")


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
    parser.add_argument("--warm-start", type=int, default=0, metavar="N",
                        help="FLOATER as its paper trains it: from the best checkpoint of the sinusoidal model of the "
                             "same seed, N more updates at half the lr; and its control (vanilla_continued): the "
                             "sinusoidal model trained on N updates the same way. Needs sinusoidal and floater in "
                             "--encodings (default 0: FLOATER from scratch like the others)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="jobs at once, a thread each (default: one per core, at most 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the jobs, run nothing")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if not 0 < args.position_bias_scale < float("inf"):
        parser.error(f"--position-bias-scale must be a positive finite number, got {args.position_bias_scale}")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        parser.error(str(e))
    if args.warm_start < 0 or (args.warm_start and not ("sinusoidal" in args.encodings
                                                        and any(e.partition(":")[0] == "floater" for e in args.encodings))):
        parser.error(f"--warm-start {args.warm_start}: a number of updates >= 0, with sinusoidal (the start) and "
                     "floater among --encodings")
    changes = {
        "out": args.out,
        "corpus": {"toy": {"pair": args.toy_pair, "train_size": args.train_size, "test_size": args.test_size,
                           "train_max_len": args.train_max_len, "long_max_len": args.long_max_len,
                           "seed": args.data_seed}},
        "models": {"arch": args.size, "encodings": list(args.encodings), "seeds": seeds, "baseline": args.baseline},
        "train": {"max_update": args.max_update, "max_tokens": args.max_tokens, "lr": args.lr,
                  # for the rows that take it; given otherwise, the workflow refuses it
                  **({"position_bias_scale": args.position_bias_scale} if args.position_bias_scale != 1.0 or any(
                      uses_bias_scale(POSITION_ENCODINGS[e.partition(":")[0]]) for e in args.encodings
                      if e.partition(":")[0] in POSITION_ENCODINGS) else {})},
        "report": {"bins": args.bins},
        "warm_start": {"enabled": bool(args.warm_start), "second": {"max_update": args.warm_start}},
    }
    # every row's model built before any work, as the workflow's parse does: a flag that would
    # change nothing, an unknown encoding and two rows of one model are refused here
    try:
        config = study_config(changes)
        wf.Study(config).check_same_rows()
    except (wf.ConfigError, ValueError) as e:
        parser.error(str(e).replace("models.encodings", "--encodings").replace("models.baseline", "--baseline"))
    os.makedirs(args.out, exist_ok=True)
    override = os.path.join(args.out, "demo_config.yaml")
    with open(override, "w", encoding="utf-8") as f:
        yaml.safe_dump(changes, f, sort_keys=False)
    start = time.time()
    command = [sys.executable, "-m", "snakemake", "-s", SNAKEFILE, "--configfile", DEMO_CONFIG, override,
               "--cores", str(args.jobs), "--rerun-incomplete", "--quiet", "rules"] + (["-n"] if args.dry_run else [])
    print("| " + " ".join(command), flush=True)
    code = subprocess.call(command)
    if code:
        parser.exit(code, f"demo.py: error: the workflow failed (exit {code}); its log is above\n")
    if not args.dry_run:
        with open(os.path.join(args.out, "results.md"), encoding="utf-8") as f:
            print("\n" + f.read())
        print(f"| total {time.time() - start:.0f} s; wrote {args.out}/results.md, results.json, bleu_by_length.*, "
              "positions_*.png")


def study_config(changes: dict) -> dict:
    """recipes/conf/demo.yaml updated with ``changes``, checked and completed by the schema."""
    from snakemake.utils import update_config, validate

    with open(DEMO_CONFIG, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    update_config(config, json.loads(json.dumps(changes)))
    validate(config, SCHEMA)
    return config


def parse_seeds(values):
    """``--seeds 3`` is seeds 1, 2, 3; several values are the seeds themselves."""
    seeds = list(range(1, values[0] + 1)) if len(values) == 1 else list(values)
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds takes a count N >= 1 or distinct non-negative seeds, got {values}")
    return seeds


if __name__ == "__main__":
    main()
