"""recipes/README.md: at most 300 lines, a quick start of at most 40 with the three tasks'
commands, and a reference of the configuration keys equal to what recipes/conf/schema.yaml gives
(recipes/posenc_workflow/schema_doc.py)."""
import os
import re

import yaml

from posenc_workflow import schema_doc


def _readme():
    with open(schema_doc.README, encoding="utf-8") as f:
        return f.read()


def test_the_reference_is_the_schemas():
    assert schema_doc.current() == schema_doc.reference(), \
        "run: python recipes/posenc_workflow/schema_doc.py --update"
    # every key of the schema has its row, nested keys by their path
    with open(schema_doc.SCHEMA, encoding="utf-8") as f:
        schema = yaml.safe_load(f)
    for key in ("out", "corpus.sources", "corpus.toy.train_size", "train.nodes", "warm_start.second.max_epoch",
                "evaluate.lenpen_form", "report.bins"):
        assert f"| `{key}` |" in schema_doc.current()
    assert schema["properties"]["train"]["properties"]["nodes"]["default"] == 1


def test_the_readme_is_short_and_its_quick_start_gives_the_three_tasks():
    text = _readme()
    assert len(text.splitlines()) <= 300
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert len(quick.strip().splitlines()) <= 40
    assert "bash recipes/iwslt14_de_en/run.sh" in quick
    assert "recipes/conf/floater_table2.yaml recipes/conf/big_2x8.yaml" in quick and "--profile recipes/profiles/slurm" in quick
    assert "encodings: [sinusoidal, mine" in quick
    # every file a command names exists
    root = os.path.dirname(schema_doc.README)
    for path in set(re.findall(r"recipes/[a-z0-9_/.-]+\.(?:yaml|sh)", text)):
        assert os.path.exists(os.path.join(os.path.dirname(root), path)), path
