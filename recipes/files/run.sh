#!/usr/bin/env bash
# Your own files: prepare, train, average, decode and score every named test set (recipes/conf/files.yaml;
# recipes/README.md, "Your own files").
#   bash recipes/files/run.sh STUDY.yaml [more STUDY.yaml...] [snakemake options: -n, --config KEY=VALUE, --profile ...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" files "$@"
