#!/usr/bin/env bash
# Evaluate on newstest2018 as DIET reports it (SacreBLEU, default signature; beam 10, lenpen 0.6
# here by default), plus tokenized BLEU (compound-split for a German target, en-de, only); lines
# appended to RESULTS (results/wmt18_<src>_<tgt>.txt). See recipes/wmt14_en_de/evaluate.sh for
# every variable. fairseq's --lenpen 0.6 divides by |Y|^0.6, not by GNMT's ((5+|Y|)/6)^0.6 of
# DIET's tensor2tensor decoding; LENPEN_FORM=gnmt decodes with the latter (fairseq_posenc/recipe/rerank.py).
#
#   ENC=diet_rel ARCH=base bash recipes/wmt18/evaluate.sh --pair en-de [--dry-run]   (or PAIR=en-de)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
PAIR="${PAIR:-en-de}" PAIR_CHOICES=1
parse_run_args "$@"
. "$(dirname "${BASH_SOURCE[0]}")/pair.sh"
BEAM="${BEAM:-10}"
load_corpus
set_training_defaults
evaluate_model
