"""The docs' recipe commands cannot rot: every one (docs/papers.md's tables, and those of
README.md, recipes/README.md and docs/*.md) is the workflow's entry point with study files that
exist and --config values that, parsed as Snakemake parses them (snakemake.cli.parse_config: a
nested value's leaves as strings) and read as the workflow reads them, the schema and the workflow
accept, their rows built as fairseq-train will build them; and the papers' tables each have
their command.

tests/docs/test_docs.py checks the flags and keys by name; here each command's whole configuration
(the corpus's file, the study files, the --config values, as Snakemake merges them) is checked
against recipes/conf/schema.yaml and turned into the workflow's models, in this process. The
dry run of every shipped configuration is tests/workflow/test_workflow.py's."""
import os

import pytest
import yaml

from fairseq_posenc.positions import POSITION_ENCODINGS
from posenc_workflow import workflow as wf
from helpers.doc_commands import DOCS, REPO, block_commands

PAPERS = "docs/papers.md"
CONF = os.path.join(REPO, "recipes", "conf")


def recipe_commands(doc):
    """(entry point, study files, --config items) of every recipe command in ``doc``."""
    found = []
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    for tokens in block_commands(text):
        if len(tokens) >= 2 and tokens[0] == "bash" and tokens[1].startswith("recipes/") \
                and tokens[1].endswith("/run.sh"):
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


COMMANDS = recipe_commands(PAPERS)
ALL = [(doc, command) for doc in DOCS for command in recipe_commands(doc)]


def configuration(script, files, items):
    """The configuration the workflow validates: the corpus's file, the study files (YAML), then
    --config as Snakemake's own parse_config reads it, then the workflow's reading of its strings
    (recipes/Snakefile: workflow.coerce)."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config, validate

    corpus = script.split("/")[1]
    config = {}
    for path in [os.path.join(CONF, f"{corpus}.yaml"), *(os.path.join(REPO, f) for f in files)]:
        if os.path.exists(path):  # a file of the reader's own (mine.yaml) is shown, not shipped
            with open(path, encoding="utf-8") as f:
                update_config(config, yaml.safe_load(f))
    update_config(config, parse_config(list(items)))
    with open(os.path.join(CONF, "schema.yaml"), encoding="utf-8") as f:
        config = wf.coerce(config, yaml.safe_load(f))
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


@pytest.mark.parametrize("doc, command", ALL, ids=[f"{doc}:{' '.join(c[1] + c[2])[-70:]}" for doc, c in ALL])
def test_every_command_is_a_configuration_the_workflow_accepts(doc, command):
    script, files, items = command
    config = configuration(script, files, items)
    if not all(spec.partition(":")[0] in POSITION_ENCODINGS for spec in config["models"]["encodings"]):
        return  # an encoding of the reader's own (README.md's "mine"): the schema's check only
    if config["corpus"]["name"] == "files" and not config["corpus"]["train"]:
        return  # the reader's own files (mine.yaml names them): the schema's check only
    study = wf.Study(config)
    for model in study.models:
        command = study.command(model)
        assert command[0] == study.data_bin() and "--seed" in command


def test_nested_config_values_are_read_as_the_schema_types_them():
    """Snakemake's --config gives a nested value's leaves as strings; the workflow reads them as
    the schema types them (and only there: a string field keeps its string)."""
    config = configuration("recipes/wmt14_en_de/run.sh", ("recipes/conf/distillation.yaml",), (
        'distillation={"relation_heads": 32, "relation_weight": 0.5, "relations": "1", "max_epoch": null}',
        'warm_start={"enabled": true}', 'train={"lr": 0.001, "max_update": 6, "dropout": "auto"}',
        'models={"encodings": ["floater"], "seeds": [1, 2]}', "out=runs/x"))
    d, train = config["distillation"], config["train"]
    assert (d["relation_heads"], d["relation_weight"], d["relations"], d["max_epoch"]) == (32, 0.5, "1", None)
    assert config["warm_start"]["enabled"] is True and config["models"]["seeds"] == [1, 2]
    assert (train["lr"], train["max_update"], train["dropout"]) == (0.001, 6, "auto")
    assert config["models"]["encodings"] == ["floater"] and config["out"] == "runs/x"
