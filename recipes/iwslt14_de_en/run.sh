#!/usr/bin/env bash
# iwslt14_de_en: prepare, train, average, decode, score (recipes/conf/iwslt14_de_en.yaml; recipes/README.md).
#   bash recipes/iwslt14_de_en/run.sh [STUDY.yaml...] [snakemake options: -n, --config KEY=VALUE, --profile ...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" iwslt14_de_en "$@"
