#!/usr/bin/env bash
# The recipes' shared entry point: recipes/Snakefile with a corpus's configuration, study files
# after it, then Snakemake's own options (recipes/README.md).
#   bash recipes/run.sh CORPUS [STUDY.yaml...] [snakemake options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corpus=$1; shift
configs=("$ROOT/recipes/conf/$corpus.yaml")
while [ $# -gt 0 ] && [[ $1 == *.yaml ]]; do configs+=("$1"); shift; done
# the commands make install put in .venv (fairseq-train, snakemake), unless PATH has them first
[ -d "$ROOT/.venv/bin" ] && export PATH="$PATH:$ROOT/.venv/bin"
exec snakemake -s "$ROOT/recipes/Snakefile" --configfile "${configs[@]}" --rerun-incomplete --cores all "$@"
