"""recipes/Snakefile with the stub fairseq-train of tests/helpers/stubs on the demo's toy corpus (no GPU,
no download): what Snakemake retrains, and what the training jobs record, refuse and share.

Each test copies one prepared toy corpus and runs the workflow's training targets in a fresh
Snakemake process, as a user would (recipes/run.sh's options)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

from helpers import snakemake_server
from helpers.snakemake_runs import DEMO, REPO, STUBS, STUDY, calls, ok, record, shipped, snakemake_call, study, target, updates
# Snakemake in a process kept warm (its imports paid once)
from helpers.snakemake_server import snakemake


def test_a_changed_setting_retrains_and_the_dry_run_names_the_flag_with_its_old_and_new_value(work):
    first = ok(snakemake(work, STUDY, target("sinusoidal")))
    # the plan, once per model, with its totals: the stub's budget on the toy corpus's real batches
    assert re.search(r"\| plan sinusoidal/seed1 \(configuration [0-9a-f]{12}\):", first)
    assert "|   ends at update 6 (" in first and "| plan total: 1 model(s), 1 to train, 6 updates, about " in first
    assert [c["to"] for c in calls(work)] == [6]
    rec = record(work, "sinusoidal")
    assert rec["updates"] == 6 and rec["budget"]["max_update"] == 6
    # what trained it is recorded with the model: the code's hash and the versions
    assert rec["keyed"]["code"] and rec["software"]["torch"] == torch.__version__
    assert os.path.realpath(os.path.join(work, "study/models/sinusoidal/seed1/checkpoints")) == \
        os.path.realpath(os.path.join(work, rec["checkpoints"]))
    changed = study(train__lr=0.006)
    # the two dry runs in one Snakemake process (helpers/snakemake_server.py)
    dry, changed_dry = (ok(proc) for proc in snakemake_server.runs(
        [snakemake_call(work, STUDY, target("sinusoidal"), "-n"),
         snakemake_call(work, changed, target("sinusoidal"), "-n", name="changed.yaml")]))
    assert dry.count("rule train") == 0
    # the plan's total counts what trains: nothing, beside Snakemake's nothing to be done
    assert "|   trained: study/models/sinusoidal/seed1/trained.json, with its configuration, code and data as they " \
        "are: not in the total\n| plan total: 1 model(s), nothing to train (1 trained)\n" in dry
    dry = changed_dry
    # Snakemake's reason: the configuration's hash, old and new, not the command
    reason = next(line for line in dry.splitlines() if "Params have changed" in line)
    ids = [re.search(r"\| plan sinusoidal/seed1 \(configuration ([0-9a-f]{12})\):", text).group(1) for text in (first, dry)]
    assert ids[0] != ids[1] and ids[0] in reason.split(" now: ")[0] and ids[1] in reason.split(" now: ")[1]
    assert "--lr" not in reason and len(reason) < 200
    # the plan names the flag that changed, with its old and new values
    assert "|   trains again, its configuration changed since study/models/sinusoidal/seed1/trained.json: " \
        "lr: [0.003] -> [0.006]\n| plan total: 1 model(s), 1 to train, 6 updates, about " in dry
    ok(snakemake(work, changed, target("sinusoidal")))
    # another configuration: another directory, trained from scratch; the first one is kept
    assert [(c["from"], c["to"]) for c in calls(work)] == [(0, 6), (0, 6)]
    assert record(work, "sinusoidal")["checkpoints"] != rec["checkpoints"]
    assert os.path.exists(os.path.join(work, rec["checkpoints"], "checkpoint_last.pt"))
    # a field the hash leaves out (logging) runs nothing again
    logging = study(train__lr=0.006, train__flags=["--log-interval", "7"])
    assert "Nothing to be done" in ok(snakemake(work, logging, target("sinusoidal"), "-n"))
    # a larger budget goes on from the last checkpoint, in the same directory
    ok(snakemake(work, study(train__lr=0.006, train__flags=["--log-interval", "7"], train__max_update=9),
                 target("sinusoidal")))
    assert [(c["from"], c["to"]) for c in calls(work)][-1] == (6, 9)
    # a smaller one than the directory holds is refused: its checkpoints are not this budget's
    proc = snakemake(work, study(train__lr=0.006, train__max_update=4), target("sinusoidal"))
    assert proc.returncode != 0 and "past this job's budget (update 4)" in proc.stdout + proc.stderr


def test_an_exit_0_before_the_budget_fails_the_job_and_writes_no_record(work):
    """Through recipes/run.sh, with a .yml study and a target right after it (its own --resources
    used to take the target): the training job's log (Snakemake's, and the console) gives the
    update, the budget and the time left at each of fairseq's log lines, and the study directory
    links to the checkpoints from the job's start, also when it fails."""
    config = study(train__flags=["--log-interval", "2"])
    with open(os.path.join(work, "study.yml"), "w") as f:
        yaml.safe_dump(config, f)
    env = {**os.environ, "PATH": f"{STUBS}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
           "STUB_LOG": os.path.join(work, "calls.jsonl"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "STUB_SECONDS_PER_UPDATE": "0.3", "STUB_STOP_AT": "4"}
    proc = subprocess.run(["bash", os.path.join(REPO, "recipes", "run.sh"), "demo", "study.yml", target("sinusoidal"),
                           "--cores", "1"], cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert "fairseq-train exited 0 but stopped at update 4 (epoch 0), before its budget (update 6)" in proc.stdout + proc.stderr
    assert "--stop-time-hours, --patience" in proc.stdout + proc.stderr
    assert not os.path.exists(os.path.join(work, target("sinusoidal")))
    link = os.path.join(work, "study", "models", "sinusoidal", "seed1", "checkpoints")
    assert "num_updates=4" in open(os.path.join(link, "train.log")).read()  # fairseq's log, from the study
    log = open(os.path.join(work, "study", "models", "sinusoidal", "seed1", "train.log")).read()
    lines = re.findall(r"^\| sinusoidal/seed1: (\d)/6 updates \((\d+)%\), (\d+)s in this run, about (\d+)s left$",
                       log, re.M)
    assert [(u, p) for u, p, _, _ in lines] == [("2", "33"), ("4", "67")]
    # the first line: the rest of the budget at the pace since the start (each rounded to 1 s)
    assert abs(int(lines[0][3]) - int(lines[0][2]) * 2) <= 1.01
    assert all(line in proc.stdout + proc.stderr for line in re.findall(r"^\| sinusoidal/seed1: .*$", log, re.M))
    # the next run goes on from update 4
    ok(snakemake(work, config, target("sinusoidal")))
    assert [(c["from"], c["to"]) for c in calls(work)] == [(0, 4), (4, 6)]


def test_the_progress_line_gives_the_update_the_budget_and_the_time_left_at_the_pace_since_the_first_line():
    from posenc_workflow.train_job import Progress

    def inner(epoch, step, steps, updates):  # fairseq-train's --log-format simple lines
        return (f"2026-11-28 01:26:57 | INFO | train_inner | epoch {epoch:03d}:  {step:5d} / {steps} loss=9.1, "
                f"nll_loss=9.0, ppl=512, wps=3000, ups=1.2, wpb=2500, bsz=100, num_updates={updates}, lr=0.0001")

    def valid(epoch, updates):
        return (f"2026-11-28 01:26:57 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | loss 7.619 | "
                f"num_updates {updates} | best_loss 6.7")

    progress = Progress("rope/seed2", 1000, None, None, began=0.0)
    assert progress.read("2026-11-28 | INFO | fairseq_cli.train | task: TranslationTask", now=20) == ""
    # at the first line, the pace since the start: 10% in 50 s, 90% in 450 s
    assert progress.read(inner(1, 100, 385, 100), now=50) == \
        "| rope/seed2: 100/1000 updates (10%), 50s in this run, about 7m30s left"
    # then since the first line (the start's import and data loading left out): 10% in 10 s
    assert progress.read(inner(1, 200, 385, 200), now=60) == \
        "| rope/seed2: 200/1000 updates (20%), 1m00s in this run, about 1m20s left"
    assert progress.read(valid(1, 200), now=61) == ""  # the same update once
    # an epoch budget, resumed after 1 of 10 epochs: 2% more of it in 100 s, 88% left
    progress = Progress("t5/seed1", None, 10, (385, 1), began=0.0)
    assert progress.read(inner(2, 77, 385, 462), now=100) == \
        "| t5/seed1: epoch 2/10 (12%), 1m40s in this run, about 1h13m left"


def test_a_run_killed_after_its_last_save_finishes_on_the_next_run_without_training(work):
    # the stub saves update 6 (the budget) of the vanilla stage, then kills Snakemake with itself
    config = study(models__encodings=["floater"], warm_start={"enabled": True, "start": "vanilla", "control": False,
                                                             "vanilla": {"max_update": 6, "max_epoch": None},
                                                             "second": {"max_update": 3, "max_epoch": None}})
    proc = snakemake(work, config, target("floater"),
                     env={"STUB_FAIL_AFTER": "6", "STUB_FAIL_IN": "checkpoints", "STUB_KILL_GROUP": "1"})
    assert proc.returncode != 0 and len(calls(work)) == 1 and calls(work)[0]["crashed"]
    assert not os.path.exists(os.path.join(work, target("vanilla")))
    # Snakemake's lock, left by the killed process, is lifted as its message says; then the run
    ok(snakemake(work, config, "--unlock"))
    out = ok(snakemake(work, config, target("floater")))
    assert "trained before to update 6" in out
    # the vanilla stage is not trained again; FLOATER starts from its best checkpoint
    floater = [c for c in calls(work) if not c.get("crashed")]
    vanilla = record(work, "vanilla")
    assert len(floater) == 1 and floater[0]["init"] == os.path.join(vanilla["checkpoints"], "checkpoint_best.pt")
    assert record(work, "floater")["updates"] == 3


def test_floaters_variants_share_one_vanilla_job_and_another_start_restarts_them(work):
    config = study(models__encodings=["floater", "floater:--position-blocks=input", "sinusoidal"],
                   warm_start={"enabled": True, "start": "vanilla", "vanilla": {"max_update": 5, "max_epoch": None},
                               "second": {"max_update": 3, "max_epoch": None}})
    # with the demo's flags the vanilla stage is the sinusoidal row's configuration with another
    # budget: another model, in a directory of its own (with the same budget: one, trained once)
    rows = json.loads(json.dumps(config))
    config["models"]["encodings"].remove("sinusoidal")
    targets = [target(name) for name in ("floater", "floater-position-blocks-input", "vanilla_continued")]
    # the two dry runs in one Snakemake process (helpers/snakemake_server.py)
    dry, second = (ok(proc) for proc in snakemake_server.runs(
        [snakemake_call(work, rows, "-n", name="rows.yaml"), snakemake_call(work, config, *targets, "-n")]))
    ids = dict(re.findall(r"^\| plan (\w+)/seed1 \(configuration ([0-9a-f]{12})\)", dry, re.M))
    assert ids["vanilla"] != ids["sinusoidal"] and "the same model as" not in dry
    dry = second
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1].split("Reasons")[0], re.M))
    assert stats["train"] == "4"  # one vanilla stage, two FLOATER rows, the control
    assert "| plan floater-position-blocks-input/seed1" in dry and "| plan vanilla/seed1" in dry
    ok(snakemake(work, config, *targets))
    trained = calls(work)
    vanilla = record(work, "vanilla")["checkpoints"]
    assert [os.path.basename(c["save_dir"]) for c in trained].count(os.path.basename(vanilla)) == 1
    starts = {c["init"] for c in trained if c["init"]}
    assert starts == {os.path.join(vanilla, "checkpoint_best.pt")} and len(trained) == 4
    control = next(c for c in trained if "--finetune-from-model" in c["argv"])
    assert control["argv"][control["argv"].index("--finetune-from-model") + 1] == \
        os.path.join(vanilla, "checkpoint_best.pt") and control["lr"] == "0.0015"
    assert all("--position-blocks" not in c["argv"] for c in trained if c["save_dir"].endswith(os.path.basename(vanilla)))
    # a longer vanilla stage goes on in its directory; the stages started from it start over from
    # its new best checkpoint (their hash holds the start's content), not from their old checkpoints
    config["warm_start"]["vanilla"]["max_update"] = 7
    dry = ok(snakemake(work, config, *targets, "-n"))
    # the plan counts all four: the vanilla stage's budget changed, the others start from it
    assert "|   trains again: its budget changed since study/models/vanilla/seed1/trained.json: max_update: 5 -> 7\n" \
        in dry and dry.count("|   trains again: its start vanilla/seed1 trains\n") == 3
    assert "| plan total: 4 model(s), 4 to train, " in dry
    ok(snakemake(work, config, *targets))
    again = calls(work)[len(trained):]
    assert [(c["from"], c["to"]) for c in again if c["init"] is None and "--finetune-from-model" not in c["argv"]] \
        == [(5, 7)]
    assert sorted((c["from"], c["to"]) for c in again if c["init"] or "--finetune-from-model" in c["argv"]) == \
        [(0, 3)] * 3


