#!/usr/bin/env bash
# Train one model on a prepared WMT18 pair (DIET's setting: a 6-layer model, 250k updates by
# default here) with the "Scaling NMT" flags; see recipes/wmt14_en_de/train.sh for every variable.
#
#   ENC=diet_rel ARCH=base bash recipes/wmt18/train.sh --pair en-de [--dry-run]   (or PAIR=en-de)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
PAIR="${PAIR:-en-de}" PAIR_CHOICES=1
parse_run_args "$@"
. "$(dirname "${BASH_SOURCE[0]}")/pair.sh"
MAX_UPDATE="${MAX_UPDATE:-250000}"
load_corpus
set_training_defaults
train_model "$DATA/data-bin"
