#!/usr/bin/env bash
# FLOATER's training protocol (Liu et al., 2020), over fairseq's CLI:
#   1. train a vanilla (sinusoidal) Transformer 30 epochs (the paper's Appendix B.2; MAX_EPOCH or
#      VANILLA_EPOCHS change it, MAX_UPDATE stops it earlier),
#   2. warm-start FLOATER from its best checkpoint (h's output layer and the initial states at
#      0: at first exactly the vanilla model) and train FLOATER_EPOCHS more epochs (10 for
#      En-De, 1 for En-Fr) at half the peak learning rate,
#   3. average the last AVERAGE (5, as the paper) interval checkpoints of stage 2.
#   With VANILLA_CONTINUED=1 also the control: the vanilla model trained on from the same
#   checkpoint with stage 2's schedule (lr, warmup, epochs, a fresh optimizer: fairseq's
#   --finetune-from-model) without FLOATER, into OUT/vanilla_continued, averaged the same way.
#   FLOATER's gain over its vanilla start mixes what FLOATER does with what the extra updates do;
#   its difference from the control is FLOATER's alone. The control costs as much as stage 2
#   (the plan prints it); 0 by default here, 1 in recipes/extrapolation/run.sh.
#
#   DATA_BIN=data/wmt14_en_de/data-bin OUT=runs/floater ARCH=base bash recipes/floater/train.sh [--dry-run]
#
#   --dry-run   print the plan of both stages (devices, batch, updates, checkpoints, averaging, disk)
#
# A re-run continues where it stopped: a finished stage is skipped, a stage with a larger budget
# resumes, and when the vanilla stage trained again, the FLOATER stage starts over from its new
# best checkpoint (OUT/*/stage.json records each stage; logs in OUT/vanilla/train.log and
# OUT/floater/train.log).
#   env: ENC (floater; rnn trains Table 6's RNN position encoders, --rnn-* flags in MODEL_FLAGS,
#        by the same protocol into OUT/vanilla and OUT/rnn), ARCH (base | big), LR (7e-4 base, 5e-4 big; FLOATER continues at LR / 2), MAX_UPDATE,
#        MAX_EPOCH (stage 1; VANILLA_EPOCHS is read as MAX_EPOCH), FLOATER_EPOCHS (10),
#        FLOATER_MAX_UPDATE, VANILLA_CONTINUED (0), WARMUP (4000), DROPOUT, MAX_TOKENS, UPDATE_FREQ (auto),
#        SAVE_INTERVAL_UPDATES (auto), AVERAGE (5), DEVICE, NUM_GPUS, DEVICE_FLAGS (see
#        recipes/wmt14_en_de/train.sh), MODEL_FLAGS / EXTRA_FLAGS (appended to both fairseq-train)
#        POSITION_BLOCKS=input (stage 2 only: FLOATER's biases at the first block of each stack,
#        Table 2's input-block row; default: every block)
set -euo pipefail
RECIPE=floater
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
DATA_BIN="${DATA_BIN:?set DATA_BIN to a fairseq-preprocess output directory}"
parse_run_args "$@"
ENC="${ENC:-floater}"  # or rnn: Table 6's RNN encoders, trained by the same protocol
MAX_EPOCH="${MAX_EPOCH:-${VANILLA_EPOCHS:-}}"
set_training_defaults
DATA_BIN_NAME="DATA_BIN=" train_warm_started "$DATA_BIN"  # recipes/floater/protocol.sh
