#!/usr/bin/env bash
# wmt14_en_fr: prepare, train, average, decode, score (recipes/conf/wmt14_en_fr.yaml; recipes/README.md).
#   bash recipes/wmt14_en_fr/run.sh [STUDY.yaml...] [snakemake options: -n, --config KEY=VALUE, --profile ...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" wmt14_en_fr "$@"
