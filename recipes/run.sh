#!/usr/bin/env bash
# The recipes' shared entry point: recipes/Snakefile with a corpus's configuration, then the study
# files (in order) and Snakemake's own options and targets, in any order (recipes/README.md).
#   bash recipes/run.sh CORPUS [STUDY.yaml|.yml...] [snakemake options and targets, in any order]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corpus=$1; shift
# the commands make install put in .venv (fairseq-train, snakemake), unless PATH has them first
[ -d "$ROOT/.venv/bin" ] && export PATH="$PATH:$ROOT/.venv/bin"
snakemake=$(command -v snakemake) || { echo "run.sh: no snakemake on PATH: run make install" >&2; exit 1; }
# the Python that runs snakemake (its yaml, its parser) picks the study files out: an existing
# *.yaml/*.yml that is no option's value (--profile p.yaml, --configfile c.yaml); a syntax error stops here
py=$(sed -n '1s/^#![[:space:]]*//p' "$snakemake")
[[ -x $py && $py == *python* ]] || py="$(dirname "$snakemake")/python"
[ -x "$py" ] || py=python3
positions=" $("$py" "$ROOT/recipes/posenc_workflow/run_args.py" "$@") "
configs=("$ROOT/recipes/conf/$corpus.yaml") rest=() i=0
for arg in "$@"; do
  if [[ $positions == *" $i "* ]]; then configs+=("$arg"); else rest+=("$arg"); fi
  i=$((i + 1))
done
set -- ${rest[@]+"${rest[@]}"}
# jobs run here (no --profile or --executor): as many trainings and decodes at once as there are
# GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi; a job holds its train.gpus_per_node); another
# --resources gpus=N after these options overrides it
resources=()
if [[ " $* " != *" --profile"* && " $* " != *" --executor"* && " $* " != *" -e "* ]]; then
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    gpus=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .) || true
  else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || true
  fi
  # one word (--resources=gpus=N): the spaced form takes every word after it, a target included
  resources=("--resources=gpus=${gpus:-0}")
fi
exec snakemake -s "$ROOT/recipes/Snakefile" --configfile "${configs[@]}" --rerun-incomplete --cores all \
  "${resources[@]}" "$@"