def test_two_models_of_one_configuration_and_budget_train_once_one_after_the_other(work):
    # the sinusoidal row and FLOATER's vanilla stage resolve to one model (one checkpoint
    # directory): with two jobs at once (-c2, a stub that takes its time) one trains, the other
    # waits for its record and finds the checkpoint at the budget
    config = study(models__encodings=["sinusoidal", "floater"],
                   warm_start={"enabled": True, "start": "vanilla", "control": False,
                               "vanilla": {"max_update": 6, "max_epoch": None},
                               "second": {"max_update": 2, "max_epoch": None}})
    dry = ok(snakemake(work, config, target("sinusoidal"), target("vanilla"), "-n"))
    assert "| plan vanilla/seed1: the same model as sinusoidal/seed1, trained once" in dry
    out = ok(snakemake(work, config, target("sinusoidal"), target("vanilla"), "-c2",
                       env={"STUB_SECONDS_PER_UPDATE": "0.3"}))
    assert [(c["from"], c["to"]) for c in calls(work)] == [(0, 6)]
    assert record(work, "vanilla")["checkpoints"] == record(work, "sinusoidal")["checkpoints"]
    assert "trained before to update 6" in out


def test_the_budget_is_the_one_fairseq_train_stops_at(work):
    # train.flags' --max-update comes after the study's: fairseq-train stops at 4, and so does the job
    config = study(train__flags=["--max-update", "4"])
    out = ok(snakemake(work, config, target("sinusoidal")))
    assert "|   ends at update 4 (" in out and [(c["from"], c["to"]) for c in calls(work)] == [(0, 4)]
    rec = record(work, "sinusoidal")
    assert rec["budget"]["max_update"] == 4 and rec["updates"] == 4


