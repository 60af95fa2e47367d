"""docs/papers.md cannot rot: every recipe command it shows names an encoding, size and flags
that exist, and passes its --dry-run on a corpus of WMT's shape.

A dry run costs a process importing fairseq (~5 s on 2 cores), so commands that plan alike run
once: the plan depends on the script, the pair, ARCH, and on ENC only through FLOATER's two
stages (and the recipe's defaults for it); MODEL_FLAGS change the disk estimate only. What the
dry run does not see is checked here, in this process, for every command: the --position-encoding
and --position-blocks values, and MODEL_FLAGS / EXTRA_FLAGS against fairseq's parser for the
command's architecture. evaluate.sh's dry run needs a trained run and the extrapolation recipe's
the corpus's text: tests/test_recipes.py runs both on its miniature corpus.
"""
import os
import re
import shlex
import struct
import subprocess

import numpy as np
import pytest
from fairseq.data.indexed_dataset import MMapIndexedDataset, _dtype_header_code

from fairseq_posenc.positions import POSITION_ENCODINGS
from test_docs import REPO, _code_blocks, _split, fairseq_unknown

PAPERS = os.path.join(REPO, "docs", "papers.md")
# training pairs of the fake corpora, each with WMT14 En-De's length distribution (~29 BPE tokens a
# side): En-De's and WMT18 En-De's real counts; En-Fr at 8M of its 36M (its dry run reads ~12 bytes
# a pair: 2 GB at full size). A smaller corpus only makes the plan's checks stricter (fewer updates
# an epoch, fewer checkpoints in an epoch-long stage), and at a tenth of En-Fr FLOATER's one-epoch
# second stage could not hold the 5 checkpoints it averages: 8M is about the least that can.
PAIRS = {"wmt14_en_de": 4_500_000, "wmt14_en_fr": 8_000_000, "wmt18_en_de": 5_800_000}
# the recipes' own variables whose values this file checks
RECIPE_VALUES = {"ARCH": {"base", "big"}, "POSITION_BLOCKS": {"input", "all"}}


def recipe_commands():
    """(assignments, script, args) of every recipe command in docs/papers.md."""
    found = []
    text = open(PAPERS, encoding="utf-8").read()
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            for tokens in _split(line):
                env = {}
                while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
                    name, value = tokens.pop(0).split("=", 1)
                    env[name] = value
                if len(tokens) >= 2 and tokens[0] == "bash" and tokens[1].startswith("recipes/"):
                    found.append((env, tokens[1], tokens[2:]))
    return found


COMMANDS = recipe_commands()


def _write_split(prefix, sizes):
    """fairseq's MMapIndexedDataset index of ``sizes`` (its writer, vectorised: fairseq's loops in
    Python over every pair), and a sparse .bin of the right length: only the sizes are read."""
    sizes = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * np.dtype(np.uint16).itemsize, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(MMapIndexedDataset.Index._HDR_MAGIC + struct.pack("<Q", 1)
                + struct.pack("<B", _dtype_header_code(np.uint16)) + struct.pack("<Q", len(sizes)))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(sizes.sum(dtype=np.int64)) * np.dtype(np.uint16).itemsize)


def fake_corpus(root, recipe, src, tgt):
    """corpus.env and a data-bin whose index files hold WMT-like lengths (no text)."""
    pairs = PAIRS[recipe]
    rng = np.random.default_rng(0)
    src_len = np.clip(rng.lognormal(3.2, 0.55, pairs).astype(np.int32), 1, 250)
    tgt_len = np.clip((src_len * rng.uniform(0.8, 1.25, pairs)).astype(np.int32), 1, 250)
    data_bin = root / "data-bin"
    data_bin.mkdir(parents=True)
    for split, n in (("train", pairs), ("valid", 3000), ("test", 3003)):
        _write_split(str(data_bin / f"{split}.{src}-{tgt}.{src}"), src_len[:n] + 1)
        _write_split(str(data_bin / f"{split}.{src}-{tgt}.{tgt}"), tgt_len[:n] + 1)
    for lang in (src, tgt):
        (data_bin / f"dict.{lang}.txt").write_text("".join(f"w{i} {40000 - i}\n" for i in range(40000)))
    (root / "corpus.env").write_text(f"RECIPE={recipe}\nSRC={src}\nTGT={tgt}\nBPE=subword-nmt\nBPE_SIZE=40000\n"
                                     f"VALID_NAME=split\nTEST_NAME=newstest\n")
    return root


