# Training: one job per model (wildcards: the row's name and the seed), FLOATER's vanilla stage
# and control and distilled students included. The job's output is a record written once the
# checkpoint reached its budget (fairseq_posenc/recipe/train_job.py); the checkpoints live in
# OUT/checkpoints/HASH, which Snakemake never deletes, so a job run again goes on from there.
from fairseq_posenc.recipe import plan as plan_module, train_config

_RESOLVED = {}


def resolved(model):
    """(fairseq's resolved configuration of the model's command, its hash)."""
    if model.key not in _RESOLVED:
        try:
            config = train_config.resolve(STUDY.command(model), cache=wf.config_cache())
        except ValueError as error:
            raise WorkflowError(f"configuration refused: {model.key}: {error}") from None
        _RESOLVED[model.key] = (config, train_config.identity(config))
    return _RESOLVED[model.key]


def _model(wildcards):
    return STUDY.model(wildcards.name, wildcards.seed)


def _train_inputs(wildcards):
    model = _model(wildcards)
    inputs = {"data": STUDY.data_bin()}
    if model.start:
        inputs["start"] = os.path.join(STUDY.model_dir(STUDY.model(model.start, model.seed)), "trained.json")
    if model.teacher:
        inputs["teacher"] = os.path.join(STUDY.model_dir(STUDY.model(model.teacher, model.seed)), "averaged.pt")
    return inputs


def _budget_flags(wildcards):
    max_update, max_epoch = STUDY.budget(_model(wildcards))
    return " ".join([f"--max-update {max_update}"] * bool(max_update) + [f"--max-epoch {max_epoch}"] * bool(max_epoch))


NODES = int(STUDY.train["nodes"])
GPU = STUDY.train["device"] == "gpu"

if workflow.is_main_process:
    # every model's configuration resolved now: a refused argument list fails the dry run, two
    # models that would train in one directory are refused, and the plan is printed once a model
    _seen = {}
    for _m in STUDY.models:
        _config, _id = resolved(_m)
        _key = (_id, _m.start, _m.teacher, _m.encoding)
        if _key in _seen and STUDY.budget(_m) != STUDY.budget(_seen[_key]):
            raise WorkflowError(f"configuration refused: {_seen[_key].key} and {_m.key} resolve to one configuration "
                                "with different budgets: they would train in one checkpoint directory")
        _seen.setdefault(_key, _m)
    plan_module.print_study_plan(STUDY, {m.key: resolved(m) for m in STUDY.models})


rule train:
    input:
        unpack(_train_inputs),
    output:
        OUT + "/models/{name}/seed{seed}/trained.json",
    params:
        command=lambda w: STUDY.command(_model(w)),
        config_id=lambda w: resolved(_model(w))[1],
        code=lambda w: wf.code_key(_model(w).encoding),
        software=lambda w: json.dumps(wf.software_versions(), sort_keys=True),
        budget=_budget_flags,
        start=lambda w, input: f"--start {input.start}" if "start" in input.keys() else "",
        teacher=lambda w, input: f"--teacher {input.teacher}" if "teacher" in input.keys() else "",
        launcher=f"--launcher 'srun --nodes={NODES} --ntasks-per-node=1'" if NODES > 1 else "",
        root=STUDY.checkpoints_root(),
    wildcard_constraints:
        seed=r"\d+",
    threads: int(STUDY.train["threads"])
    resources:
        # several nodes: one job whose shell starts fairseq-train with srun, a task a node (fairseq
        # spawns a process per GPU); the SLURM executor reads nodes, tasks, mpi and gres
        nodes=NODES if NODES > 1 else None,
        tasks=NODES if NODES > 1 else None,
        mpi="srun" if NODES > 1 else None,
        tasks_per_gpu=0 if GPU else None,
        gres=f"gpu:{STUDY.train['gpus_per_node']}" if GPU else None,
        slurm_extra="--ntasks-per-node=1" if NODES > 1 else None,
    shell:
        "OMP_NUM_THREADS={threads} {PY} {RECIPE_PY}/train_job.py --record {output} --checkpoints {params.root} "
        "--config-id {params.config_id} --code {params.code} --software {params.software:q} --data {input.data} "
        "{params.start} {params.teacher} {params.budget} {params.launcher} "
        "--link $(dirname {output})/checkpoints -- fairseq-train {params.command:q}"
