"""recipes/iwslt14_de_en end to end, offline: a miniature de-en.tgz with the official member names
and formats (train.tags.de-en.* with their talk metadata, the five test sets as .xml), then
prepare.sh --raw-dir, train.sh (a few CPU updates), evaluate.sh; and the recipe's training flags
against fairseq's IWSLT'14 example, both parsed by fairseq's own parser."""
import io
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "iwslt14_de_en")
from fairseq_posenc.recipe.wmt_data import read_sources  # noqa: E402
from test_recipes import lines, ok  # noqa: E402  (the WMT recipes' test helpers)

TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012"]
TEST_SIZES = [7, 5, 6, 4, 8]  # 30 test pairs, a count per set so that a set left out shows
# fairseq's own IWSLT'14 training command (examples/translation/README.md), as printed there
FAIRSEQ_EXAMPLE = """fairseq-train data-bin/iwslt14.tokenized.de-en
    --arch transformer_iwslt_de_en --share-decoder-input-output-embed
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000
    --dropout 0.3 --weight-decay 0.0001
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --max-tokens 4096
    --eval-bleu
    --eval-bleu-args '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}'
    --eval-bleu-detok moses
    --eval-bleu-remove-bpe
    --eval-bleu-print-samples
    --best-checkpoint-metric bleu --maximize-best-checkpoint-metric"""

# a toy pair, word for word (German side: each English word reversed, + "en"), with capitals,
# a hyphenated word (kept whole: no -a) and quotes (escaped by Moses' tokenizer)
_WORDS = ["house", "cat", "dog", "tree", "river", "city", "green", "small", "old", "new", "sees", "has",
          "likes", "near", "the", "a", "and", "of", "big", "red"]


def _pair(rng, n):
    words = [rng.choice(_WORDS) for _ in range(n)]
    if n > 4 and rng.random() < 0.3:
        words[1] = words[1] + "-" + words[2]
    en = " ".join(words)
    de = " ".join("-".join(w[::-1] + "en" for w in word.split("-")) for word in words)
    return de[0].upper() + de[1:] + ".", en[0].upper() + en[1:] + "."


def write_archive(path, seed=1, talks=4, per_talk=120):
    """de-en.tgz with the members prepare-iwslt14.sh reads. Per talk: the metadata lines fairseq
    drops (<url>, <keywords>, <talkid>), a <title> and a <description> line kept without their
    tags, then ``per_talk`` sentences; among them one pair of 180 tokens a side and one of ratio 2
    (the 1-175 / 1.5 cleaning drops both) and one empty pair. Returns the expected counts."""
    rng = random.Random(seed)
    de_lines, en_lines, text_pairs = [], [], 0
    for talk in range(talks):
        meta = [f"<url>http://www.ted.com/talks/toy_{talk}.html</url>", f"<keywords>talks, toy {talk}</keywords>",
                f"<talkid>{100 + talk}</talkid>"]
        de_lines += meta
        en_lines += meta
        de_lines += [f"<title>Toy-Vortrag {talk}: Das Haus</title>",
                     f"<description>TED Talk Subtitles and Transcript: Vortrag {talk} Über Häuser</description>"]
        en_lines += [f"<title>Toy talk {talk}: The House</title>",
                     f"<description>TED Talk Subtitles and Transcript: Talk {talk} About Houses</description>"]
        text_pairs += 2
        for i in range(per_talk):
            if talk == 0 and i == 5:
                de, en = " ".join(["Haus"] * 180), " ".join(["House"] * 180)
            elif talk == 1 and i == 7:
                de, en = " ".join(["Katze"] * 10), " ".join(["Cat"] * 20)
            elif talk == 2 and i == 9:
                de = en = ""
            else:
                de, en = _pair(rng, rng.randint(3, 12))
                if rng.random() < 0.1:
                    de, en = f'Er sagt "{de}"', f'He says "{en}"'
            de_lines.append(de)
            en_lines.append(en)
            text_pairs += 1
    members = {"de-en/train.tags.de-en.de": "\n".join(de_lines) + "\n",
               "de-en/train.tags.de-en.en": "\n".join(en_lines) + "\n"}
    test_pairs = []
    for name, size in zip(TEST_SETS, TEST_SIZES):
        pairs = [_pair(rng, rng.randint(3, 12)) for _ in range(size)]
        pairs[0] = (pairs[0][0].replace(".", "\u2019s."), pairs[0][1].replace(".", "\u2019s."))  # ’ -> '
        test_pairs += pairs
        for side, lang in ((0, "de"), (1, "en")):
            segs = "".join(f'<seg id="{i + 1}"> {p[side]} </seg>\n' for i, p in enumerate(pairs))
            members[f"de-en/{name}.de-en.{lang}.xml"] = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<refset setid="iwslt2014-{name}" srclang="german" '
                f'trglang="english" refid="ref">\n<doc docid="1" genre="lectures">\n<url>http://www.ted.com/talks/x.html</url>\n'
                f"<description>TED Talk Subtitles and Transcript: toy</description>\n<talkid>1</talkid>\n"
                f"<title>Toy</title>\n{segs}</doc>\n</refset>\n</mteval>\n")
    members["de-en/README"] = "toy\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return {"text_pairs": text_pairs, "cleaned": text_pairs - 3, "test": [p[1] for p in test_pairs]}


