#!/usr/bin/env bash
# IWSLT'14 German-English as fairseq's examples/translation/prepare-iwslt14.sh makes it: download
# (or take from --raw-dir) de-en.tgz, keep the text of train.tags.de-en.* (the talks' <url>,
# <talkid> and <keywords> lines dropped, <title>/<description> tags removed), Moses-tokenize
# without -a and without punctuation normalisation (the test set's ’ straightened first), clean
# the training pairs to 1-175 tokens with ratio 1.5, lowercase, validate on every 23rd training
# pair, learn 10k joint BPE merges on the rest, apply them, fairseq-preprocess with separate
# dictionaries. Test: dev2010, TEDX.dev2012, tst2010, tst2011, tst2012 (the .xml files), in order.
#
#   bash recipes/iwslt14_de_en/prepare.sh [--raw-dir DIR] [--out data/iwslt14_de_en]
#
#   --raw-dir DIR   de-en.tgz was downloaded elsewhere: read DIR/de-en.tgz (or DIR/iwslt14/de-en.tgz),
#                   download nothing
#   --out DIR       where everything goes (default data/iwslt14_de_en; DIR/data-bin for fairseq)
#   env: ARCHIVES (data/archives, the cache every recipe shares: this archive goes under iwslt14/),
#        BPE=subword-nmt|sentencepiece (subword-nmt), BPE_SIZE (10000 merges, as fairseq), WORKERS,
#        MIRROR (fetch MIRROR/iwslt14/de-en.tgz instead); every step's output is kept (a few hundred MB:
#        the WMT recipes' KEEP_INTERMEDIATES is not needed here)
#
# de-en.tgz comes over https, and a server silent for DOWNLOAD_TIMEOUT seconds (60) stops the
# download. No checksum is published for it: the first run checks that the archive is whole
# (its gzip stream read to the end) and records its sha256 and size beside it (de-en.tgz.sha256);
# every later run checks the archive against them. A re-run skips the steps that finished with
# the same settings (markers in DIR/.done/); the extraction is keyed by the archive's content, so
# a copy of it elsewhere (another --raw-dir, other dates) does not redo it.
#
# Where this differs from fairseq's script: sacremoses instead of Moses' Perl tokenizer (the
# WMT recipes' choice; the tokens can differ on rare inputs), Python's str.lower() for
# lowercase.perl, and subword-nmt's learn-bpe on the concatenated training sides, as fairseq's
# learn_bpe.py; BPE=sentencepiece is this package's option, not fairseq's.
set -euo pipefail
RECIPE=iwslt14_de_en SRC=de TGT=en VALID_NAME=split TEST_NAME=dev2010_dev2012_tst2010-2012
VALID_EVERY=23  # prepare-iwslt14.sh: every 23rd (cleaned, lowercased) training pair validates
SOURCES="$(dirname "${BASH_SOURCE[0]}")/sources"
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_prepare_args "$@"
[ "${VALID:-split}" = split ] || die "--valid: IWSLT'14 validates on every 23rd training pair only (split)"
VALID=split VALID_DESC="train-every-23rd"
MAX_LEN=175  # prepare-iwslt14.sh's clean-corpus-n.perl 1 175 (the WMT recipes clean BPE'd text to 250)

_iwslt_tokenize() {
  mkdir -p "$WORK/tok"
  for split in train test; do
    for l in "$SRC" "$TGT"; do
      echo "   $split.$l: $(wc -l < "$WORK/raw/$split.$l") lines"
      # shellcheck disable=SC2046
      "$PYTHON" "$RECIPE_PY/text.py" tokenize --plain --lang "$l" --workers "$WORKERS" \
        $([ $split = test ] && echo --test-set) < "$WORK/raw/$split.$l" > "$WORK/tok/$split.$l.tmp"
      mv "$WORK/tok/$split.$l.tmp" "$WORK/tok/$split.$l"
    done
  done
}

# cleaned before lowercasing and before the split, on the tokens (not the BPE'd text): the
# split's every-23rd counts the cleaned pairs, as fairseq's
_iwslt_clean() {
  mkdir -p "$WORK/clean"
  "$PYTHON" "$RECIPE_PY/text.py" clean --src "$WORK/tok/train.$SRC" --tgt "$WORK/tok/train.$TGT" \
    --out-src "$WORK/clean/train.$SRC" --out-tgt "$WORK/clean/train.$TGT" --ratio 1.5 --min-len 1 --max-len "$MAX_LEN"
}

_iwslt_lowercase() {
  mkdir -p "$WORK/lc"
  for l in "$SRC" "$TGT"; do
    "$PYTHON" "$RECIPE_PY/text.py" lowercase < "$WORK/clean/train.$l" > "$WORK/lc/train.$l.tmp"
    "$PYTHON" "$RECIPE_PY/text.py" lowercase < "$WORK/tok/test.$l" > "$WORK/lc/test.$l.tmp"
    mv "$WORK/lc/train.$l.tmp" "$WORK/lc/train.$l" && mv "$WORK/lc/test.$l.tmp" "$WORK/lc/test.$l"
  done
}

