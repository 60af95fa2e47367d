#!/usr/bin/env bash
# FLOATER's training protocol (Liu et al., 2020), over fairseq's CLI:
#   1. train a vanilla (sinusoidal) Transformer,
#   2. warm-start FLOATER from its best checkpoint (h = 0, zero initial states: at first exactly
#      the vanilla model) and train on at half the peak learning rate,
#   3. average the last 5 epoch checkpoints.
#
#   DATA_BIN=data-bin/wmt14_en_de OUT=runs/floater ARCH=base bash recipes/floater/train.sh
#
# Every setting below can be overridden from the environment; EXTRA_FLAGS is appended to both
# fairseq-train commands (e.g. "--cpu" or smaller model sizes for a dry run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA_BIN="${DATA_BIN:?set DATA_BIN to a fairseq-preprocess output directory}"
OUT="${OUT:-runs/floater}"
ARCH="${ARCH:-base}"                  # base | big
VANILLA_EPOCHS="${VANILLA_EPOCHS:-30}"
FLOATER_EPOCHS="${FLOATER_EPOCHS:-10}"
LR="${LR:-7e-4}"                      # the paper's peak lr; FLOATER continues at LR / 2
MAX_TOKENS="${MAX_TOKENS:-4096}"
UPDATE_FREQ="${UPDATE_FREQ:-8}"       # 4096 x 8 tokens: the ~25k-token batches of the papers
AVERAGE="${AVERAGE:-5}"
[ -d "$ROOT/.venv/bin" ] && export PATH="$ROOT/.venv/bin:$PATH"  # what `make install` built
PYTHON="${PYTHON:-python}"
EXTRA_FLAGS="${EXTRA_FLAGS:-}"

case "$ARCH" in
  base) SUFFIX=wmt_en_de ;;
  big) SUFFIX=wmt_en_de_big ;;
  *) echo "ARCH must be base or big, got '$ARCH'" >&2; exit 2 ;;
esac
ls "$DATA_BIN"/dict.*.txt >/dev/null 2>&1 || {
  echo "no fairseq dictionary in DATA_BIN=$DATA_BIN: run fairseq-preprocess first" >&2; exit 2; }

common=(--user-dir "$ROOT/fairseq_posenc" --share-all-embeddings
  --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-9 --clip-norm 0.0
  --lr-scheduler inverse_sqrt --warmup-updates 4000
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --no-progress-bar --log-interval 100)

echo "== 1/3 vanilla transformer_sinusoidal_$SUFFIX for $VANILLA_EPOCHS epochs -> $OUT/vanilla"
fairseq-train "$DATA_BIN" "${common[@]}" --arch "transformer_sinusoidal_$SUFFIX" \
  --lr "$LR" --max-epoch "$VANILLA_EPOCHS" --save-dir "$OUT/vanilla" $EXTRA_FLAGS

HALF_LR=$("$PYTHON" -c "print(float('$LR') / 2)")
echo "== 2/3 FLOATER warm-started from $OUT/vanilla/checkpoint_best.pt, lr $HALF_LR, $FLOATER_EPOCHS epochs"
fairseq-train "$DATA_BIN" "${common[@]}" --arch "transformer_floater_$SUFFIX" \
  --floater-init-from "$OUT/vanilla/checkpoint_best.pt" \
  --lr "$HALF_LR" --max-epoch "$FLOATER_EPOCHS" --save-dir "$OUT/floater" $EXTRA_FLAGS

echo "== 3/3 averaging the last $AVERAGE epoch checkpoints -> $OUT/floater/averaged.pt"
"$PYTHON" "$ROOT/scripts/average_checkpoints.py" --inputs "$OUT/floater" \
  --num-epoch-checkpoints "$AVERAGE" --output "$OUT/floater/averaged.pt"
