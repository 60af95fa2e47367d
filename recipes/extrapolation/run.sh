#!/usr/bin/env bash
# Short-to-long extrapolation (FLOATER, Liu et al., 2020, Sec. 4.3) on any corpus a recipe's
# prepare.sh wrote: train each encoding on the training pairs whose source is shorter than
# TRAIN_BELOW tokens, decode the longer ones, and report per bin of source length SacreBLEU, chrF
# and the length ratio hyp/ref (mean ± std over SEEDS), with a paired bootstrap 95% interval of
# each encoding's BLEU difference from BASELINE (scripts/bleu_by_length.py).
#
#   DATA=data/wmt14_en_de ENCODINGS="sinusoidal learned floater none" SEEDS="1 2 3" bash recipes/extrapolation/run.sh
#   ... bash recipes/extrapolation/run.sh --dry-run   # split and binarize, print each model's plan, train nothing
#
#   DATA         a prepared corpus (recipes/wmt*/prepare.sh --out DIR)
#   ENCODINGS    the --position-encoding values to compare (default: sinusoidal learned floater none;
#                none, no position information, is the floor that tells what any encoding buys)
#   UNIT         what a token is when counting lengths: subwords (the BPE'd text, default) or
#                words (the Moses-tokenized text before BPE); every output says which
#   TRAIN_BELOW  80, BINS "80 100 120 140": FLOATER's protocol (the last bin is open-ended)
#   SEEDS        training seeds, one model per encoding and seed (default: 1); with several,
#                each model is under OUT/ENC/seedN
#   BASELINE     the encoding the others are compared with (default: sinusoidal if listed, else the first)
#   OUT          runs/extrapolation/<recipe> ; writes OUT/bleu_by_length.{md,json,png}
#   VANILLA_CONTINUED  1 (default): with floater, also train and decode its control, the vanilla
#                model trained on with FLOATER's stage-2 schedule (recipes/floater/train.sh), and
#                report FLOATER against it: FLOATER's gain over sinusoidal holds the extra updates
#                of its second stage, its difference from the control does not. 0 skips it
#   ARCH, LR, MAX_TOKENS, MAX_UPDATE, ... as recipes/wmt14_en_de/train.sh; BEAM (4), LENPEN (0.6)
#
# A re-run skips the encodings already trained and decoded (markers in OUT/.done/ record each
# step's settings and inputs: changing UNIT, TRAIN_BELOW or BINS, or the corpus in DATA (by content,
# not path), redoes the split and every model after it; changing a model's settings trains that
# model again; deleting OUT/.done/model_* decodes it again, deleting its directory retrains it).
# The validation set is cut at TRAIN_BELOW like the training part.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
DATA="${DATA:?set DATA to a corpus prepared by recipes/*/prepare.sh}"
[ -f "$DATA/corpus.env" ] && [ -d "$DATA/data-bin" ] \
  || die "no prepared corpus in DATA=$DATA ($DATA/corpus.env missing): run a recipes/*/prepare.sh first"
load_corpus   # SRC, TGT, BPE, RECIPE of the corpus
parse_run_args "$@"
ENCODINGS="${ENCODINGS:-sinusoidal learned floater none}"
SEEDS="${SEEDS:-1}"
N_SEEDS=$(echo "$SEEDS" | wc -w)
BASE_EXTRA_FLAGS="${EXTRA_FLAGS:-}"
UNIT="${UNIT:-subwords}"
TRAIN_BELOW="${TRAIN_BELOW:-80}"
BINS="${BINS:-80 100 120 140}"
BEAM="${BEAM:-4}"
LENPEN="${LENPEN:-0.6}"
export VANILLA_CONTINUED="${VANILLA_CONTINUED:-1}"
WORKERS="${WORKERS:-$(nproc)}"
ROOT_OUT="${OUT:-runs/extrapolation/$RECIPE}"
# one node: this recipe splits, binarizes, trains, decodes and reports in one process tree, and
# every step writes files the others read; train a model on several nodes with train.sh instead
if [ "${NNODES:-1}" != 1 ] || { [ -n "${SLURM_JOB_NODELIST:-}" ] && [ "${SLURM_NTASKS:-1}" != 1 ]; }; then
  die "the extrapolation recipe runs on one node (NNODES=${NNODES:-1}, SLURM_NTASKS=${SLURM_NTASKS:-1}): start it once," \
    "without srun or NNODES; its models use every GPU of that node"
