#!/usr/bin/env bash
# Train one model on the prepared WMT14 En-De corpus with the "Scaling NMT" flags (Adam 0.9/0.98,
# inverse-sqrt, 4000 warmup, label smoothing 0.1; base: lr 7e-4, dropout 0.1, 100k updates;
# big: lr 5e-4, dropout 0.3, 300k updates; ~32k tokens per update on any GPU count; fp16).
#
#   ENC=sinusoidal ARCH=base bash recipes/wmt14_en_de/train.sh [--dry-run]
#
# It first prints the plan (fairseq_posenc/recipe/plan.py: device, tokens per update, updates per epoch,
# where each stage ends, which checkpoints are averaged, disk) and refuses a plan whose averaging
# cannot work; --dry-run stops there.
#
#   ENC    any --position-encoding (sinusoidal, learned, none, diet_abs, diet_rel, shaw, t5, rope,
#          alibi, floater): the plugin's transformer_${ENC}_wmt_en_de[_big] architecture.
#          ENC=floater runs FLOATER's warm-start protocol (recipes/floater/train.sh; FLOATER_EPOCHS
#          10, FLOATER_MAX_UPDATE; the vanilla stage 30 epochs, VANILLA_EPOCHS).
#   ARCH   base | big
#   POSITION_BLOCKS  all | input (--position-blocks; FLOATER's Table 2): the position encoder at
#          every block or at the first block of each stack only. sinusoidal and learned default to
#          input, floater to all; the other form gets its own OUT (runs/wmt14_en_de/$ENC-$POSITION_BLOCKS-$ARCH)
#   env: DATA (data/wmt14_en_de), OUT (runs/wmt14_en_de/$ENC-$ARCH), LR, DROPOUT, WARMUP (4000),
#        MAX_TOKENS (4096 per GPU), UPDATE_FREQ (auto: ~32k tokens an update on any GPU count),
#        MAX_UPDATE, MAX_EPOCH, SAVE_INTERVAL_UPDATES (1250 base, 600 big), AVERAGE (checkpoints
#        kept and averaged: 5 base, 20 big, 5 for FLOATER), NUM_GPUS (auto: what torch sees),
#        DEVICE (cpu to train on the CPU: refused otherwise when no GPU is visible),
#        DEVICE_FLAGS (--fp16 default, --bf16, --amp, --memory-efficient-fp16),
#        MODEL_FLAGS / EXTRA_FLAGS (appended to fairseq-train)
set -euo pipefail
RECIPE=wmt14_en_de
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_run_args "$@"
load_corpus
set_training_defaults
train_model "$DATA/data-bin"
