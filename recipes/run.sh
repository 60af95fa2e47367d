#!/usr/bin/env bash
# The recipes' shared entry point: recipes/Snakefile with a corpus's configuration, study files
# after it, then Snakemake's own options (recipes/README.md).
#   bash recipes/run.sh CORPUS [STUDY.yaml|.yml...] [snakemake options and targets, in any order]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corpus=$1; shift
configs=("$ROOT/recipes/conf/$corpus.yaml")
while [ $# -gt 0 ] && [[ $1 == *.yaml || $1 == *.yml ]]; do configs+=("$1"); shift; done
# the commands make install put in .venv (fairseq-train, snakemake), unless PATH has them first
[ -d "$ROOT/.venv/bin" ] && export PATH="$PATH:$ROOT/.venv/bin"
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
