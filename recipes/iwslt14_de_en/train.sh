#!/usr/bin/env bash
# Train one model on the prepared IWSLT'14 De-En corpus with fairseq's IWSLT example's settings:
# transformer_<ENC>_iwslt_de_en (d 512, ffn 1024, 4 heads, 6 + 6 layers), Adam (0.9, 0.98) with
# its default eps, inverse-sqrt from 0 over 4000 warmup updates, lr 5e-4, dropout 0.3, weight
# decay 1e-4, label smoothing 0.1, separate dictionaries with --share-decoder-input-output-embed,
# 4096 tokens an update (one GPU at update-freq 1; on N GPUs 4096/N each), fp32. fairseq's README
# names no stopping point: 50k updates here, Wu et al.'s IWSLT'14 budget (2019), checkpoints
# every 1000 updates, the last 10 kept for evaluate.sh to average.
#
#   ENC=sinusoidal bash recipes/iwslt14_de_en/train.sh [--dry-run]
#
# It first prints the plan (updates per epoch, the checkpoints averaged, disk, and the expected
# time on one GPU at TOKENS_PER_SECOND, an assumption); --dry-run stops there.
#
#   ENC    any --position-encoding (sinusoidal, learned, none, diet_abs, diet_rel, shaw, t5, rope,
#          alibi, floater): transformer_${ENC}_iwslt_de_en
#   EVAL_BLEU=1  select checkpoint_best.pt by validation BLEU decoded in process (fairseq's
#          example; beam EVAL_BEAM, 5): evaluate.sh CHECKPOINT=best scores it
#   env: DATA (data/iwslt14_de_en), OUT (runs/iwslt14_de_en/$ENC-iwslt), ARCH (iwslt; base and big
#        work too), LR, DROPOUT, WARMUP, WEIGHT_DECAY, MAX_TOKENS / UPDATE_FREQ (auto: 4096 tokens an
#        update), MAX_UPDATE (50000), MAX_EPOCH, SAVE_INTERVAL_UPDATES (1000), AVERAGE (10),
#        TOKENS_PER_SECOND (25000, the plan's time assumption), DEVICE, NUM_GPUS, DEVICE_FLAGS
#        (empty: fp32; --fp16 to go faster than the example), MODEL_FLAGS / EXTRA_FLAGS
set -euo pipefail
RECIPE=iwslt14_de_en
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_run_args "$@"
load_corpus
set_training_defaults
train_model "$DATA/data-bin"