fi
WORK="$ROOT_OUT"            # step markers
BPE_DIR="$DATA/bpe"         # the corpus's own BPE, for UNIT=words
SPLIT="$ROOT_OUT/split"
# the validation set (DATA/valid.*, segmented) is cut at TRAIN_BELOW too, counted in UNIT
case "$UNIT" in
  subwords) COUNTED="$DATA/train" SEGMENTED="$SPLIT" VALID_SEGMENTATION=none ;;
  words) COUNTED="$DATA/train.tok" SEGMENTED="$SPLIT/bpe"
         VALID_SEGMENTATION=$([ "$BPE" = sentencepiece ] && echo sentencepiece || echo subword_nmt) ;;
  *) die "UNIT must be subwords or words, got '$UNIT'" ;;
esac

_split() {
  rm -rf "$SPLIT"  # no bin file of an earlier BINS may stay behind to be concatenated below
  # shellcheck disable=SC2086
  "$PYTHON" "$SCRIPTS/length_split.py" --src "$COUNTED.$SRC" --tgt "$COUNTED.$TGT" --src-lang "$SRC" \
    --tgt-lang "$TGT" --out-dir "$SPLIT" --train-below "$TRAIN_BELOW" --bins $BINS --unit "$UNIT" \
    --valid-src "$DATA/valid.$SRC" --valid-tgt "$DATA/valid.$TGT" --valid-segmentation "$VALID_SEGMENTATION"
  for l in "$SRC" "$TGT"; do  # one test set of every long pair (sorted by name; the report bins by length)
    cat "$SPLIT"/long.*."$l" > "$SPLIT/long.$l"
  done
  if [ "$UNIT" = words ]; then
    mkdir -p "$SEGMENTED"
    for part in train long; do
      for l in "$SRC" "$TGT"; do apply_segmentation "$SPLIT/$part.$l" "$SEGMENTED/$part.$l"; done
    done
  fi
  [ -s "$SEGMENTED/long.$SRC" ] || die "no training pair of $DATA has a source of $TRAIN_BELOW $UNIT or more"
}

_preprocess() {
  rm -rf "$ROOT_OUT/data-bin"
  local dicts=(--srcdict "$DATA/data-bin/dict.$SRC.txt" --joined-dictionary)
  # a corpus with a dictionary per language (IWSLT'14) keeps both
  cmp -s "$DATA/data-bin/dict.$SRC.txt" "$DATA/data-bin/dict.$TGT.txt" \
    || dicts=(--srcdict "$DATA/data-bin/dict.$SRC.txt" --tgtdict "$DATA/data-bin/dict.$TGT.txt")
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --trainpref "$SEGMENTED/train" \
    --validpref "$SPLIT/valid" --testpref "$SEGMENTED/long" --destdir "$ROOT_OUT/data-bin" \
    "${dicts[@]}" --workers "$WORKERS" \
    > "$ROOT_OUT/preprocess.log" 2>&1 || die "fairseq-preprocess failed (log: $ROOT_OUT/preprocess.log)"
}