_iwslt_split() {
  mkdir -p "$WORK/split"
  for l in "$SRC" "$TGT"; do
    awk -v n="$VALID_EVERY" 'NR % n == 0' "$WORK/lc/train.$l" > "$WORK/split/valid.$l"
    awk -v n="$VALID_EVERY" 'NR % n != 0' "$WORK/lc/train.$l" > "$WORK/split/train.$l"
  done
  echo "   valid: $(wc -l < "$WORK/split/valid.$SRC") pairs, train: $(wc -l < "$WORK/split/train.$SRC") pairs"
}

# one BPE for both languages learned on the training part only (fairseq: learn_bpe.py on
# train.de and train.en concatenated)
_iwslt_learn_bpe() {
  mkdir -p "$WORK/bpe"
  if [ "$BPE" = sentencepiece ]; then
    "$PYTHON" "$RECIPE_PY/text.py" spm-train --input "$WORK/split/train.$SRC" "$WORK/split/train.$TGT" \
      --model-prefix "$WORK/bpe/spm" --vocab-size "$BPE_SIZE"
  else
    cat "$WORK/split/train.$SRC" "$WORK/split/train.$TGT" | subword-nmt learn-bpe -s "$BPE_SIZE" > "$WORK/bpe/code.tmp"
    mv "$WORK/bpe/code.tmp" "$WORK/bpe/code"
  fi
}

# train.tok.* (the training pairs before BPE) and test.raw.* (SacreBLEU's references) as the WMT
# recipes leave them, for evaluate.sh and the extrapolation recipe
_iwslt_apply_bpe() {
  for l in "$SRC" "$TGT"; do
    apply_segmentation "$WORK/split/train.$l" "$WORK/train.$l"
    apply_segmentation "$WORK/split/valid.$l" "$WORK/valid.$l"
    apply_segmentation "$WORK/lc/test.$l" "$WORK/test.$l"
    cp "$WORK/split/train.$l" "$WORK/train.tok.$l"
    cp "$WORK/raw/test.$l" "$WORK/test.raw.$l"
  done
}

WORK="${WORK:-data/$RECIPE}"
BPE="${BPE:-subword-nmt}"
BPE_SIZE="${BPE_SIZE:-10000}"
WORKERS="${WORKERS:-$(nproc)}"
case "$BPE" in subword-nmt|sentencepiece) ;; *) die "BPE must be subword-nmt or sentencepiece, got '$BPE'" ;; esac
ARCHIVES="${RAW_DIR:-${ARCHIVES:-data/archives}}"
mkdir -p "$WORK"
echo "== $RECIPE $SRC-$TGT -> $WORK (archives: $ARCHIVES; $BPE, $BPE_SIZE merges; validation: $VALID_DESC)"
echo "== [1/9] archives: check${RAW_DIR:+ (from --raw-dir, no download)}"
_fetch
space=(--work "$WORK" --recipe "$RECIPE")
[ "${ALLOW_LOW_DISK:-0}" = 1 ] && space+=(--allow-low-disk)
[ -f "$WORK/.done/preprocess" ] || "$PYTHON" "$RECIPE_PY/plan.py" prepare-space "${space[@]}" \
  --sources "$SOURCES" --archives-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" | sed 's/^/   /' || exit 2
STEP_AFTER="" STEP_SETTINGS="archives=$("$PYTHON" "$RECIPE_PY/wmt_data.py" fingerprint \
  --sources "$SOURCES" --raw-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" \
  --cache "$WORK/.archives-sha256.json" --upgrade-marker "$WORK/.done/extract")" \
  step extract "[2/9] extract train (train.tags, metadata dropped) / test ($TEST_NAME, .xml) as plain text" _extract
step tokenize "[3/9] tokenize with sacremoses (no -a, no normalisation)" _iwslt_tokenize
step clean "[4/9] clean training pairs: ratio 1.5, 1-$MAX_LEN tokens" _iwslt_clean
step lowercase "[5/9] lowercase" _iwslt_lowercase
step split "[6/9] validation set: $VALID_DESC" _iwslt_split
step learn_bpe "[7/9] learn joint $BPE ($BPE_SIZE) on the training part" _iwslt_learn_bpe
step apply_bpe "[8/9] apply $BPE" _iwslt_apply_bpe
JOINED_DICTIONARY=0 step preprocess "[9/9] fairseq-preprocess (a dictionary per language) -> $WORK/data-bin" _preprocess
for split in train valid test; do
  echo "| $split: $(wc -l < "$WORK/$split.$SRC") sentence pairs ($WORK/$split.{$SRC,$TGT})"
done