def run(script, args=(), env=None):
    return subprocess.run(["bash", os.path.join(RECIPE, script), *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True)




TINY_MODEL = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 64 --decoder-embed-dim 64 "
              "--encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 2 "
              "--decoder-attention-heads 2")
# a tiny model and a short CPU run; EVAL_BLEU=1 as fairseq's example (checkpoint_best.pt by BLEU).
# 1024 tokens a batch (ALLOW_BATCH: not the example's 4096) so that an epoch holds 6 updates;
# fairseq validates (and decodes) at every 4th epoch's end (8) and at the checkpoints of updates 40,
# 80 and 200 (120 ends epoch 20): 12 times
TRAIN_ENV = {"MODEL_FLAGS": TINY_MODEL, "EXTRA_FLAGS": "--num-workers 0 --seed 1 --validate-interval 4",
             "MAX_TOKENS": "1024", "UPDATE_FREQ": "1", "ALLOW_BATCH": "1", "MAX_UPDATE": "200", "WARMUP": "20",
             "LR": "5e-3", "DROPOUT": "0.1", "SAVE_INTERVAL_UPDATES": "40", "AVERAGE": "2", "EVAL_BLEU": "1",
             "DEVICE": "cpu",
             "WORKERS": "1", "GEN_MAX_TOKENS": "2000", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("iwslt")
    expected = write_archive(str(base / "raw" / "de-en.tgz"))
    args = ["--raw-dir", str(base / "raw"), "--out", str(base / "data")]
    env = {"WORKERS": "1"}
    return base, expected, ok(run("prepare.sh", args, env)), args, env


def test_prepare_follows_fairseqs_script_step_by_step(prepared):
    base, expected, out, args, env = prepared
    data = base / "data"
    for n in range(1, 10):
        assert f"== [{n}/9]" in out
    assert "no download" in out and "| downloading" not in out
    # no published checksum: the first use records the archive's sha256 and size beside it
    assert "de-en.tgz: no published checksum; recorded sha256 " in out
    assert (base / "raw" / "de-en.tgz.sha256").read_text().split()[1] == str((base / "raw" / "de-en.tgz").stat().st_size)

    # extract: the talks' metadata lines dropped, title and description kept without their tags
    raw_de, raw_en = lines(data / "raw" / "train.de"), lines(data / "raw" / "train.en")
    assert len(raw_de) == len(raw_en) == expected["text_pairs"] == 4 * 122
    assert not any(tag in line for line in raw_de + raw_en for tag in ("<url>", "<talkid>", "<keywords>", "<title>",
                                                                       "</description>"))
    assert "Toy talk 0: The House" in raw_en and "TED Talk Subtitles and Transcript: Talk 3 About Houses" in raw_en
    # the test set: the five .xml sets in fairseq's order, segment text only, and nothing else
    assert lines(data / "raw" / "test.en") == expected["test"] == lines(data / "test.raw.en")
    assert len(expected["test"]) == sum(TEST_SIZES) == 30

    # tokenize: no -a (a hyphenated word stays whole), Moses' escaping, the test set's ’ straightened
    tok = "\n".join(lines(data / "tok" / "train.en"))
    assert "@-@" not in tok and re.search(r"\w-\w", tok) and "&quot;" in tok
    test_tok = "\n".join(lines(data / "tok" / "test.en"))
    assert "\u2019" not in test_tok and "&apos;s" in test_tok and "\u2019" in "\n".join(expected["test"])

    # clean 1-175 tokens, ratio 1.5, on the tokens: the 180-token pair, the 10:20 pair and the
    # empty pair go, nothing else
    clean_de, clean_en = lines(data / "clean" / "train.de"), lines(data / "clean" / "train.en")
    assert len(clean_de) == len(clean_en) == expected["cleaned"] == 485
    for s, t in zip(clean_de, clean_en):
        n, m = len(s.split()), len(t.split())
        assert 1 <= n <= 175 and 1 <= m <= 175 and max(n, m) / min(n, m) <= 1.5

    # lowercase, then the split: every 23rd cleaned pair validates (21 of 485), the other 464 train
    lc_en = lines(data / "lc" / "train.en")
    assert lc_en == [line.lower() for line in clean_en] and lc_en != clean_en
    assert lines(data / "split" / "valid.en") == lc_en[22::23] and len(lc_en[22::23]) == 485 // 23 == 21
    assert lines(data / "split" / "train.en") == [x for i, x in enumerate(lc_en, 1) if i % 23]
    assert len(lines(data / "train.de")) == len(lines(data / "train.tok.en")) == 464
    assert len(lines(data / "valid.en")) == 21 and len(lines(data / "test.de")) == 30
    assert all(line == line.lower() for line in lines(data / "test.en") + lines(data / "test.de"))

    # BPE learned on the training part only (validation words get no merges of their own), then
    # a dictionary per language
    codes = lines(data / "bpe" / "code")[1:]
    assert 0 < len(codes) <= 10000
    assert (data / "data-bin" / "dict.de.txt").read_text() != (data / "data-bin" / "dict.en.txt").read_text()
    for split, count in (("train", 464), ("valid", 21), ("test", 30)):
        assert f"| {split}: {count} sentence pairs" in out
        assert (data / "data-bin" / f"{split}.de-en.en.bin").stat().st_size > 0
    corpus = (data / "corpus.env").read_text()
    assert "RECIPE=iwslt14_de_en" in corpus and "VALID_NAME=train-every-23rd" in corpus and "BPE_SIZE=10000" in corpus

    # a re-run checks the archive against its record and skips the 8 steps that are done
    again = ok(run("prepare.sh", args, env))
    assert again.count("done before, skipping") == 8
    assert "de-en.tgz: sha256 and size (" in again and "as recorded at its first use" in again


def test_the_archive_is_kept_apart_in_the_cache_and_a_replaced_one_is_refused_against_its_record(tmp_path):
    from fairseq_posenc.recipe.wmt_data import main as wmt_data

    sources = os.path.join(RECIPE, "sources")
    archives = read_sources(sources)[0]
    assert [a.file for a in archives] == ["iwslt14/de-en.tgz"]  # not data/archives/de-en.tgz: every IWSLT year's name
    cache = tmp_path / "archives"
    write_archive(str(cache / "iwslt14" / "de-en.tgz"), seed=1, talks=1, per_talk=30)
    wmt_data(["fetch", "--sources", sources, "--raw-dir", str(cache), "--no-download"])
    record = (cache / "iwslt14" / "de-en.tgz.sha256").read_text().split()
    write_archive(str(cache / "iwslt14" / "de-en.tgz"), seed=2, talks=1, per_talk=30)
    with pytest.raises(SystemExit) as stop:
        wmt_data(["fetch", "--sources", sources, "--raw-dir", str(cache), "--no-download"])
    assert stop.value.code == 2
    # missing: where to get it and where to put it
    with pytest.raises(SystemExit):
        wmt_data(["fetch", "--sources", sources, "--raw-dir", str(tmp_path / "none"), "--no-download"])
    assert len(record[0]) == 64 and int(record[1]) > 0


def test_train_and_evaluate_score_as_the_field_reports_iwslt(prepared):
    """compare.sh with one encoding and one seed: train.sh, evaluate.sh, the report over the test set."""
    base = prepared[0]
    runs = base / "compare" / "sinusoidal" / "seed1"
    env = {**TRAIN_ENV, "DATA": str(base / "data"), "OUT": str(base / "compare"), "ENCODINGS": "sinusoidal",
           "SEEDS": "1", "RESULTS": str(base / "results.txt"), "BINS": "1 8 11"}
    out = ok(run("compare.sh", env=env))
    assert "fairseq-train --arch transformer_sinusoidal_iwslt_de_en: lr 5e-3, dropout 0.1" in out
    # the example's settings reached fairseq-train (the tiny sizes and short schedule are the test's)
    import torch

    last = torch.load(runs / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    cfg = last["cfg"]
    assert last["optimizer_history"][-1]["num_updates"] == 200
    assert cfg["model"].share_decoder_input_output_embed and not cfg["model"].share_all_embeddings
    assert cfg["optimizer"]["weight_decay"] == 0.0001 and cfg["optimizer"]["adam_eps"] == 1e-8  # Adam's default
    assert cfg["lr_scheduler"]["warmup_init_lr"] == -1 and not cfg["common"]["fp16"]  # fairseq's defaults
    assert cfg["task"]["eval_bleu"] and cfg["checkpoint"]["best_checkpoint_metric"] == "bleu"
    # checkpoint_best.pt is the best validation BLEU fairseq logged
    logged = [float(b) for b in re.findall(r"\| valid on 'valid' subset \|.* \| bleu ([\d.]+) ",
                                           (runs / "train.log").read_text())]
    best = torch.load(runs / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert len(logged) == 12 and best["extra_state"]["best"] == pytest.approx(max(logged), abs=0.005)

    # evaluate: the last 2 interval checkpoints averaged (160 and 200: 120 ends an epoch), beam 5, lenpen 1
    assert "| averaged: updates 160, 200 (" in out and f"{runs}/averaged_last2.pt" in out
    assert "fairseq-generate --gen-subset test --beam 5 --lenpen 1 " in out
    test = "dev2010_dev2012_tst2010-2012"
    generation = (runs / f"generate.{test}.txt").read_text()
    refs = [line.split("\t", 1)[1] for line in generation.splitlines() if line.startswith("T-")]
    assert len(refs) == 30 and all(r == r.lower() for r in refs)  # the references are lowercased like outputs
    results = lines(base / "results.txt")
    # compare.sh names the seed in the label: its seeds append to one results file
    label = rf"\| iwslt14_de_en de-en enc=sinusoidal seed=1 arch=iwslt {test} beam=5 lenpen=1 lenpen_form=fairseq avg=2 \| 30 sentences"
    sacre = re.search(label + r" \| SacreBLEU (\d+\.\d\d) \(detokenized, lowercased\) \| (nrefs:1\|case:lc\|eff:no\|tok:13a\S*)$",
                      results[0])
    tokenized = re.search(label + r" \| tokenized BLEU (\d+\.\d\d) \(no compound split, lowercased, tokenize none\) \|",
                          results[1])
    assert sacre and tokenized, results
    # tokenized BLEU is the number fairseq-generate's own scorer prints on this corpus
    fairseq_bleu = float(re.search(r"Generate test with beam=5: BLEU4 = ([\d.]+),", generation).group(1))
    assert float(tokenized.group(1)) == pytest.approx(fairseq_bleu, abs=0.005)
    # the toy pair is learnable in 200 updates (measured: SacreBLEU 36.98, tokenized 33.71; an
    # untrained model scores about 0): hypotheses and both references stayed aligned
    assert 15.0 < float(sacre.group(1)) <= 100.0 and 15.0 < fairseq_bleu <= 100.0
    scores = json.loads((runs / f"bleu.{test}.json").read_text())
    assert scores["lowercase"] is True and scores["compound_split"] is False
    # the report over the whole test set, per bin of source words: its sentences add up to the 30
    report = json.loads((base / "compare" / "bleu_by_length.json").read_text())
    assert (base / "compare" / "bleu_by_length.png").stat().st_size > 0
    assert "sinusoidal" in (base / "compare" / "bleu_by_length.md").read_text()
    # the row is named by the label evaluate.sh read from the averaged checkpoint
    assert (runs / f"label.{test}.txt").read_text() == "sinusoidal\n"
    assert list(report["models"]) == ["sinusoidal"]
    assert [b["sentences"] for b in report["bins"]] == [10, 7, 13]  # of source words [1,8), [8,11), [11,inf)
    assert report["seeds"] == [1] and "outputs that long are not cut" in report["footer"]

    # the other checkpoint stays available: checkpoint_best.pt by validation BLEU, labelled so
    out = ok(run("evaluate.sh", ["--dry-run"], env={**env, "OUT": str(runs), "ENC": "sinusoidal", "CHECKPOINT": "best"}))
    assert f"== CHECKPOINT=best: {runs}/checkpoint_best.pt (best by validation bleu, not averaged)" in out
    assert f"--path {runs}/checkpoint_best.pt" in out


def _parse_train(words):
    """fairseq-train's namespace for these arguments, as fairseq-train parses them (the arch's
    defaults applied, the plugin registered)."""
    from fairseq import options

    import fairseq_posenc  # noqa: F401

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, words)


def test_the_recipes_training_flags_are_fairseqs_iwslt_example(prepared):
    """train.sh's fairseq-train command on one GPU against examples/translation/README.md's, both
    through fairseq's parser: every option that decides the model and its training is equal,
    but for the two named deviations (--eval-bleu-args' length limit; the plugin's architecture)."""
    base = prepared[0]
    # a dry run on one GPU (NUM_GPUS=1: what a one-GPU user gets), with the recipe's defaults
    out = ok(run("train.sh", ["--dry-run"], env={"DATA": str(base / "data"), "OUT": str(base / "runs" / "plan"),
                                                 "NUM_GPUS": "1", "EVAL_BLEU": "1", "SAVE_INTERVAL_UPDATES": "5",
                                                 "AVERAGE": "2", "MAX_UPDATE": "30"}))
    command = re.search(r"^== --dry-run: would run fairseq-train (.*)$", out, re.M).group(1)
    ours = _parse_train(shlex.split(command))
    theirs = _parse_train(shlex.split(FAIRSEQ_EXAMPLE.replace("\n", " "))[1:])
    relevant = ["share_decoder_input_output_embed", "share_all_embeddings", "optimizer", "adam_betas", "adam_eps",
                "clip_norm", "lr", "lr_scheduler", "warmup_updates", "warmup_init_lr", "dropout", "weight_decay",
                "criterion", "label_smoothing", "max_tokens", "update_freq", "fp16", "bf16", "amp", "memory_efficient_fp16",
                "eval_bleu", "eval_bleu_detok", "eval_bleu_remove_bpe", "best_checkpoint_metric",
                "maximize_best_checkpoint_metric", "encoder_embed_dim", "encoder_ffn_embed_dim",
                "encoder_attention_heads", "encoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim",
                "decoder_attention_heads", "decoder_layers", "attention_dropout", "activation_dropout",
                "encoder_normalize_before", "decoder_normalize_before", "seed"]
    differing = {k: (getattr(ours, k), getattr(theirs, k)) for k in relevant if getattr(ours, k) != getattr(theirs, k)}
    assert differing == {}
    assert ours.arch == "transformer_sinusoidal_iwslt_de_en" and theirs.arch == "transformer_iwslt_de_en"
    assert ours.position_encoding == "sinusoidal"
    # the selection decodes with the test's beam and a length limit no lower than the test decode's
    ours_eval, theirs_eval = json.loads(ours.eval_bleu_args), json.loads(theirs.eval_bleu_args)
    assert ours_eval["beam"] == theirs_eval["beam"] == 5
    assert (ours_eval["max_len_a"], ours_eval["max_len_b"]) == (1.5, 50) and (theirs_eval["max_len_a"],
                                                                           theirs_eval["max_len_b"]) == (1.2, 10)
    # the plan: fairseq's 4096 tokens on one GPU at update-freq 1, and the time it expects
    assert "| tokens per update: 4096 x 1 GPU x update-freq 1 = 4096 padded tokens at most (+0.0% from fairseq's IWSLT example's 4096)" in out
    assert "| expected time on one GPU: 30 updates x ~" in out


def test_every_encoding_has_the_iwslt_size_and_sinusoidal_is_fairseqs_model():
    """transformer_<enc>_iwslt_de_en for every encoding: fairseq's transformer_iwslt_de_en sizes
    (d 512, ffn 1024, 4 heads, 6 + 6 layers); with sinusoidal, fairseq's own model, parameter for
    parameter (separate dictionaries, decoder input and output embeddings shared)."""
    import torch
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks.translation import TranslationTask

    from fairseq_posenc.positions import POSITION_ENCODINGS

    sizes = ["encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "encoder_layers",
             "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads", "decoder_layers", "dropout"]
    base = ["data-bin", "--share-decoder-input-output-embed"]
    theirs = _parse_train(base + ["--arch", "transformer_iwslt_de_en"])
    assert [getattr(theirs, k) for k in sizes] == [512, 1024, 4, 6, 512, 1024, 4, 6, 0.1]
    for enc in POSITION_ENCODINGS:
        ours = _parse_train(base + ["--arch", f"transformer_{enc}_iwslt_de_en"])
        assert [getattr(ours, k) for k in sizes] == [getattr(theirs, k) for k in sizes], enc
        assert ours.position_encoding == enc

    dicts = []
    for lang, n in (("de", 40), ("en", 30)):
        d = Dictionary()
        for i in range(n):
            d.add_symbol(f"{lang}{i}")
        dicts.append(d)
    task = TranslationTask(_parse_train(base + ["--arch", "transformer_iwslt_de_en"]), *dicts)
    models = []
    for arch in ("transformer_iwslt_de_en", "transformer_sinusoidal_iwslt_de_en"):
        args = _parse_train(base + ["--arch", arch])
        torch.manual_seed(1)
        models.append(ARCH_MODEL_REGISTRY[arch].build_model(args, task))
    theirs_params, ours_params = (dict(m.named_parameters()) for m in models)
    assert {k: v.shape for k, v in ours_params.items()} == {k: v.shape for k, v in theirs_params.items()}
    assert all(torch.equal(ours_params[k], theirs_params[k]) for k in theirs_params)


def test_the_extrapolation_recipe_keeps_iwslts_two_dictionaries(prepared):
    """recipes/extrapolation/run.sh on the prepared IWSLT corpus: the short pairs binarized with
    the corpus's own two dictionaries (not a joined one), and each model planned with IWSLT's
    settings (--dry-run: split, binarize, plan, train nothing)."""
    base = prepared[0]
    out = base / "extrapolation"
    proc = run("../extrapolation/run.sh", ["--dry-run"], env={
        "DATA": str(base / "data"), "OUT": str(out), "ENCODINGS": "sinusoidal", "DEVICE": "cpu", "TRAIN_BELOW": "12",
        "BINS": "12 14", "SAVE_INTERVAL_UPDATES": "1", "AVERAGE": "1", "MAX_UPDATE": "4", "WORKERS": "1"})
    stdout = ok(proc)
    for lang in ("de", "en"):
        assert (out / "data-bin" / f"dict.{lang}.txt").read_text() == \
            (base / "data" / "data-bin" / f"dict.{lang}.txt").read_text()
    assert "--arch transformer_sinusoidal_iwslt_de_en" in stdout and "--share-decoder-input-output-embed" in stdout
    assert "== --dry-run: nothing trained, no report" in stdout


# ------------------------------------------------------------------------------------------------
# the download (issue 31, item 6): https, a timeout, a checksum recorded the first time. Nothing is
# downloaded from outside: a server on 127.0.0.1 started here serves (or withholds) de-en.tgz.
def test_the_archive_comes_over_https():
    archive = read_sources(os.path.join(RECIPE, "sources"))[0][0]
    assert archive.url == "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
    assert archive.checksum == "record"


class _Server:
    """An HTTP server on 127.0.0.1 for one test: serves ``body`` (with a Content-Length unless
    ``length`` is False), or, with ``stall``, the headers and 10 bytes, then nothing until the test
    ends (at most 5 s)."""

    def __init__(self):
        import http.server
        import threading

        self.body, self.length, self.stall, self.released = b"", True, False, threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                if server.stall:
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"0123456789")
                    self.wfile.flush()
                    server.released.wait(5)
                    return
                if server.length:
                    self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _fetch(cache, mirror, capsys):
    """wmt_data.py fetch of the recipe's sources into ``cache`` from ``mirror``: (exit code, stdout, stderr)."""
    from fairseq_posenc.recipe.wmt_data import main as wmt_data

    code = 0
    try:
        wmt_data(["fetch", "--sources", os.path.join(RECIPE, "sources"), "--raw-dir", str(cache), "--mirror", mirror])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_a_silent_server_stops_the_download_after_download_timeout_and_leaves_no_file(tmp_path, server, capsys,
                                                                                      monkeypatch):
    import time

    server.stall = True
    monkeypatch.setenv("DOWNLOAD_TIMEOUT", "0.5")
    start = time.monotonic()
    code, out, err = _fetch(tmp_path / "cache", server.url, capsys)
    elapsed = time.monotonic() - start
    url = f"{server.url}/iwslt14/de-en.tgz"
    assert code == 2 and elapsed < 4, (code, elapsed, err)  # not the server's 5 s
    assert err.strip().splitlines()[-1] == (
        f"wmt_data.py: error: could not download {url} (nothing received for 0.5 s; DOWNLOAD_TIMEOUT=SECONDS waits "
        f"longer): download it by hand into {tmp_path}/cache/ and pass --raw-dir {tmp_path}/cache")
    assert os.listdir(tmp_path / "cache" / "iwslt14") == []  # neither de-en.tgz nor de-en.tgz.part


def test_the_timeout_reaches_urlopen(tmp_path, monkeypatch):
    from fairseq_posenc.recipe import wmt_data

    seen = []

    def urlopen(url, timeout=None):
        seen.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(wmt_data.urllib.request, "urlopen", urlopen)
    archives = read_sources(os.path.join(RECIPE, "sources"))[0]
    with pytest.raises(wmt_data.DataError, match=r"\(nothing received for 7 s; DOWNLOAD_TIMEOUT=SECONDS waits"):
        wmt_data.fetch(archives, str(tmp_path), allow_download=True, timeout=7)
    monkeypatch.delenv("DOWNLOAD_TIMEOUT", raising=False)
    with pytest.raises(SystemExit):
        wmt_data.main(["fetch", "--sources", os.path.join(RECIPE, "sources"), "--raw-dir", str(tmp_path)])
    assert seen == [7, 60]
    monkeypatch.setenv("DOWNLOAD_TIMEOUT", "0")  # would not wait at all: refused before anything
    with pytest.raises(SystemExit) as stop:
        wmt_data.main(["fetch", "--sources", os.path.join(RECIPE, "sources"), "--raw-dir", str(tmp_path)])
    assert stop.value.code == 2 and seen == [7, 60]


def test_the_first_whole_download_is_recorded_and_a_cut_or_different_one_refused_with_one_line(tmp_path, server,
                                                                                                capsys):
    import hashlib

    write_archive(str(tmp_path / "one.tgz"), seed=1, talks=1, per_talk=30)
    write_archive(str(tmp_path / "two.tgz"), seed=2, talks=1, per_talk=30)
    whole, other = (tmp_path / "one.tgz").read_bytes(), (tmp_path / "two.tgz").read_bytes()
    cache = tmp_path / "cache"
    path, record = cache / "iwslt14" / "de-en.tgz", cache / "iwslt14" / "de-en.tgz.sha256"
    # a server that announces no length and stops early: nothing checks the size, the archive's end does
    server.body, server.length = whole[: len(whole) * 2 // 3], False
    code, out, err = _fetch(cache, server.url, capsys)
    assert code == 2 and not record.exists()
    assert err.strip().splitlines()[-1].startswith(f"wmt_data.py: error: {path} is incomplete or not an archive (")
    assert err.strip().endswith("a download cut short? delete it and run again (nothing was recorded for it)")
    # downloaded again whole: its sha256 and size recorded
    os.remove(path)
    server.body, server.length = whole, True
    code, out, err = _fetch(cache, server.url, capsys)
    sha = hashlib.sha256(whole).hexdigest()
    assert code == 0 and path.read_bytes() == whole
    assert f"| de-en.tgz: no published checksum; recorded sha256 {sha}, {len(whole)} bytes in {record}" in out
    assert record.read_text().split()[:2] == [sha, str(len(whole))]
    # the same archive: checked against the record, not downloaded
    code, out, err = _fetch(cache, server.url, capsys)
    assert code == 0 and "already there, not downloading" in out and "as recorded at its first use" in out
    # another archive at the URL (deleted, downloaded again): refused, one line naming both and the way out
    os.remove(path)
    server.body = other
    code, out, err = _fetch(cache, server.url, capsys)
    assert code == 2 and path.read_bytes() == other
    assert err.strip().splitlines()[-1] == (  # after the download's progress line
        f"wmt_data.py: error: {path}: sha256 {hashlib.sha256(other).hexdigest()}, {len(other)} bytes, but {record} "
        f"recorded {sha} {len(whole)} at its first use: another archive? delete {record} to accept this one")
