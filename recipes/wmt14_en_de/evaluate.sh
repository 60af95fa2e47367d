#!/usr/bin/env bash
# Evaluate a trained model on newstest2014: average the last 5 (base) or 20 (big) interval
# checkpoints, fairseq-generate --beam 4 --lenpen 0.6, then SacreBLEU on detokenized output (with
# its signature) and tokenized BLEU with compound splitting; both lines appended to RESULTS.
# fairseq's --lenpen 0.6 divides by |Y|^0.6, not by GNMT's ((5+|Y|)/6)^0.6 that Vaswani et al.
# used; LENPEN_FORM=gnmt decodes with the latter (n-best list reranked, fairseq_posenc/recipe/rerank.py).
#
#   ENC=sinusoidal ARCH=base bash recipes/wmt14_en_de/evaluate.sh [--dry-run]
#
# It refuses a run whose last checkpoint did not reach what train.sh was asked for
# (ALLOW_UNFINISHED=1 scores it anyway, its results lines marked UNFINISHED). --dry-run checks
# the run and prints what would be averaged and decoded, on which device.
#
#   env: DATA, OUT, DEVICE, NUM_GPUS, DEVICE_FLAGS (as train.sh: --bf16 decodes in bf16, --fp16
#        and --memory-efficient-fp16 in fp16, --amp in fp32, DEVICE=cpu on the CPU), AVERAGE,
#        BEAM (4), LENPEN (0.6), LENPEN_FORM (fairseq; or gnmt), RESULTS (results/wmt14_en_de.txt), GEN_FLAGS (appended to fairseq-generate)
set -euo pipefail
RECIPE=wmt14_en_de
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_run_args "$@"
load_corpus
set_training_defaults
evaluate_model
