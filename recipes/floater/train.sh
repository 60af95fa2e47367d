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
warm_started "$ENC" || die "ENC=$ENC: this protocol trains floater or rnn"
NAME=FLOATER; [ "$ENC" = rnn ] && NAME=RNN
VANILLA_CONTINUED="${VANILLA_CONTINUED:-0}"
case "$VANILLA_CONTINUED" in 0|1) ;; *) die "VANILLA_CONTINUED must be 0 or 1, got '$VANILLA_CONTINUED'" ;; esac
MAX_EPOCH="${MAX_EPOCH:-${VANILLA_EPOCHS:-}}"
set_training_defaults
ls "$DATA_BIN"/dict.*.txt >/dev/null 2>&1 || die "no fairseq dictionary in DATA_BIN=$DATA_BIN: run fairseq-preprocess first"
HALF_LR=$("$PYTHON" -c "print(float('$LR') / 2)")
echo "== FLOATER protocol ($ARCH): vanilla at lr $LR, FLOATER at lr $HALF_LR, dropout $DROPOUT -> $OUT"
plan_training "$DATA_BIN"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "== --dry-run: nothing trained"; exit 0; fi
mkdir -p "$OUT"
[ "${FIRST_NODE:-1}" = 1 ] && printf 'TRAINED_MAX_UPDATE=%s\nTRAINED_MAX_EPOCH=%s\n' "$FLOATER_MAX_UPDATE" "$FLOATER_EPOCHS" > "$OUT/train.env"
mapfile -t settings < <(run_settings "$DATA_BIN")

scaling_nmt_flags

# stage 1 keeps checkpoint_best.pt, checkpoint_last.pt and its last interval checkpoint
echo "== 1/3 vanilla transformer_sinusoidal_$SUFFIX, lr $LR, ${MAX_EPOCH:+$MAX_EPOCH epochs / }${MAX_UPDATE:+$MAX_UPDATE updates }on $DEVICE_DESC -> $OUT/vanilla"
# shellcheck disable=SC2086
train_stage "$OUT/vanilla" "" "$MAX_UPDATE" "$MAX_EPOCH" "${settings[@]}" stage=vanilla -- \
  "$DATA_BIN" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_sinusoidal_$SUFFIX" --lr "$LR" \
  ${MAX_UPDATE:+--max-update $MAX_UPDATE} ${MAX_EPOCH:+--max-epoch $MAX_EPOCH} --keep-interval-updates 1 \
  $MODEL_FLAGS $EXTRA_FLAGS

echo "== 2/3 $NAME warm-started from $OUT/vanilla/checkpoint_best.pt, lr $HALF_LR, $FLOATER_EPOCHS epochs${FLOATER_MAX_UPDATE:+ / $FLOATER_MAX_UPDATE updates} on $DEVICE_DESC"
# shellcheck disable=SC2086
train_stage "$OUT/$ENC" "$OUT/vanilla" "$FLOATER_MAX_UPDATE" "$FLOATER_EPOCHS" "${settings[@]}" stage="$ENC" \
  "floater_lr=$HALF_LR" -- "$DATA_BIN" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_${ENC}_$SUFFIX" \
  --floater-init-from "$OUT/vanilla/checkpoint_best.pt" --lr "$HALF_LR" \
  --max-epoch "$FLOATER_EPOCHS" ${FLOATER_MAX_UPDATE:+--max-update $FLOATER_MAX_UPDATE} \
  --keep-interval-updates "$AVERAGE" $POSITION_BLOCK_FLAGS $MODEL_FLAGS $EXTRA_FLAGS

if [ "$VANILLA_CONTINUED" = 1 ]; then
  echo "== 2/3 control: the vanilla model trained on from $OUT/vanilla/checkpoint_best.pt with stage 2's schedule, without FLOATER"
  # shellcheck disable=SC2086
  train_stage "$OUT/vanilla_continued" "$OUT/vanilla" "$FLOATER_MAX_UPDATE" "$FLOATER_EPOCHS" "${settings[@]}" \
    stage=vanilla_continued "floater_lr=$HALF_LR" -- "$DATA_BIN" "${FAIRSEQ_FLAGS[@]}" \
    --arch "transformer_sinusoidal_$SUFFIX" --finetune-from-model "$OUT/vanilla/checkpoint_best.pt" --lr "$HALF_LR" \
    --max-epoch "$FLOATER_EPOCHS" ${FLOATER_MAX_UPDATE:+--max-update $FLOATER_MAX_UPDATE} \
    --keep-interval-updates "$AVERAGE" $MODEL_FLAGS $EXTRA_FLAGS
fi

[ "${FIRST_NODE:-1}" = 1 ] || exit 0  # the first node averages
for stage in "$ENC" $([ "$VANILLA_CONTINUED" = 1 ] && echo vanilla_continued); do
  echo "== 3/3 averaging the last $AVERAGE interval checkpoints -> $OUT/$stage/averaged_last$AVERAGE.pt"
  "$PYTHON" "$SCRIPTS/average_checkpoints.py" --inputs "$OUT/$stage" \
    --num-update-checkpoints "$AVERAGE" --output "$OUT/$stage/averaged_last$AVERAGE.pt"
done
