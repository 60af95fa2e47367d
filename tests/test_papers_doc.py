"""docs/papers.md cannot rot: every recipe command it shows is the workflow's entry point with
study files that exist and --config values that the schema and the workflow accept, its rows
built as fairseq-train will build them; and the papers' tables each have their command.

tests/test_docs.py checks the flags and keys by name; here each command's whole configuration
(the corpus's file, the study files, the --config values, as Snakemake merges them) is checked
against recipes/conf/schema.yaml and turned into the workflow's models, in this process. The
dry run of every shipped configuration is tests/test_workflow.py's."""
import os

import pytest
import yaml

from fairseq_posenc.recipe import workflow as wf
from test_docs import REPO, _code_blocks, _split

PAPERS = os.path.join(REPO, "docs", "papers.md")
CONF = os.path.join(REPO, "recipes", "conf")


def recipe_commands():
    """(entry point, study files, --config items) of every recipe command in docs/papers.md."""
    found = []
    text = open(PAPERS, encoding="utf-8").read()
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            for tokens in _split(line):
                if len(tokens) >= 2 and tokens[0] == "bash" and tokens[1].startswith("recipes/"):
                    rest = tokens[2:]
                    files = []
                    while rest and rest[0].endswith(".yaml"):
                        files.append(rest.pop(0))
                    items = []
                    if "--config" in rest:
                        for item in rest[rest.index("--config") + 1:]:
                            if item.startswith("-"):
                                break
                            items.append(item)
                    found.append((tokens[1], tuple(files), tuple(items)))
    return found


COMMANDS = recipe_commands()


def configuration(script, files, items):
    """The configuration Snakemake would parse: the corpus's file, the study files, --config."""
    from snakemake.utils import update_config, validate

    corpus = script.split("/")[1]
    config = {}
    for path in [os.path.join(CONF, f"{corpus}.yaml"), *(os.path.join(REPO, f) for f in files)]:
        with open(path, encoding="utf-8") as f:
            update_config(config, yaml.safe_load(f))
    for item in items:
        key, _, value = item.partition("=")
        update_config(config, {key: yaml.safe_load(value)})
    validate(config, os.path.join(CONF, "schema.yaml"))
    return config


def test_papers_doc_shows_the_tables_commands():
    """The extraction finds what the page holds (a broken parser would check nothing)."""
    studies = {(script, files) for script, files, _ in COMMANDS}
    for corpus in ("wmt14_en_de", "wmt14_en_fr"):
        assert (f"recipes/{corpus}/run.sh", ("recipes/conf/floater_table2.yaml",)) in studies
        assert (f"recipes/{corpus}/run.sh", ("recipes/conf/floater_table2.yaml", "recipes/conf/big_2x8.yaml")) in studies
    assert ("recipes/wmt14_en_de/run.sh", ("recipes/conf/extrapolation.yaml",)) in studies
    assert ("recipes/wmt14_en_de/run.sh", ("recipes/conf/distillation.yaml",)) in studies
    pairs = {items for script, _, items in COMMANDS if script == "recipes/wmt18/run.sh"}
    assert len(pairs) == 4  # DIET's Table 4: four directions
    table3 = [items for _, _, items in COMMANDS if any(i.startswith("out=runs/vaswani_t3/") for i in items)]
    assert len(table3) == 17  # (A) 4, (C) 7, (D) 4, (E) 1, big 1


@pytest.mark.parametrize("index", range(len(COMMANDS)))
def test_every_command_is_a_configuration_the_workflow_accepts(index):
    script, files, items = COMMANDS[index]
    config = configuration(script, files, items)
    study = wf.Study(config)
    for model in study.models:
        command = study.command(model)
        assert command[0] == study.data_bin() and "--seed" in command