def _pair(script, args):
    if "--pair" in args:
        return args[args.index("--pair") + 1]
    return {"wmt14_en_fr": "en-fr"}.get(script.split("/")[1], "en-de")


def _recipe(script, pair):
    name = script.split("/")[1]
    return f"wmt18_{pair.replace('-', '_')}" if name == "wmt18" else ("wmt14_en_de" if name == "distillation" else name)


def test_papers_doc_shows_the_tables_commands():
    """The extraction finds what the page holds (a broken parser would check nothing)."""
    scripts = {script for _, script, _ in COMMANDS}
    assert {"recipes/wmt14_en_de/train.sh", "recipes/wmt14_en_fr/train.sh", "recipes/wmt18/train.sh",
            "recipes/distillation/distill.sh", "recipes/extrapolation/run.sh"} <= scripts
    table2 = {(env["ENC"], env["POSITION_BLOCKS"], env["ARCH"], script) for env, script, _ in COMMANDS
              if "POSITION_BLOCKS" in env}
    assert len(table2) == 24  # FLOATER's Table 2: 3 encoders x 2 forms x base/big x En-De/En-Fr


@pytest.mark.parametrize("index", range(len(COMMANDS)))
def test_every_command_names_values_and_flags_that_exist(index):
    env, script, args = COMMANDS[index]
    enc = env.get("ENC", "sinusoidal")
    assert enc in POSITION_ENCODINGS, f"{script}: ENC={enc} is not a --position-encoding"
    for name, allowed in RECIPE_VALUES.items():
        assert env.get(name, next(iter(allowed))) in allowed, f"{script}: {name}={env[name]} not in {allowed}"
    for encoding in env.get("ENCODINGS", "").split():
        assert encoding in POSITION_ENCODINGS, f"{script}: ENCODINGS holds {encoding}"
    flags = shlex.split(env.get("MODEL_FLAGS", "")) + shlex.split(env.get("EXTRA_FLAGS", ""))
    if flags:
        suffix = "wmt_en_de_big" if env.get("ARCH") == "big" else "wmt_en_de"
        criterion = "relation_distillation" if "distill" in script else "label_smoothed_cross_entropy"
        tokens = ["fairseq-train", "data", "--arch", f"transformer_{enc}_{suffix}", "--criterion", criterion] + flags
        assert fairseq_unknown("fairseq-train", tokens) == [], f"{script}: {flags}"


def _dry_run_key(env, script, args):
    if not script.endswith(("train.sh", "distill.sh")):
        return None
    # FLOATER's protocol (recipes/floater/train.sh) trains floater and rnn: each planned once
    warm_started = env.get("ENC") if env.get("ENC") in ("floater", "rnn") else None
    return script, _pair(script, args), env.get("ARCH", "base"), warm_started, "VANILLA_CONTINUED" in env


def test_each_kind_of_training_command_passes_its_dry_run(tmp_path):
    firsts = {}
    for env, script, args in COMMANDS:
        key = _dry_run_key(env, script, args)
        if key is not None:
            firsts.setdefault(key, (env, script, args))
    assert len(firsts) >= 8, sorted(firsts)
    corpora = {}
    teacher = tmp_path / "teacher.pt"
    teacher.write_bytes(b"")  # the dry run checks it exists; it is read only when training
    failures = []
    for n, (env, script, args) in enumerate(firsts.values()):
        pair = _pair(script, args)
        recipe = _recipe(script, pair)
        if recipe not in corpora:
            src, tgt = pair.split("-")
            corpora[recipe] = fake_corpus(tmp_path / recipe, recipe, src, tgt)
        run_env = {**os.environ, **env, "DATA": str(corpora[recipe]), "OUT": str(tmp_path / f"out{n}"),
                   "NUM_GPUS": "8", "OMP_NUM_THREADS": "1"}
        if "TEACHER" in env:
            run_env["TEACHER"] = str(teacher)
        proc = subprocess.run(["bash", script, *args, "--dry-run"], cwd=REPO, env=run_env, capture_output=True,
                              text=True)
        command = " ".join(f"{k}={v}" for k, v in env.items()) + f" bash {script} {' '.join(args)}"
        if proc.returncode != 0 or "== --dry-run: nothing trained" not in proc.stdout:
            failures.append(f"{command}\n  rc={proc.returncode}\n{proc.stderr[-1500:]}")
            continue
        # the plan the papers' settings ask for: ~32k tokens an update on 8 GPUs
        assert "x 8 GPU x update-freq 1 = 32768 padded tokens at most" in proc.stdout, command
    assert not failures, "\n".join(failures)
