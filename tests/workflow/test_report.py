"""recipes/posenc_workflow/report.py on a study's model directories as the workflow leaves them
(label.txt, trained.json, averaged.pt's stored configuration, score.txt, test.detok.txt): results.txt
names each row as the length report does, and the length report's bins and unit."""
import json
import os

import pytest
import torch

from posenc_workflow import report, scoring

WHAT = "files_de_en de-en seed=1 arch=iwslt {test} beam=5 lenpen=1 lenpen_form=fairseq avg=10"


def _model(directory, label, encoder_layers, test, score=True):
    """A model's directory: its label, record, averaged checkpoint (the stored configuration only)
    and, with ``score``, its score lines written by scoring.py as the rule score writes them."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "label.txt"), "w") as f:
        f.write(label + "\n")
    with open(os.path.join(directory, "trained.json"), "w") as f:
        json.dump({"keyed": {"config": "c", "code": "k", "data": "d"}}, f)
    torch.save({"cfg": {"model": {"_name": "transformer_sinusoidal_iwslt_de_en", "encoder_layers": encoder_layers,
                                  "dropout": 0.3}, "dataset": {"max_tokens": 4096}}},
               os.path.join(directory, "averaged.pt"))
    if score:
        generation = os.path.join(directory, "test.txt")
        with open(generation, "w") as f:
            f.write("S-0\tein Haus .\nT-0\ta house .\nH-0\t-0.5\ta house .\nD-0\t-0.5\ta house .\nP-0\t-0.5\n")
        scoring.main(["score", "--generation", generation, "--lang", "en", "--label",
                      f"enc={label} {WHAT.format(test=test)}", "--results", os.path.join(directory, "score.txt")])
    return str(directory)


def _fields(line):
    """A score line less its time stamp."""
    return line.split(" | ", 1)[1]


def test_results_name_two_rows_of_one_label_by_what_differs_as_the_length_report_does(tmp_path, capsys):
    # models.encodings [sinusoidal, "sinusoidal:--encoder-layers=1"]: two rows whose label is sinusoidal;
    # the corpus's test set beside the models, a named one under tests/tst
    rows = {"sinusoidal": 6, "sinusoidal-encoder-layers-1": 1}
    models = [_model(tmp_path / "study" / "models" / row / "seed1", "sinusoidal", layers, "split-long-pairs")
              for row, layers in rows.items()]
    named = [_model(tmp_path / "study" / "tests" / "tst" / row / "seed1", "sinusoidal", layers, "tst")
             for row, layers in rows.items()]
    out = tmp_path / "study" / "results.txt"
    capsys.readouterr()
    report.main(["results", "--models", *models, *named, "--out", str(out)])
    lines = out.read_text().splitlines()
    assert capsys.readouterr().out.splitlines() == lines
    sacrebleu = "| 1 sentences | SacreBLEU 0.00 (detokenized) | nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"
    expected = [f"enc={name} {WHAT.format(test=test)} {sacrebleu}"
                for test in ("split-long-pairs", "tst") for name in ("sinusoidal", "sinusoidal (--encoder-layers 1)")]
    assert [_fields(line).rpartition("|version:")[0] for line in lines[::2]] == expected
    assert [_fields(line).split(" | ")[0] for line in lines[1::2]] == [e.split(" | ")[0] for e in expected]
    # the names the length report gives the same rows
    assert list(report.labelled(models)) == ["sinusoidal", "sinusoidal (--encoder-layers 1)"]


# a split's decodes in subwords (no --remove-bpe): S- lines of 3, 6 and 3 subwords, 2, 4 and 3 words
SOURCES = ["Ha@@ us .", "ein gro@@ ß@@ es Haus .", "ein Haus ."]


def _length_report(tmp_path, report_settings):
    """report.py length of one model decoded in a split's subwords, under ``report_settings``: its
    JSON's unit and sentences a bin."""
    model = _model(tmp_path / "study" / "models" / "sinusoidal" / "seed1", "sinusoidal", 6, "split", score=False)
    with open(os.path.join(model, "test.detok.txt"), "w") as f:
        f.writelines(f"S-{i}\t{s}\nT-{i}\ta house .\nH-{i}\t-0.5\ta house .\n" for i, s in enumerate(SOURCES))
    open(os.path.join(model, "test.log"), "w").close()
    study = {"out": "study", "corpus": {"name": "files", "bpe": "subword-nmt"},
             "split": {"train_below": 3, "bins": [3, 5], "unit": "subwords"},
             "models": {"encodings": ["sinusoidal"], "seeds": [1], "baseline": None},
             "report": {"bins": None, "unit": "words", "title": "", **report_settings}}
    with open(tmp_path / "study.json", "w") as f:
        json.dump(study, f)
    report.main(["length", "--study", str(tmp_path / "study.json"), "--models", model,
                 "--out", str(tmp_path / "bleu_by_length")])
    saved = json.load(open(tmp_path / "bleu_by_length.json"))
    return saved["unit"], {b["bin"]: b["sentences"] for b in saved["bins"]}


def test_under_a_split_the_length_report_takes_report_bins_with_report_unit_as_a_pair(tmp_path):
    # report.bins given: they and report.unit (words), the subwords of the split's decodes joined into words
    assert _length_report(tmp_path, {"bins": [1, 3], "unit": "words"}) == ("words", {"[1,3)": 1, "[3,inf)": 2})
    # report.bins not given: split.bins in split.unit, whatever report.unit's default (words)
    assert _length_report(tmp_path, {}) == ("subwords", {"[3,5)": 2, "[5,inf)": 1})


def test_report_unit_subwords_is_refused_where_the_decodes_are_words():
    from helpers.snakemake_runs import shipped
    from posenc_workflow.workflow import ConfigError, Study

    with pytest.raises(ConfigError) as refusal:
        Study(shipped("iwslt14_de_en", report={"unit": "subwords"}), preflight=False)
    assert str(refusal.value) == (
        "report.unit subwords: the decoded sources are words here (no split in subwords: decoded with "
        "--remove-bpe); set report.unit words, or split.unit subwords")
    # a split in subwords decodes in subwords: its report may count them
    Study(shipped("wmt14_en_de", "extrapolation", report={"bins": [1, 10], "unit": "subwords"}), preflight=False)
