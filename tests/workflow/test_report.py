"""recipes/posenc_workflow/report.py on a study's model directories as the workflow leaves them
(label.txt, trained.json, averaged.pt's stored configuration, score.txt, test.detok.txt): results.txt
names each row as the length report does, and the length report's bins and unit."""
import json
import os

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
