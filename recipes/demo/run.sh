#!/usr/bin/env bash
# make demo: the workflow with recipes/conf/demo.yaml (toy pair, every encoding, 2 CPU cores).
#   bash recipes/demo/run.sh [STUDY.yaml...] [snakemake options]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" demo "$@"
