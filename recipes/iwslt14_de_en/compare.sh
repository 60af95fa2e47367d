#!/usr/bin/env bash
# Several encodings with several seeds on IWSLT'14 De-En, on the whole test set: each model trained
# by train.sh (into OUT/ENC/seedN, fairseq-train --seed N) and scored by evaluate.sh (its two lines
# appended to RESULTS, OUT/results.txt, encoding by encoding, seed by seed), then one report per
# bin of source length in words (scripts/bleu_by_length.py: SacreBLEU, chrF and the length ratio
# as mean ± std over the seeds, each encoding's difference from BASELINE with a paired bootstrap
# 95% interval that also covers the spread between seeds) and its plot.
#
#   ENCODINGS="sinusoidal learned rope alibi t5 none" SEEDS="1 2 3" bash recipes/iwslt14_de_en/compare.sh [--dry-run]
#
#   ENCODINGS  (sinusoidal learned rope alibi t5 none; none, no position information, is the floor)
#   SEEDS      (1 2 3)     BASELINE (sinusoidal)     OUT (runs/iwslt14_de_en/compare)
#   BINS       left edges in source words, the last open (1 10 20 30 40)
#   and what train.sh and evaluate.sh read (EVAL_BLEU, CHECKPOINT, MAX_UPDATE, DEVICE_FLAGS, ...)
#
# A finished model is not trained again (train.sh skips it) but is decoded again. --dry-run prints
# every model's plan (with its expected time on one GPU) and trains nothing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RECIPE=iwslt14_de_en
. "$HERE/../common.sh"
parse_run_args "$@"
load_corpus
ENCODINGS="${ENCODINGS:-sinusoidal learned rope alibi t5 none}"
SEEDS="${SEEDS:-1 2 3}"
ROOT_OUT="${OUT:-runs/$RECIPE/compare}"
BINS="${BINS:-1 10 20 30 40}"
RESULTS="${RESULTS:-$ROOT_OUT/results.txt}"
BASE_EXTRA_FLAGS="${EXTRA_FLAGS:-}"
dry=()
[ "$DRY_RUN" = 1 ] && dry=(--dry-run)
generations=() logs=()
declare -A labels=()  # ENC -> its models' label, the report's row name
for enc in $ENCODINGS; do
  files="" label=""
  for seed in $SEEDS; do
    out="$ROOT_OUT/$enc/seed$seed"
    echo "== [$enc seed $seed] -> $out"
    ENC="$enc" OUT="$out" EXTRA_FLAGS="$BASE_EXTRA_FLAGS --seed $seed" DRY_RUN=0 bash "$HERE/train.sh" "${dry[@]}"
    [ "$DRY_RUN" = 1 ] && continue
    ENC="$enc" OUT="$out" RESULTS="$RESULTS" SEED="$seed" bash "$HERE/evaluate.sh"  # SEED: in the results label
    # H- and T- lines detokenized for the report's SacreBLEU and chrF; S- lines stay words, the bins' unit
    gen="$out/generate.$TEST_NAME.txt"
    "$PYTHON" "$RECIPE_PY/scoring.py" detok-generation --generation "$gen" --lang "$TGT" --bpe none \
      --out "$out/generate.$TEST_NAME.detok.txt"
    files="${files:+$files,}$out/generate.$TEST_NAME.detok.txt"
    # the row's name: the trained model's label (evaluate.sh reads it from the checkpoint: alibi (split))
    seed_label="$(cat "$out/label.$TEST_NAME.txt")"
    [ -z "$label" ] || [ "$label" = "$seed_label" ] || die "$enc: seed $seed's model is '$seed_label', an earlier seed's '$label'"
    label="$seed_label"
    logs+=("$gen.log")
  done
  [ "$DRY_RUN" = 1 ] || { generations+=("$label=$files"); labels[$enc]="$label"; }
done
if [ "$DRY_RUN" = 1 ]; then echo "== --dry-run: nothing trained, no report"; exit 0; fi
echo "== [report] $TEST_NAME per bin of source length (words) -> $ROOT_OUT/bleu_by_length.{md,json,png}"
# shellcheck disable=SC2086
"$PYTHON" "$SCRIPTS/bleu_by_length.py" --generation "${generations[@]}" --seeds $SEEDS \
  ${BASELINE:+--baseline "${labels[$BASELINE]:-$BASELINE}"} --bins $BINS --unit words --decoding-log "${logs[@]}" \
  --title "IWSLT'14 De-En $TEST_NAME, $(echo "$SEEDS" | wc -w) seed(s)" --out "$ROOT_OUT/bleu_by_length"
