#!/usr/bin/env bash
# Evaluate a model trained by recipes/iwslt14_de_en/train.sh on the IWSLT'14 test set (dev2010,
# TEDX.dev2012, tst2010-2012: 6,750 sentences with fairseq's preparation): fairseq-generate
# --beam 5 --lenpen 1 (fairseq's example), then two lines appended to RESULTS, as the field reports
# IWSLT'14: tokenized BLEU on the lowercased tokens against the lowercased tokenized references
# (what fairseq-generate's own scorer prints on this corpus; no compound splitting) and SacreBLEU
# on the detokenized output, case-insensitive (-lc), against the raw references, with its signature.
#
#   ENC=sinusoidal bash recipes/iwslt14_de_en/evaluate.sh [--dry-run]
#
#   CHECKPOINT  average (default): the last AVERAGE (10) interval checkpoints averaged, as the
#               WMT recipes; best: checkpoint_best.pt (best by validation BLEU when train.sh ran
#               with EVAL_BLEU=1, as fairseq's example, else by validation loss). The results line
#               says which (avg=10, ckpt=best-by-bleu)
#   env: DATA, OUT, DEVICE, NUM_GPUS, DEVICE_FLAGS, AVERAGE, BEAM (5), LENPEN (1), LENPEN_FORM,
#        RESULTS (results/iwslt14_de_en.txt), GEN_FLAGS (appended to fairseq-generate)
set -euo pipefail
RECIPE=iwslt14_de_en
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_run_args "$@"
BEAM="${BEAM:-5}" LENPEN="${LENPEN:-1}"
SCORE_FLAGS="--lowercase"
load_corpus
set_training_defaults
evaluate_model