# decode the long pairs; S- lines stay in the unit the bins count, H-/T- become detokenized words.
# The common x + 50 limit would cut outputs of sources past 80 tokens, and these are the long
# ones: 1.5x + 50 (given after it, so it wins) leaves room for a model that runs on.
LIMIT=(--max-len-a 1.5 --max-len-b 50)
# The recipe owns its models: one trained with another configuration or data is trained again
# (STAGE_ON_CHANGE=restart); a finished one is not trained further. Training is decided by its
# stages' records every run (cheap when finished); decoding is a step keyed by what its output
# depends on (_decode_settings).
_decode() {
  if [ "$UNIT" = words ]; then
    average_and_generate "$ROOT_OUT/data-bin" test "$OUT/generate.long.txt" "${LIMIT[@]}" "$(remove_bpe_flag)"
    segmentation=none
  else
    average_and_generate "$ROOT_OUT/data-bin" test "$OUT/generate.long.txt" "${LIMIT[@]}"
    segmentation=$([ "$BPE" = sentencepiece ] && echo sentencepiece || echo subword_nmt)
  fi
  "$PYTHON" "$RECIPE_PY/scoring.py" detok-generation --generation "$OUT/generate.long.txt" \
    --lang "$TGT" --bpe "$segmentation" --out "$OUT/generate.long.detok.txt"
  if [ "$ENC" = floater ] && [ "$VANILLA_CONTINUED" = 1 ]; then
    _decode_control
  fi
}

# FLOATER's control, OUT/vanilla_continued: decoded as FLOATER is
_decode_control() {
  local control="$OUT/vanilla_continued"
  if [ "$UNIT" = words ]; then
    CKPT_DIR="$control" average_and_generate "$ROOT_OUT/data-bin" test "$control/generate.long.txt" "${LIMIT[@]}" "$(remove_bpe_flag)"
  else
    CKPT_DIR="$control" average_and_generate "$ROOT_OUT/data-bin" test "$control/generate.long.txt" "${LIMIT[@]}"
  fi
  [ "${DRY_RUN:-0}" = 1 ] && return 0
  "$PYTHON" "$RECIPE_PY/scoring.py" detok-generation --generation "$control/generate.long.txt" \
    --lang "$TGT" --bpe "$segmentation" --out "$control/generate.long.detok.txt"
}

# what a model's decoded outputs depend on, for its step marker: the trained stages by their
# stamps (a new one each time a stage finishes training), and the whole fairseq-generate command
# line (beam, length penalty, limits, averaging, device flags; the run's own directory left out, so
# that a moved ROOT_OUT decodes nothing again), hashed (a setting is one word)
_decode_settings() {
  local stage stamps="" command
  for stage in "$(checkpoint_dir)" $([ "$ENC" = floater ] && [ "$VANILLA_CONTINUED" = 1 ] && echo "$OUT/vanilla_continued"); do
    stamps+=" $(basename "$stage")=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["stamp"])' "$stage/stage.json")"
  done
  command="$(GENERATE_KEY_ONLY=1 average_and_generate "$ROOT_OUT/data-bin" test "$OUT/generate.long.txt" "${LIMIT[@]}" \
    $([ "$UNIT" = words ] && remove_bpe_flag) | sed "s|$ROOT_OUT|ROOT_OUT|g" | md5sum | cut -c1-12)"
  echo "${stamps# } decode=$command unit=$UNIT"
}

