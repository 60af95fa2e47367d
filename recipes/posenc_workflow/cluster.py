"""Where the study's jobs run on SLURM, from the study's ``cluster`` section (recipes/conf/schema.yaml):
each job's account, partition, time limit, memory and CPUs become its rule's resources
(:func:`apply`), so that the SLURM profile holds no resources of its own and an override on the
command line (``--set-resources train:runtime=1440``, ``--default-resources ...``) changes the one
key it names, not the rest. A resource given with --set-resources wins over the section's.
"""
import os
import sys
from typing import Dict, List, Optional

import yaml

from posenc_workflow.settings import schema

# minutes and MB of each rule that runs as a job (the training's minutes: cluster.train_minutes);
# rules not named here: OTHER
LIMITS = {"train": {"mem_mb": 64000},
          "decode": {"runtime": 240, "mem_mb": 32000},
          "average": {"runtime": 60, "mem_mb": 32000},
          "tokenize": {"runtime": 720, "mem_mb": 8000, "cpus_per_task": 16},
          "segment": {"runtime": 720, "mem_mb": 8000, "cpus_per_task": 16},
          "binarize": {"runtime": 240, "mem_mb": 8000, "cpus_per_task": 16}}
OTHER = {"runtime": 60, "mem_mb": 8000}
GPU_RULES = ("train", "decode")


def section(study) -> Dict[str, object]:
    """The study's cluster section, the schema's defaults under it (a Study made without the schema
    has none)."""
    fields = schema()["properties"]["cluster"]["properties"]
    return {**{k: v["default"] for k, v in fields.items()}, **(study.config.get("cluster") or {})}


def step_cpus(study, rule: str = "train") -> int:
    """The CPUs of a GPU job's step: cluster.cpus_per_gpu for each of its GPUs (a training's
    processes and data loaders), asked as --cpus-per-task so that the step srun inside the job
    gets them too (the SLURM plugin's step reads cpus_per_task, not --gres's GPUs)."""
    gpus = int(study.train["gpus_per_node"]) if rule == "train" else 1
    return int(section(study)["cpus_per_gpu"]) * gpus


def resources(study, rule: str) -> Dict[str, object]:
    """The SLURM resources of one rule's jobs."""
    gpu = study.train["device"] == "gpu" and rule in GPU_RULES
    out = dict(LIMITS.get(rule, OTHER))
    if rule == "train":
        out["runtime"] = int(section(study)["train_minutes"])
    if gpu:
        out["cpus_per_task"] = step_cpus(study, rule)
    partition = section(study)["gpu_partition" if gpu else "cpu_partition"]
    if partition:
        out["slurm_partition"] = partition
    if section(study)["account"]:
        out["slurm_account"] = section(study)["account"]
    return out


def apply(workflow, study):
    """Each job rule's resources from :func:`resources`, under what --set-resources gives."""
    given = workflow.resource_settings._parsed_overwrite_resources
    for rule in workflow.rules:
        if rule.name in workflow._localrules:
            continue
        for key, value in resources(study, rule.name).items():
            if key not in given.get(rule.name, {}):
                rule.resources[key] = value


def launcher(study) -> str:
    """What starts fairseq-train on several nodes: one task a node, each with the job's CPUs."""
    nodes = int(study.train["nodes"])
    if nodes < 2:
        return ""
    cpus = f" --cpus-per-task={step_cpus(study)}" if study.train["device"] == "gpu" else ""
    return f"srun --nodes={nodes} --ntasks-per-node=1{cpus}"


def launch_settings(argv: Optional[List[str]] = None, env=None) -> Dict[str, object]:
    """(from Snakemake's command line, where the Snakefile cannot ask Snakemake) whether a profile
    or executor runs the jobs, and the retries of each: --retries, else the profile's."""
    argv = list(sys.argv if argv is None else argv)
    env = os.environ if env is None else env

    def value(*names):
        for i, arg in enumerate(argv):
            for name in names:
                if arg == name and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(name + "="):
                    return arg.split("=", 1)[1]
        return None

    profile = value("--profile") or env.get("SNAKEMAKE_PROFILE")
    executor = value("--executor", "-e")
    retries = value("--retries", "--restart-times", "-T")
    if retries is None and profile:
        retries = _profile_setting(profile, "retries")
    return {"remote": bool(profile or (executor and executor not in ("local", "dryrun"))),
            "retries": int(retries or 0)}


def _profile_setting(profile: str, key: str):
    path = os.path.join(profile, "config.yaml")
    try:
        with open(path, encoding="utf-8") as f:
            return (yaml.safe_load(f) or {}).get(key)
    except OSError:
        return None


def time_warning(study, key: str, hours: Optional[float], retries: int) -> str:
    """One line where a training's estimated hours exceed its job's time limit times the tries."""
    limit = int(section(study)["train_minutes"])
    if not hours or hours * 60 <= limit * (retries + 1):
        return ""
    return (f"| plan: warning: {key}'s estimate ({hours:.0f} h) exceeds cluster.train_minutes {limit} x "
            f"{retries + 1} tries (retries {retries}): raise cluster.train_minutes (at most the partition's "
            "MaxTime) or --retries, or it stops unfinished")



def account_note(study) -> str:
    """One line where no account is set: the SLURM plugin then guesses one from sacct (a pipe it
    runs without a shell: often nothing, or every account at once), or the cluster's default."""
    if section(study)["account"]:
        return ""
    return ("| plan: no cluster.account: the SLURM plugin guesses one from sacct, else sbatch gets none (the "
            "cluster's default); set cluster.account in a file of your own (recipes/README.md, SLURM)")
