# Training: one job per model (wildcards: the row's name and the seed), FLOATER's vanilla stage
# and control and distilled students included. The job's output is a record written once the
# checkpoint reached its budget (recipes/posenc_workflow/train_job.py); the checkpoints live in
# OUT/checkpoints/HASH, which Snakemake never deletes, so a job run again goes on from there.
from posenc_workflow import cluster, plan as plan_module, retention, train_config

_RESOLVED = {}


def resolved(model):
    """(fairseq's resolved configuration of the model's command, its hash)."""
    try:
        return STUDY.resolved(model)
    except wf.ConfigError as error:
        raise WorkflowError(f"configuration refused: {error}") from None


def _model(wildcards):
    return STUDY.model(wildcards.name, wildcards.seed)


def _same_as():
    """model key -> the earlier model of the study that it is (one resolved configuration, start,
    teacher and encoding: one checkpoint directory), computed once. Its job waits for that model's
    and finds the checkpoint at its budget: one training, never two in one directory at once. Two
    budgets for one directory are refused: the second would move the first's checkpoints."""
    if "same" not in _RESOLVED:
        first, same = {}, {}
        for model in STUDY.models:
            config, config_id = resolved(model)
            key = (config_id, model.start, model.teacher, model.encoding)
            if key in first:
                other = first[key]
                if train_config.budget(config) != train_config.budget(resolved(other)[0]):
                    raise WorkflowError(f"configuration refused: {other.key} and {model.key} resolve to one "
                                        "configuration with different budgets: they would train in one checkpoint "
                                        "directory")
                same[model.key] = other
            else:
                first[key] = model
        _RESOLVED["same"] = same
    return _RESOLVED["same"]


def _train_inputs(wildcards):
    model = _model(wildcards)
    inputs = {"data": STUDY.data_bin(), "scripts": scripts(f"{WORKFLOW_PY}/train_job.py")}
    if model.start:
        inputs["start"] = os.path.join(STUDY.model_dir(STUDY.model(model.start, model.seed)), "trained.json")
    if model.teacher:
        inputs["teacher"] = os.path.join(STUDY.model_dir(STUDY.model(model.teacher, model.seed)), "averaged.pt")
    if model.key in _same_as():
        inputs["same"] = os.path.join(STUDY.model_dir(_same_as()[model.key]), "trained.json")
    return inputs


def _budget_flags(wildcards):
    """The budget fairseq-train stops at, read from its resolved configuration (what the command's
    flags decide, train.flags included), for the job to check the checkpoint against."""
    max_update, max_epoch = train_config.budget(resolved(_model(wildcards))[0])
    return " ".join([f"--max-update {max_update}"] * bool(max_update) + [f"--max-epoch {max_epoch}"] * bool(max_epoch))


NODES = int(STUDY.train["nodes"])
GPU = STUDY.train["device"] == "gpu"

if workflow.is_main_process:
    # every model's configuration resolved now: a refused argument list or two rows of one model
    # fail the dry run, two models that would train in one directory with two budgets are
    # refused, and the plan is printed once a model
    try:
        STUDY.check_same_rows()
    except wf.ConfigError as error:
        raise WorkflowError(f"configuration refused: {error}") from None
    # --cores where the jobs run here; --jobs (nodes) where a profile or executor runs them
    plan_module.print_study_plan(STUDY, {m.key: resolved(m) for m in STUDY.models}, _same_as(),
                                 cores=workflow.resource_settings.cores, jobs=workflow.nodes,
                                 launch=cluster.launch_settings())
    _short = retention.unservable(STUDY, {m.key: resolved(m) for m in STUDY.models}, wf.code_key)
    if _short:
        raise WorkflowError(f"configuration refused: {retention.refusal(STUDY, _short)}")


rule train:
    input:
        unpack(_train_inputs),
    output:
        OUT + "/models/{name}/seed{seed}/trained.json",
    log:
        # the job's lines: where it trains, then the update, the budget and the time left at each of
        # fairseq's log lines (also on the console); fairseq's own log is checkpoints/train.log beside
        # it, the checkpoint directory linked there from the job's start
        OUT + "/models/{name}/seed{seed}/train.log",
    params:
        # fairseq-train's arguments: a param derived from the output, which Snakemake's params
        # trigger leaves out; what makes the model is config_id (the hash of fairseq's resolved
        # configuration, less what train_config.LEFT_OUT leaves out: logging, paths, which
        # checkpoints are kept), so that another log interval or evaluate.average trains nothing
        # again, and the dry run's reason is the hash while the plan names the fields that changed
        # (posenc_workflow/retention.py refuses an average the kept checkpoints cannot serve)
        command=lambda w, output: retention.split(STUDY.command(_model(w)))[0],
        keep=lambda w, output: " ".join(retention.split(STUDY.command(_model(w)))[1]),
        config_id=lambda w: resolved(_model(w))[1],
        code=lambda w: wf.code_key(_model(w).encoding),
        software=lambda w: json.dumps(wf.software_versions(), sort_keys=True),
        budget=_budget_flags,
        start=lambda w, input: f"--start {input.start}" if "start" in input.keys() else "",
        teacher=lambda w, input: f"--teacher {input.teacher}" if "teacher" in input.keys() else "",
        launcher=f"--launcher '{cluster.launcher(STUDY)}'" if NODES > 1 else "",
        root=STUDY.checkpoints_root(),
    wildcard_constraints:
        seed=r"\d+",
    threads: int(STUDY.train["threads"])
    resources:
        # the GPUs it holds where Snakemake runs the jobs itself: recipes/run.sh passes the machine's
        # count (--resources gpus=N), so that no more trainings and decodes run at once than there are
        # GPUs (SLURM gives each job its own: gres)
        gpus=int(STUDY.train["gpus_per_node"]) if GPU else 0,
        # several nodes: one job whose shell starts fairseq-train with srun, a task a node (fairseq
        # spawns a process per GPU); the SLURM executor reads nodes, tasks, mpi and gres
        nodes=NODES if NODES > 1 else None,
        tasks=NODES if NODES > 1 else None,
        mpi="srun" if NODES > 1 else None,
        tasks_per_gpu=0 if GPU else None,
        gres=f"gpu:{STUDY.train['gpus_per_node']}" if GPU else None,
        slurm_extra="--ntasks-per-node=1" if NODES > 1 else None,
    shell:
        "OMP_NUM_THREADS={threads} {PY} {WORKFLOW_PY}/train_job.py --record {output} --checkpoints {params.root} "
        "--config-id {params.config_id} --code {params.code} --software {params.software:q} --data {input.data} "
        "{params.start} {params.teacher} {params.budget} {params.launcher} "
        "--link $(dirname {output})/checkpoints -- fairseq-train {params.command:q} {params.keep} 2>&1 | tee {log}"
