#!/usr/bin/env bash
# wmt18: prepare, train, average, decode, score (recipes/conf/wmt18.yaml; recipes/README.md).
#   bash recipes/wmt18/run.sh [STUDY.yaml...] [snakemake options: -n, --config KEY=VALUE, --profile ...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" wmt18 "$@"
