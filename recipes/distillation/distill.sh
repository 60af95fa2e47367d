#!/usr/bin/env bash
# Compress a trained teacher into a smaller, faster student with MiniLMv2 self-attention
# relation distillation (label-smoothed cross-entropy + relation loss), then average.
#
#   ENC=sinusoidal ARCH=big bash recipes/wmt14_en_de/train.sh && ENC=sinusoidal ARCH=big bash recipes/wmt14_en_de/evaluate.sh
#   DATA=data/wmt14_en_de TEACHER=runs/wmt14_en_de/sinusoidal-big/averaged_last20.pt \
#     bash recipes/distillation/distill.sh [--dry-run]
#   OUT=runs/wmt14_en_de/distilled-sinusoidal ENC=sinusoidal AVERAGE=5 bash recipes/wmt14_en_de/evaluate.sh
#
# It prints the plan first (fairseq_posenc/recipe/plan.py: device, the world of every node, tokens per
# update, updates per epoch, the interval checkpoints averaged, disk) and refuses one that
# cannot work; --dry-run stops there. The student trains with the Scaling NMT flags of the other
# recipes (~32k tokens an update on any GPU count, fp16 on GPUs, a checkpoint every
# SAVE_INTERVAL_UPDATES, the last AVERAGE kept), then the last AVERAGE are averaged into
# OUT/averaged_lastAVERAGE.pt. A re-run resumes or skips as train.sh does; several nodes as
# train.sh (recipes/README.md: "Several nodes").
#
# The student may use any encoding (ENC), depth, width and head count; teacher and student
# share the dictionaries and RELATION_HEADS, which must divide both attention widths.
#   env: DATA (a corpus prepare.sh wrote; default data/wmt14_en_de) or DATA_BIN (any
#        fairseq-preprocess output), TEACHER (the teacher checkpoint), OUT
#        (runs/RECIPE/distilled-ENC), ENC (sinusoidal), STUDENT_FLAGS (--encoder-layers 6
#        --decoder-layers 2: a base-width student with a shallow decoder), RELATION_HEADS (64),
#        RELATIONS (qq,kk,vv), RELATION_WEIGHT (1.0), MAX_EPOCH (30) or MAX_UPDATE, AVERAGE (5),
#        and LR, DROPOUT, WARMUP, MAX_TOKENS, UPDATE_FREQ, SAVE_INTERVAL_UPDATES, DEVICE,
#        NUM_GPUS, DEVICE_FLAGS, EXTRA_FLAGS as recipes/wmt14_en_de/train.sh
set -euo pipefail
RECIPE=distillation
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_run_args "$@"
if [ -n "${DATA_BIN:-}" ]; then
  ls "$DATA_BIN"/dict.*.txt >/dev/null 2>&1 || die "no fairseq dictionary in DATA_BIN=$DATA_BIN: run fairseq-preprocess first"
else
  DATA="${DATA:-data/wmt14_en_de}"
  [ -f "$DATA/corpus.env" ] || die "no prepared corpus in DATA=$DATA ($DATA/corpus.env missing): run a recipes/*/prepare.sh first, or set DATA_BIN"
  load_corpus  # RECIPE becomes the corpus's: its defaults, and runs/RECIPE/ for OUT
  DATA_BIN="$DATA/data-bin"
fi
TEACHER="${TEACHER:?set TEACHER to the teacher checkpoint (e.g. runs/wmt14_en_de/sinusoidal-big/averaged_last20.pt)}"
[ -f "$TEACHER" ] || die "no teacher checkpoint at TEACHER=$TEACHER"
ENC="${ENC:-sinusoidal}"                                 # the student's position encoding
ARCH="${ARCH:-base}"                                     # the student's width (STUDENT_FLAGS can narrow it)
STUDENT_FLAGS="${STUDENT_FLAGS:---encoder-layers 6 --decoder-layers 2}"
RELATION_HEADS="${RELATION_HEADS:-64}"                   # MiniLMv2: 48 (base) / 64 (large); must divide the widths
RELATIONS="${RELATIONS:-qq,kk,vv}"
RELATION_WEIGHT="${RELATION_WEIGHT:-1.0}"
[ -n "${MAX_UPDATE:-}" ] || MAX_EPOCH="${MAX_EPOCH:-30}"
AVERAGE="${AVERAGE:-5}"
OUT="${OUT:-runs/$RECIPE/distilled-$ENC}"
MODEL_FLAGS="$STUDENT_FLAGS${MODEL_FLAGS:+ $MODEL_FLAGS}"  # the plan's disk estimate counts the student's layers
set_training_defaults

echo "== distilling $TEACHER into a transformer_${ENC}_$SUFFIX student ($STUDENT_FLAGS) -> $OUT"
plan_training "$DATA_BIN"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "== --dry-run: nothing trained (device flags: ${TRAIN_DEVICE_FLAGS:-none})"; exit 0; fi
mkdir -p "$OUT"
mapfile -t settings < <(run_settings "$DATA_BIN")
scaling_nmt_flags
# the Scaling NMT flags with the relation distillation criterion in place of label smoothing's
# (it is label-smoothed cross-entropy plus the relation loss)
for i in "${!FAIRSEQ_FLAGS[@]}"; do
  [ "${FAIRSEQ_FLAGS[$i]}" = --criterion ] && FAIRSEQ_FLAGS[i + 1]=relation_distillation
done
echo "== 1/2 fairseq-train: relations $RELATIONS over $RELATION_HEADS heads (weight $RELATION_WEIGHT), lr $LR," \
  "${MAX_EPOCH:+$MAX_EPOCH epochs / }${MAX_UPDATE:+$MAX_UPDATE updates }on $DEVICE_DESC (log: $OUT/train.log)"
# shellcheck disable=SC2086
STAGE_ACCEPTED=write_train_env train_stage "$OUT" "" "${settings[@]}" \
  "teacher=$("$PYTHON" "$RECIPE_PY/steps.py" fingerprint "$TEACHER")" -- \
  "$DATA_BIN" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_${ENC}_$SUFFIX" $MODEL_FLAGS --lr "$LR" \
  --teacher-path "$TEACHER" --relation-heads "$RELATION_HEADS" --relations "$RELATIONS" \
  --relation-weight "$RELATION_WEIGHT" ${MAX_UPDATE:+--max-update $MAX_UPDATE} ${MAX_EPOCH:+--max-epoch $MAX_EPOCH} \
  --keep-interval-updates "$AVERAGE" $EXTRA_FLAGS

[ "${FIRST_NODE:-1}" = 1 ] || exit 0  # the first node averages
echo "== 2/2 averaging the last $AVERAGE interval checkpoints -> $OUT/averaged_last$AVERAGE.pt"
"$PYTHON" "$SCRIPTS/average_checkpoints.py" --inputs "$OUT" --num-update-checkpoints "$AVERAGE" \
  --output "$OUT/averaged_last$AVERAGE.pt"
