#!/usr/bin/env bash
# Compress a trained teacher into a smaller, faster student with MiniLMv2 self-attention
# relation distillation (label-smoothed cross-entropy + relation loss), then average.
#
#   DATA_BIN=data-bin/wmt14_en_de TEACHER=runs/big/averaged.pt OUT=runs/student \
#     bash recipes/distillation/distill.sh
#
# The student may use any encoding (ENC), depth, width and head count; teacher and student
# share the dictionaries and RELATION_HEADS, which must divide both attention widths.
# Every setting can be overridden from the environment; EXTRA_FLAGS goes to fairseq-train last.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -d "$ROOT/.venv/bin" ] && export PATH="$ROOT/.venv/bin:$PATH"  # what `make install` built
DATA_BIN="${DATA_BIN:?set DATA_BIN to a fairseq-preprocess output directory}"
TEACHER="${TEACHER:?set TEACHER to the teacher checkpoint}"
OUT="${OUT:-runs/student}"
ENC="${ENC:-sinusoidal}"                              # the student's position encoding
STUDENT_FLAGS="${STUDENT_FLAGS:---encoder-layers 6 --decoder-layers 2}"  # a base-width student, shallow decoder
RELATION_HEADS="${RELATION_HEADS:-64}"               # MiniLMv2: 48 (base) / 64 (large); must divide the widths
RELATIONS="${RELATIONS:-qq,kk,vv}"
RELATION_WEIGHT="${RELATION_WEIGHT:-1.0}"
LR="${LR:-7e-4}"
MAX_EPOCH="${MAX_EPOCH:-30}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
UPDATE_FREQ="${UPDATE_FREQ:-8}"
AVERAGE="${AVERAGE:-5}"
EXTRA_FLAGS="${EXTRA_FLAGS:-}"

[ -f "$TEACHER" ] || { echo "no teacher checkpoint at TEACHER=$TEACHER" >&2; exit 2; }
ls "$DATA_BIN"/dict.*.txt >/dev/null 2>&1 || {
  echo "no fairseq dictionary in DATA_BIN=$DATA_BIN: run fairseq-preprocess first" >&2; exit 2; }

echo "== 1/2 distilling $TEACHER into a transformer_${ENC}_wmt_en_de student ($STUDENT_FLAGS) -> $OUT"
fairseq-train "$DATA_BIN" --user-dir "$ROOT/fairseq_posenc" \
  --arch "transformer_${ENC}_wmt_en_de" $STUDENT_FLAGS --share-all-embeddings \
  --criterion relation_distillation --teacher-path "$TEACHER" --label-smoothing 0.1 \
  --relation-heads "$RELATION_HEADS" --relations "$RELATIONS" --relation-weight "$RELATION_WEIGHT" \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr "$LR" \
  --lr-scheduler inverse_sqrt --warmup-updates 4000 --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" \
  --max-epoch "$MAX_EPOCH" --save-dir "$OUT" --no-progress-bar --log-interval 100 $EXTRA_FLAGS

echo "== 2/2 averaging the last $AVERAGE epoch checkpoints -> $OUT/averaged.pt"
python "$ROOT/scripts/average_checkpoints.py" --inputs "$OUT" --num-epoch-checkpoints "$AVERAGE" \
  --output "$OUT/averaged.pt"