def test_a_training_of_several_nodes_without_srun_fails_in_one_line_before_fairseq_train(work):
    # on GPUs (train.device cpu trains in one process): the stand-in nvidia-smi's two
    nodes = study(train__nodes=2, train__device="gpu")
    assert "nodes=2, tasks=2, mpi=srun" in ok(snakemake(work, nodes, target("sinusoidal"), "-n"))
    # this machine's PATH less any directory that holds an srun (a SLURM login node's)
    path = os.pathsep.join(d for d in f"{STUBS}:{STUBS}/gpu:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
                           .split(":") if not os.path.exists(os.path.join(d, "srun")))
    proc = snakemake(work, nodes, target("sinusoidal"), env={"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert proc.returncode != 0 and "train_job.py: error: train.nodes > 1 starts fairseq-train with srun, which is " \
        "not on this machine: run the study on SLURM" in proc.stdout + proc.stderr
    assert not os.path.exists(os.path.join(work, target("sinusoidal")))
    assert not os.path.exists(os.path.join(work, "study", "checkpoints")) or not os.listdir(
        os.path.join(work, "study", "checkpoints"))
    # what needs no training still runs here: the corpus
    ok(snakemake(work, nodes, "corpus/data-bin", env={"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1"}))


def test_a_misspelled_encoding_is_refused_by_the_dry_run_before_any_job(work):
    # the two dry runs in one Snakemake process (helpers/snakemake_server.py)
    proc, flag = snakemake_server.runs([snakemake_call(work, study(models__encodings=["sinusoidal", "t6"]), "-n"),
                                      snakemake_call(work, study(train__flags=["--no-such-flag"]), "-n", name="flag.yaml")])
    assert proc.returncode != 0
    assert "configuration refused: models.encodings t6: 't6' is not a position encoding; choose one of " \
           "sinusoidal, learned" in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout + proc.stderr and not os.path.exists(os.path.join(work, "study"))
    # what else the parse refuses, the same code in this process (a Snakemake run costs seconds)
    from snakemake.utils import update_config, validate

    from posenc_workflow import workflow as wf_module  # (not "workflow": validate() looks that name up)

    def refused(changes):
        with open(DEMO) as f:
            config = yaml.safe_load(f)
        update_config(config, json.loads(json.dumps({**STUDY, **changes})))
        validate(config, os.path.join(REPO, "recipes", "conf", "schema.yaml"))
        with pytest.raises(wf_module.ConfigError) as error:
            wf_module.Study(config).check_same_rows()
        return str(error.value)

    assert "--alibi-encoder split would change nothing" in refused(
        {"models": {"encodings": ["sinusoidal:--alibi-encoder=split"]}})
    assert refused({"models": {"encodings": ["alibi", "alibi:--alibi-encoder=symmetric"]}}) == \
        "models.encodings alibi and alibi:--alibi-encoder=symmetric are the same model, 'alibi': fairseq resolves " \
        "them to one configuration"
    assert refused({"models": {"encodings": ["sinusoidal"], "baseline": "rope"}}).startswith(
        "models.baseline rope is not among models.encodings")
    assert refused({"train": {"encoding_flags": {"floatr": ["--floater-step", "0.1"]}}}).startswith(
        "train.encoding_flags floatr: 'floatr' is not a position encoding; choose among sinusoidal, learned")
    # the schema: train.tokens_per_second is a number, auto or null
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError, match="'fast' does not match '\\^auto\\$'"):
        refused({"train": {"tokens_per_second": "fast"}})
    # an argument fairseq-train refuses: its parser's own message, in the dry run
    assert flag.returncode != 0 and "fairseq-train would refuse its arguments" in flag.stdout + flag.stderr


def test_rows_that_differ_in_an_input_position_flag_the_encoding_decides_are_refused_by_the_dry_run(tmp_path):
    """none's model has no input positions with --no-token-positional-embeddings or without (the
    encoding drops them), learned's has learned ones with --encoder-learned-pos or without: one
    model each, trained twice and refused only by the report, before."""
    proc = snakemake(str(tmp_path), study(models__encodings=["none", "none:--no-token-positional-embeddings"]), "-n")
    refusal = [line for line in (proc.stdout + proc.stderr).splitlines() if "configuration refused" in line]
    assert proc.returncode != 0 and refusal == [
        "configuration refused: models.encodings none and none:--no-token-positional-embeddings are the same "
        "model, 'none': fairseq resolves them to one configuration"]
    assert "Job stats" not in proc.stdout + proc.stderr and not os.path.exists(tmp_path / "study")
    from posenc_workflow import workflow as wf_module

    config = shipped("demo", **{**STUDY, "models": {"encodings": ["learned", "learned:--encoder-learned-pos"]}})
    with pytest.raises(wf_module.ConfigError, match="^models.encodings learned and learned:--encoder-learned-pos "
                                                     "are the same model, 'learned'"):
        wf_module.Study(config).check_same_rows()


def test_wmt18s_pairs_write_apart_from_one_study_file():
    """recipes/conf/wmt18.yaml's out holds {corpus}: each pair its own directory, without an out= of
    its own (a pair sharing another's would retrain over its records); another field is refused."""
    from posenc_workflow import workflow as wf_module

    outs = {pair: wf_module.Study(shipped("wmt18", corpus={"pair": pair}), preflight=False).out
            for pair in ("en-de", "cs-en")}
    assert outs == {"en-de": "runs/wmt18_en_de", "cs-en": "runs/wmt18_cs_en"}
    assert wf_module.Study(shipped("wmt18", corpus={"pair": "cs-en"}), preflight=False).config["out"] == \
        "runs/wmt18_cs_en"  # what the report's title reads
    with pytest.raises(wf_module.ConfigError, match=r"out 'runs/\{pair\}': \{corpus\} is the only field"):
        wf_module.Study(shipped("wmt18", out="runs/{pair}"), preflight=False)


def test_the_schemas_choices_are_the_ones_the_workflow_knows():
    """The schema's enums of corpora, architectures and precisions are the workflow's tables, so
    that a corpus or size added on one side only is a failing test, not a KeyError at a job."""
    from fairseq_posenc.models.from_flags import MODEL_SIZES
    from posenc_workflow import workflow as wf_module

    with open(os.path.join(REPO, "recipes", "conf", "schema.yaml")) as f:
        props = yaml.safe_load(f)["properties"]
    assert set(props["corpus"]["properties"]["name"]["enum"]) == set(wf_module.CORPORA)
    archs = set(wf_module.ARCHS) | set(MODEL_SIZES)
    assert set(props["models"]["properties"]["arch"]["enum"]) == archs
    assert set(props["distillation"]["properties"]["arch"]["enum"]) == archs
    assert set(props["train"]["properties"]["precision"]["enum"]) == set(wf_module.PRECISION_FLAGS)


def test_distilled_students_are_base_width_whatever_the_teachers_arch():
    from posenc_workflow import train_config
    from posenc_workflow import workflow as wf_module

    study = wf_module.Study(shipped("wmt14_en_de", "distillation"), preflight=False)
    (teacher,) = [m for m in study.models if m.kind == "scratch"]
    (student,) = [m for m in study.models if m.kind == "distilled"]
    resolve = lambda m: train_config.resolve([a.replace("{teacher}", "t.pt") for a in study.command(m)])  # noqa: E731
    teacher_config, student_config = resolve(teacher), resolve(student)
    assert teacher_config["model.arch"] == "transformer_sinusoidal_wmt_en_de_big"
    assert teacher_config["model.encoder_embed_dim"] == 1024 and teacher_config["model.dropout"] == 0.3
    assert student_config["model.arch"] == "transformer_sinusoidal_wmt_en_de"
    assert (student_config["model.encoder_embed_dim"], student_config["model.decoder_embed_dim"]) == (512, 512)
    assert (student_config["model.encoder_layers"], student_config["model.decoder_layers"]) == (6, 2)
    assert student_config["model.dropout"] == 0.1 and student_config["optimization.lr"] == [7e-4]
    assert student_config["criterion._name"] == "relation_distillation"
    # distillation.arch, lr and dropout are the students' own
    study = wf_module.Study(shipped("wmt14_en_de", "distillation", distillation={"arch": "big", "dropout": 0.2}),
                            preflight=False)
    student = resolve(next(m for m in study.models if m.kind == "distilled"))
    assert student["model.encoder_embed_dim"] == 1024 and student["model.dropout"] == 0.2
    assert student["optimization.lr"] == [5e-4]


def test_the_checkpoints_averaged_are_the_ones_fairseq_train_keeps():
    from posenc_workflow import train_config
    from posenc_workflow import workflow as wf_module

    def kept(**evaluate):
        study = wf_module.Study(shipped("wmt14_en_de", evaluate=evaluate), preflight=False)
        config = train_config.resolve(study.command(study.models[0]))
        return {k.split(".")[1]: config[k] for k in ("checkpoint.no_epoch_checkpoints", "checkpoint.keep_last_epochs",
                                                      "checkpoint.keep_interval_updates")}

    assert kept(checkpoints="epoch", average=3) == {"no_epoch_checkpoints": False, "keep_last_epochs": 3,
                                                    "keep_interval_updates": 1}
    assert kept(checkpoints="update", average=4) == {"no_epoch_checkpoints": True, "keep_last_epochs": -1,
                                                     "keep_interval_updates": 4}


# every shipped configuration, as its run.sh or the README combines them
SHIPPED = {
    "demo": ["demo"],
    "iwslt14_de_en": ["iwslt14_de_en"],
    "wmt14_en_de": ["wmt14_en_de"],
    "wmt14_en_fr": ["wmt14_en_fr"],
    "wmt18": ["wmt18"],
    "extrapolation": ["wmt14_en_de", "extrapolation"],
    "floater_table2_big_2x8": ["wmt14_en_de", "floater_table2", "big_2x8"],
    "floater_table6": ["wmt14_en_de", "floater_table6"],
    "distillation": ["wmt14_en_de", "distillation"],
    "iwslt14_cpu": ["iwslt14_de_en", "iwslt14_cpu"],
    "length_generalisation": ["iwslt14_de_en", "length_generalisation"],
    "files": ["files"],  # with a study file naming toy files (the test writes them)
}


def test_the_dry_run_of_every_shipped_configuration_plans_its_jobs(tmp_path):
    conf = os.path.join(REPO, "recipes", "conf")
    shipped = {f[:-5] for f in os.listdir(conf) if f.endswith(".yaml") and f != "schema.yaml"}
    assert shipped == {name for names in SHIPPED.values() for name in names}
    calls = {}
    for name, files in SHIPPED.items():
        os.makedirs(tmp_path / name)
        studies = [os.path.join(conf, f + ".yaml") for f in files[1:]]
        if name == "files":
            from helpers.toy_archives import write_plain_pairs

            for part, count in (("train", 300), ("test", 20)):
                write_plain_pairs(str(tmp_path / name / part), count, "de", "en")
            with open(tmp_path / name / "mine.yaml", "w") as f:
                yaml.safe_dump({"corpus": {"pair": "de-en", "train": {"src": "train.de", "tgt": "train.en"},
                                           "test": {"mine": {"src": "test.de", "tgt": "test.en"}}}}, f)
            studies.append("mine.yaml")
        calls[name] = (["bash", os.path.join(REPO, "recipes", "run.sh"), files[0], *studies, "-n", "--cores", "1"], dict(
            cwd=tmp_path / name,
            # a machine of two GPUs (a stand-in nvidia-smi)
            env={**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
                 "PATH": f"{STUBS}/gpu:{os.environ['PATH']}:{os.path.dirname(sys.executable)}"}))
    # each run.sh as a user runs it, their Snakemake runs in one process (helpers/snakemake_server.py)
    procs = dict(zip(calls, snakemake_server.runs(list(calls.values()), timeout=600)))
    outs = {name: proc.stdout + proc.stderr for name, proc in procs.items()}
    for name, out in outs.items():
        assert procs[name].returncode == 0, f"{name}:\n{out[-3000:]}"
        stats = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1].split("Reasons")[0], re.M))
        models = len(re.findall(r"^\| plan \S+ \(configuration", out, re.M))
        assert int(stats["train"]) == models and "| plan total: " in out, name
    stats = {name: dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], re.M)) for name, out in outs.items()}
    assert stats["iwslt14_de_en"]["train"] == "9" and stats["iwslt14_de_en"]["length_report"] == "1"
    assert stats["demo"]["train"] == "11" and stats["demo"]["demo_report"] == "1"
    # Table 2: six rows, FLOATER's two sharing one vanilla stage; the extrapolation adds the control
    assert stats["floater_table2_big_2x8"]["train"] == "7" and stats["extrapolation"]["train"] == "6"
    assert stats["distillation"]["train"] == "2"
    # Table 6: FLOATER and three RNN forms (each its own label) from one vanilla stage
    assert stats["floater_table6"]["train"] == "5"
    # one download job per archive of the sources file (none is there)
    from posenc_workflow.wmt_data import read_sources

    archives = read_sources(os.path.join(REPO, "recipes", "wmt14_en_de", "sources"), "en", "de")[0]
    assert stats["wmt14_en_de"]["download"] == str(len(archives)) == "5"
    assert stats["extrapolation"]["length_split"] == "1"
    assert "nodes=2, tasks=2, mpi=srun" in outs["floater_table2_big_2x8"]
    # before anything is prepared, the plan's disk and GPU-hours are estimated from the corpus's
    # published size (at Vaswani et al.'s speed, the IWSLT model's assumed 25000 tokens a second)
    for name, out in outs.items():
        total = re.search(r"^\| plan total: .*$", out, re.M).group(0)
        assert (name in ("demo", "iwslt14_cpu", "length_generalisation")) != bool(re.search(
            r"of checkpoints, [\d.]+ GPU-hours \(estimated before the corpus is prepared\)$", total)), total
    # on a CPU, the hours of each model on it at the speed measured (recipes/conf/iwslt14_cpu.yaml), an afternoon
    cpu = yaml.safe_load(open(os.path.join(conf, "iwslt14_cpu.yaml")))
    times = re.findall(r"^\|   time: ([\d.]+) h on the CPU at ([\d,]+) target tokens a second", outs["iwslt14_cpu"], re.M)
    assert len(times) == len(cpu["models"]["encodings"]) == int(stats["iwslt14_cpu"]["train"])
    assert all(float(rate.replace(",", "")) == cpu["train"]["tokens_per_second"] for _, rate in times)
    total = float(re.search(r", ([\d.]+) h on the CPU, one model after another", outs["iwslt14_cpu"]).group(1))
    assert 2 <= total <= 6 and abs(total - sum(float(t) for t, _ in times)) <= 0.05 * len(times)
    assert "GPU" not in re.search(r"^\| plan total: .*$", outs["iwslt14_cpu"], re.M).group(0)
    # the length-generalisation study: its eight rows (randomized positions by name) on the short-to-long
    # split, at iwslt14_cpu.yaml's model, budget and speed, 2 h a row
    rows = re.findall(r"^\| plan (\S+)/seed1 \(configuration", outs["length_generalisation"], re.M)
    assert rows == ["sinusoidal", "sinusoidal-randomized-positions", "rope", "rope-randomized-positions", "xpos",
                    "alibi", "kerple", "fire"]
    assert stats["length_generalisation"]["length_split"] == "1" == stats["length_generalisation"]["length_report"]
    assert re.findall(r"^\|   time: ([\d.]+) h on the CPU", outs["length_generalisation"], re.M) == ["2.0"] * 8
    # a files corpus: its training pairs counted in the files (300 lines, less every 100th to validate)
    assert "(297 training pairs (counted in train.en: 300 lines, " in outs["files"]
    assert stats["files"]["gather"] == "1" and stats["files"]["decode"] == "3"
    # run here, at most two GPUs' jobs at once: a training or a decode holds one (the demo's none)
    assert all("--resources=gpus=2 -n" in out for out in outs.values())
    held = re.findall(r"^\s*resources: .*?gpus=(\d+)", outs["iwslt14_de_en"], re.M)
    assert held == ["1"] * 18 and set(re.findall(r"gpus=(\d+)", outs["demo"].split("--resources")[1])) == {"2", "0"}