mkdir -p "$ROOT_OUT"
echo "== short-to-long on $DATA ($SRC-$TGT): train below $TRAIN_BELOW $UNIT, bins $BINS; encodings: $ENCODINGS"
# the split and its binarized corpus are what the plan counts updates per epoch from, so a dry
# run makes them too (data work, no training)
# declared inputs: the text the lengths are counted in and the validation set, by content (another
# corpus, or this one prepared again with another BPE, redoes the split and all after it)
split_inputs="text_src=$COUNTED.$SRC text_tgt=$COUNTED.$TGT valid_src=$DATA/valid.$SRC valid_tgt=$DATA/valid.$TGT"
# the BPE model only: KEEP_INTERMEDIATES=0 removes bpe/'s segmented copies, which nothing here reads
[ "$UNIT" = words ] && split_inputs+=" bpe=$BPE_DIR/$([ "$BPE" = sentencepiece ] && echo spm.model || echo code)"
STEP_INPUTS="$split_inputs" step split "[split] length_split.py -> $SPLIT" _split
STEP_INPUTS="dictionary=$DATA/data-bin/dict.$SRC.txt" step preprocess "[preprocess] fairseq-preprocess with the corpus's dictionary -> $ROOT_OUT/data-bin" _preprocess
generations=() logs=() controls=() checkpoints=()
# a dry run adds up what every model's plan needs (recipes/common.sh: plan_training appends its line)
if [ "$DRY_RUN" = 1 ]; then export PLAN_TOTALS="$ROOT_OUT/.plan_totals"; rm -f "$PLAN_TOTALS"; fi
for ENC in $ENCODINGS; do
  files="" control_files=""
  for SEED in $SEEDS; do
    if [ "$N_SEEDS" = 1 ]; then model_out="$ROOT_OUT/$ENC" name="model_$ENC"     # one seed: the layout of old runs
    else model_out="$ROOT_OUT/$ENC/seed$SEED" name="model_${ENC}_seed$SEED"; fi
    # one subshell per model: set_training_defaults fills what the user left unset (AVERAGE, LR,
    # ...) with this encoding's defaults (FLOATER averages 5 where big averages 20), and those
    # must not carry over to the next encoding
    (
      OUT="$model_out" EXTRA_FLAGS="$BASE_EXTRA_FLAGS --seed $SEED"
      set_training_defaults
      if [ "$DRY_RUN" = 1 ]; then
        train_model "$ROOT_OUT/data-bin"
        average_and_generate "$ROOT_OUT/data-bin" test "$OUT/generate.long.txt" "${LIMIT[@]}"
        if [ "$ENC" = floater ] && [ "$VANILLA_CONTINUED" = 1 ]; then _decode_control; fi
        exit 0
      fi
      STAGE_ON_CHANGE=restart train_model "$ROOT_OUT/data-bin"
      STEP_AFTER=preprocess STEP_SETTINGS="$(_decode_settings)" STEP_REDO_HINT="delete $WORK/.done/$name to decode it again, $OUT to train it again" \
        step "$name" "[$ENC seed $SEED] average, decode the long pairs -> $OUT" _decode
      # the report names the row by the decoded model's own label (fairseq_posenc/labels.py)
      evaluated_checkpoint > "$OUT/evaluated_checkpoint.txt"
    )
    files="${files:+$files,}$model_out/generate.long.detok.txt"
    logs+=("$model_out/generate.long.txt.log")  # fairseq-generate's stderr: its config line has the limit
    if [ "$ENC" = floater ] && [ "$VANILLA_CONTINUED" = 1 ]; then
      control_files="${control_files:+$control_files,}$model_out/vanilla_continued/generate.long.detok.txt"
      logs+=("$model_out/vanilla_continued/generate.long.txt.log")
    fi
  done
  generations+=("$ENC=$files")
  [ "$DRY_RUN" = 1 ] || checkpoints+=("$ENC=$(cat "${files%%/generate.long.detok.txt*}/evaluated_checkpoint.txt")")
  if [ "$ENC" = floater ] && [ "$VANILLA_CONTINUED" = 1 ]; then
    generations+=("vanilla_continued=$control_files") controls+=(floater=vanilla_continued)
  fi
done
if [ "$DRY_RUN" = 1 ]; then
  "$PYTHON" "$RECIPE_PY/plan.py" totals --plans "$PLAN_TOTALS" --out "$ROOT_OUT" \
    $([ "${ALLOW_LOW_DISK:-0}" = 1 ] && echo --allow-low-disk) | sed 's/^/   /' || exit 2
  rm -f "$PLAN_TOTALS"
  echo "== --dry-run: nothing trained, no report"; exit 0
fi
echo "== [report] SacreBLEU, chrF, length ratio per bin of source length ($UNIT) -> $ROOT_OUT/bleu_by_length.{md,json,png}"
# shellcheck disable=SC2086
"$PYTHON" "$SCRIPTS/bleu_by_length.py" --generation "${generations[@]}" --seeds $SEEDS ${BASELINE:+--baseline "$BASELINE"} \
  --bins $BINS --unit "$UNIT" --decoding-log "${logs[@]}" --decoded-source "$SEGMENTED/long.$SRC" \
  ${controls[@]:+--control "${controls[@]}"} --checkpoint "${checkpoints[@]}" \
  --out "$ROOT_OUT/bleu_by_length" --title "$RECIPE $SRC-$TGT: trained on sources < $TRAIN_BELOW $UNIT"
