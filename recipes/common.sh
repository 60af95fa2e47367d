# Shared logic of the WMT and extrapolation recipes; sourced, not run. Each recipe sets a few
# variables (RECIPE, SRC, TGT, SOURCES, ...) and calls prepare_corpus, train_model or
# evaluate_model. Every setting below can be overridden from the environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# what `make install` built, unless PATH already has it (where a caller put commands before it)
case ":$PATH:" in *":$ROOT/.venv/bin:"*) ;; *) [ -d "$ROOT/.venv/bin" ] && export PATH="$ROOT/.venv/bin:$PATH" ;; esac
PYTHON="${PYTHON:-python}"
SCRIPTS="$ROOT/scripts"                 # what a person runs too
RECIPE_PY="$ROOT/fairseq_posenc/recipe"  # the recipes' internals, run as files (no fairseq import unless needed)
USER_DIR="$ROOT/fairseq_posenc"

die() { echo "$(basename "$0"): $*" >&2; exit 2; }

# step NAME DESCRIPTION CMD...: run CMD unless an earlier run finished it with the same inputs
# ($WORK/.done/NAME, see fairseq_posenc/recipe/steps.py). What a step's outputs depend on is
# derived from the step itself (step_key): its command line, the source of every shell function it
# runs, the value of every variable those functions read, and the code of the programs they run
# (Python files and the Python environment's commands: fairseq_posenc/recipe/programs.py). It
# declares only what the shell cannot see: STEP_INPUTS="NAME=PATH ..." (files or directories it
# reads, by content), STEP_SETTINGS="KEY=VALUE ..." (no spaces inside a value: what it reads that
# is neither, such as the archives' content fingerprint) and the step before it (STEP_AFTER,
# default the previous step called), whose redoing redoes it, so a change redoes everything after
# it. Each step writes its outputs before its marker: an interrupted step is redone whole.
LAST_STEP=""

# variables a step may read without keying it, each with its reason: WORK (where the step writes
# and its marker lives); PYTHON (which interpreter runs the programs, not what they do); bash's
# own changing ones; WORKERS (parallelism: the same output); the step machinery's own (STEP_*,
# LAST_STEP). A value
# holding a "/" is a location, not a setting: what is read there is declared by content
# (STEP_INPUTS, the archives' fingerprint) and what is written there lives under WORK.
STEP_UNKEYED=" WORK PYTHON BASHPID BASH_COMMAND BASH_SUBSHELL EPOCHREALTIME EPOCHSECONDS LINENO OLDPWD PPID PWD RANDOM SECONDS SRANDOM WORKERS LAST_STEP "

# step_key CMD...: KEY=VALUE lines keying a step by what runs: step.source, a hash of the command
# line and of the source (declare -f) of every function it runs, those functions run in turn
# included; and var.NAME=VALUE for every variable that source reads and does not set itself
# (unset reads as empty)
step_key() {
  # (its locals are prefixed: a step's function may read a global of any other name)
  local _sk_todo=("$@") _sk_seen=" " _sk_functions _sk_word _sk_f _sk_body _sk_source="$*" _sk_names=" " _sk_own=" "
  local _sk_value
  _sk_functions=" $(compgen -A function | tr '\n' ' ') "
  while [ ${#_sk_todo[@]} -gt 0 ]; do
    _sk_f=${_sk_todo[0]}; _sk_todo=("${_sk_todo[@]:1}")
    case "$_sk_functions" in *" $_sk_f "*) ;; *) continue ;; esac
    case "$_sk_seen" in *" $_sk_f "*) continue ;; esac
    _sk_seen+="$_sk_f "
    _sk_body="$(declare -f "$_sk_f")"
    _sk_source+=$'\n'"$_sk_body"
    for _sk_word in $(grep -oE '[A-Za-z_][A-Za-z0-9_]*' <<< "$_sk_body" | sort -u); do
      case "$_sk_functions" in *" $_sk_word "*) _sk_todo+=("$_sk_word") ;; esac
    done
    for _sk_word in $(grep -oE '\$\{?[A-Za-z_][A-Za-z0-9_]*' <<< "$_sk_body" | tr -d '${' | sort -u); do
      _sk_names+="$_sk_word "
    done
    # the functions' own variables (assigned, a loop's, declared local): whatever an earlier
    # step left in them is no setting
    # (here-documents are text, not assignments)
    local _sk_code; _sk_code="$(awk 'end != "" { if ($0 == end) end = ""; next }
      match($0, /<<-? *[\047"]?[A-Za-z_]+/) { end = substr($0, RSTART, RLENGTH); gsub(/[<\047" -]/, "", end) } 1' <<< "$_sk_body")"
    for _sk_word in $( { grep -oE '(^|[^A-Za-z0-9_$])[A-Za-z_][A-Za-z0-9_]*\+?=' <<< "$_sk_code" | grep -oE '[A-Za-z_][A-Za-z0-9_]*'
                         grep -oE '(for|read|mapfile) +(-[a-z]+ +)*[A-Za-z_][A-Za-z0-9_]*' <<< "$_sk_code" | awk '{print $NF}'
                         grep -oE '(local|declare)( +-[a-zA-Z]+)*( +[A-Za-z_][A-Za-z0-9_]*(=[^ ;]*)?)+' <<< "$_sk_code" \
                           | tr ' ' '\n' | grep -vE '^(local|declare|-.*)$' | cut -d= -f1; } | sort -u); do
      _sk_own+="$_sk_word "
    done
  done
  echo "step.source=$(printf '%s' "$_sk_source" | sha1sum | cut -c1-12)"
  # the programs it runs, keyed by their code by steps.py (recipe/programs.py): Python files named
  # by $RECIPE_PY or $SCRIPTS in the functions or by path in the command line, and the commands of
  # the Python environment (fairseq-preprocess, subword-nmt) that the functions name
  local _sk_bin; _sk_bin="$(dirname "$(command -v "${PYTHON:-python}")")"
  for _sk_word in $(grep -oE '\$\{?(RECIPE_PY|SCRIPTS)\}?/[A-Za-z0-9_]+\.py' <<< "$_sk_source" | sort -u); do
    _sk_f="${_sk_word#\$}"; _sk_f="${_sk_f#\{}"; _sk_value="${_sk_f%%/*}"; _sk_value="${_sk_value%\}}"
    echo "program=${!_sk_value}/${_sk_f#*/}"
  done
  for _sk_word in "$@"; do
    case "$_sk_word" in *.py) [ -f "$_sk_word" ] && echo "program=$_sk_word" ;; esac
  done
  for _sk_word in $(grep -oE '(^|[^A-Za-z0-9_./$-])[A-Za-z][A-Za-z0-9_-]*' <<< "$_sk_source" | grep -oE '[A-Za-z][A-Za-z0-9_-]*' | sort -u); do
    case "$_sk_word" in python*|pip*) continue ;; esac
    [ -f "$_sk_bin/$_sk_word" ] && echo "program=$_sk_word"
  done
  for _sk_word in $(tr ' ' '\n' <<< "$_sk_names" | sort -u); do
    case "$STEP_UNKEYED$_sk_own" in *" $_sk_word "*) continue ;; esac
    case "$_sk_word" in STEP_*|_sk_*) continue ;; esac
    _sk_value="${!_sk_word-}"
    case "$_sk_value" in */*) continue ;; esac
    echo "var.$_sk_word=${_sk_value//$'\n'/ }"
  done
}

step() {
  # the key first, before this function's locals hide the globals of the same names
  local STEP_DERIVED; mapfile -t STEP_DERIVED < <(step_key "${@:3}")
  local name=$1 desc=$2; shift 2
  local after="${STEP_AFTER-$LAST_STEP}" settings="${STEP_SETTINGS:-}" inputs="${STEP_INPUTS:-}" hint reason
  hint="${STEP_REDO_HINT:-delete $WORK/.done/$name to redo}"
  STEP_SETTINGS="" ; STEP_INPUTS="" ; STEP_REDO_HINT="" ; unset STEP_AFTER
  local declared=(--dir "$WORK/.done" --name "$name" --after "$after")
  # shellcheck disable=SC2206
  local derived=() programs=() line
  for line in "${STEP_DERIVED[@]}"; do
    case "$line" in program=*) programs+=("${line#program=}") ;; *) derived+=("$line") ;; esac
  done
  declared+=(--settings $settings "${derived[@]}" --program "${programs[@]}")
  # shellcheck disable=SC2206
  [ -n "$inputs" ] && declared+=(--input $inputs)
  reason="$("$PYTHON" "$RECIPE_PY/steps.py" check "${declared[@]}")" && {
    echo "== $desc: done before, skipping ($hint)"
    LAST_STEP=$name
    return 0
  }
  [ -n "$reason" ] || exit 2  # steps.py refused (an input missing): it said why
  STEP_REASON=$reason  # for the step's command: "not done yet" (resume a first run) or why it is stale
  if [ "$reason" = "not done yet" ]; then echo "== $desc"; else echo "== $desc: redoing ($reason)"; fi
  local start=$SECONDS
  "$@"
  "$PYTHON" "$RECIPE_PY/steps.py" done "${declared[@]}"
  LAST_STEP=$name
  echo "   ($((SECONDS - start)) s)"
}

# ---------------------------------------------------------------------------------------------
# prepare: archives -> plain text -> sacremoses -> dev split -> joint BPE -> clean -> fairseq-preprocess
#   needs RECIPE (a name), SOURCES (the sources file), SRC, TGT, VALID_NAME (the official
#   validation set), TEST_NAME, VALID_EVERY (fairseq's split: every Nth training pair);
#   options parsed from the command line: --raw-dir DIR (archives downloaded elsewhere; nothing
#   is downloaded then), --out DIR (default data/$RECIPE), --valid split|VALID_NAME
#   env: ARCHIVES (data/archives: one cache for every recipe and pair), MIRROR (download
#        ARCHIVE from MIRROR/ARCHIVE instead of statmt.org), BPE=subword-nmt|sentencepiece,
#        BPE_SIZE (40000), WORKERS (cores), VERIFY_CHECKSUMS=0 (archives repacked elsewhere),
#        KEEP_INTERMEDIATES=0 (remove raw/, tok/, split/ and bpe/'s copies at the end),
#        ALLOW_LOW_DISK=1 (go on when the free space looks short)
# ---------------------------------------------------------------------------------------------
parse_prepare_args() {
  RAW_DIR="" ; WORK=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --raw-dir) RAW_DIR="${2:?--raw-dir needs a directory}"; shift 2 ;;
      --out) WORK="${2:?--out needs a directory}"; shift 2 ;;
      --valid) VALID="${2:?--valid needs split or $VALID_NAME}"; shift 2 ;;
      --pair) [ -n "${PAIR_CHOICES:-}" ] || die "--pair: $RECIPE has one pair, $SRC-$TGT"
              PAIR="${2:?--pair needs e.g. en-de}"; shift 2 ;;
      -h|--help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; exit 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
}

# apply_segmentation IN OUT: the corpus's BPE (subword-nmt codes or sentencepiece model)
apply_segmentation() {
  if [ "$BPE" = sentencepiece ]; then
    "$PYTHON" "$RECIPE_PY/text.py" spm-encode --model "${BPE_DIR:-$WORK/bpe}/spm.model" < "$1" > "$2.tmp"
  else
    subword-nmt apply-bpe -c "${BPE_DIR:-$WORK/bpe}/code" < "$1" > "$2.tmp"
  fi
  mv "$2.tmp" "$2"
}

# every run: cheap (a stat per archive, the md5 of the small test archives), and it notices an
# archive deleted or replaced since the last run
_fetch() {
  local verify="" download=""
  [ "${VERIFY_CHECKSUMS:-1}" = 0 ] && verify=--no-verify
  [ -n "$RAW_DIR" ] && download=--no-download
  # shellcheck disable=SC2086
  "$PYTHON" "$RECIPE_PY/wmt_data.py" fetch --sources "$SOURCES" --raw-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" \
    $download $verify ${MIRROR:+--mirror "$MIRROR"}
}

_extract() {
  "$PYTHON" "$RECIPE_PY/wmt_data.py" extract --sources "$SOURCES" --raw-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" \
    --out-dir "$WORK/raw"
}

# as fairseq's prepare-wmt14en2*.sh: training and validation text through Moses' punctuation
# normalisation, non-printing characters to spaces and the tokenizer (-a); the test set only has
# its curly apostrophes straightened before the tokenizer, so that the tokenized BLEU's
# references are fairseq's
_tokenize() {
  mkdir -p "$WORK/tok"
  for split in train valid test; do
    for l in "$SRC" "$TGT"; do
      echo "   $split.$l: $(wc -l < "$WORK/raw/$split.$l") lines"
      # shellcheck disable=SC2046
      "$PYTHON" "$RECIPE_PY/text.py" tokenize --lang "$l" --workers "$WORKERS" $([ $split = test ] && echo --test-set) \
        < "$WORK/raw/$split.$l" > "$WORK/tok/$split.$l.tmp"
      mv "$WORK/tok/$split.$l.tmp" "$WORK/tok/$split.$l"
    done
  done
}

# fairseq's split: every VALID_EVERY-th training pair is the validation set, the rest is trained on
_split_valid() {
  mkdir -p "$WORK/split"
  for l in "$SRC" "$TGT"; do
    if [ "$VALID" = split ]; then
      awk -v n="$VALID_EVERY" 'NR % n == 0' "$WORK/tok/train.$l" > "$WORK/split/valid.$l"
      awk -v n="$VALID_EVERY" 'NR % n != 0' "$WORK/tok/train.$l" > "$WORK/split/train.$l"
    else
      cp "$WORK/tok/valid.$l" "$WORK/split/valid.$l"
      cp "$WORK/tok/train.$l" "$WORK/split/train.$l"
    fi
  done
  echo "   valid: $(wc -l < "$WORK/split/valid.$SRC") pairs, train: $(wc -l < "$WORK/split/train.$SRC") pairs"
}

_learn_bpe() {
  mkdir -p "$WORK/bpe"
  if [ "$BPE" = sentencepiece ]; then
    "$PYTHON" "$RECIPE_PY/text.py" spm-train --input "$WORK/split/train.$SRC" "$WORK/split/train.$TGT" \
      --model-prefix "$WORK/bpe/spm" --vocab-size "$BPE_SIZE"
  else
    subword-nmt learn-joint-bpe-and-vocab --input "$WORK/split/train.$SRC" "$WORK/split/train.$TGT" \
      -s "$BPE_SIZE" -o "$WORK/bpe/code.tmp" \
      --write-vocabulary "$WORK/bpe/vocab.$SRC" "$WORK/bpe/vocab.$TGT" --num-workers "$WORKERS"
    mv "$WORK/bpe/code.tmp" "$WORK/bpe/code"
  fi
}

_apply_bpe() {
  for l in "$SRC" "$TGT"; do
    apply_segmentation "$WORK/split/train.$l" "$WORK/bpe/train.$l"
    apply_segmentation "$WORK/split/valid.$l" "$WORK/bpe/valid.$l"
    apply_segmentation "$WORK/tok/test.$l" "$WORK/bpe/test.$l"
  done
}

# as fairseq's prepare-wmt14en2*.sh: clean the BPE'd training pairs (ratio 1.5, 1-250 tokens),
# and the validation pairs of the split; the test set is kept whole. train.tok.* are the same
# training pairs before BPE.
_clean() {
  "$PYTHON" "$RECIPE_PY/text.py" clean --src "$WORK/bpe/train.$SRC" --tgt "$WORK/bpe/train.$TGT" \
    --out-src "$WORK/train.$SRC" --out-tgt "$WORK/train.$TGT" --ratio 1.5 --min-len 1 --max-len 250 \
    --also "$WORK/split/train.$SRC" "$WORK/split/train.$TGT" --also-out "$WORK/train.tok.$SRC" "$WORK/train.tok.$TGT"
  if [ "$VALID" = split ]; then
    "$PYTHON" "$RECIPE_PY/text.py" clean --src "$WORK/bpe/valid.$SRC" --tgt "$WORK/bpe/valid.$TGT" \
      --out-src "$WORK/valid.$SRC" --out-tgt "$WORK/valid.$TGT" --ratio 1.5 --min-len 1 --max-len 250
  fi
  for l in "$SRC" "$TGT"; do
    [ "$VALID" = split ] || cp "$WORK/bpe/valid.$l" "$WORK/valid.$l"
    cp "$WORK/bpe/test.$l" "$WORK/test.$l"
    cp "$WORK/raw/test.$l" "$WORK/test.raw.$l"  # the references SacreBLEU scores against
  done
}

_preprocess() {
  rm -rf "$WORK/data-bin.tmp"
  fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --trainpref "$WORK/train" \
    --validpref "$WORK/valid" --testpref "$WORK/test" --destdir "$WORK/data-bin.tmp" \
    $([ "${JOINED_DICTIONARY:-1}" = 1 ] && echo --joined-dictionary) --workers "$WORKERS" > "$WORK/preprocess.log" 2>&1 \
    || { tail -20 "$WORK/preprocess.log" >&2; die "fairseq-preprocess failed (log: $WORK/preprocess.log)"; }
  rm -rf "$WORK/data-bin" && mv "$WORK/data-bin.tmp" "$WORK/data-bin"
  cat > "$WORK/corpus.env" <<EOF
# written by recipes/$RECIPE/prepare.sh; read by train.sh and evaluate.sh
RECIPE=$RECIPE
SRC=$SRC
TGT=$TGT
BPE=$BPE
BPE_SIZE=$BPE_SIZE
VALID_NAME=$VALID_DESC
TEST_NAME=$TEST_NAME
EOF
  grep -h "^| \[" "$WORK/preprocess.log" | sed 's/^/   /' || true
}

prepare_corpus() {
  WORK="${WORK:-data/$RECIPE}"
  BPE="${BPE:-subword-nmt}"
  BPE_SIZE="${BPE_SIZE:-40000}"
  WORKERS="${WORKERS:-$(nproc)}"
  case "$BPE" in subword-nmt|sentencepiece) ;; *) die "BPE must be subword-nmt or sentencepiece, got '$BPE'" ;; esac
  VALID="${VALID:-split}"
  case "$VALID" in
    split) VALID_DESC="train-every-${VALID_EVERY}th" ;;
    "$VALID_NAME") VALID_DESC="$VALID_NAME" ;;
    *) die "--valid must be split (every ${VALID_EVERY}th training pair, as fairseq) or $VALID_NAME, got '$VALID'" ;;
  esac
  ARCHIVES="${RAW_DIR:-${ARCHIVES:-data/archives}}"
  mkdir -p "$WORK"
  echo "== $RECIPE $SRC-$TGT -> $WORK (archives: $ARCHIVES; $BPE, $BPE_SIZE merges; validation: $VALID_DESC)"
  # KEEP_INTERMEDIATES=0 removed what steps 2-6 wrote: other settings redo them, from the archives
  local removed="$WORK/intermediates.removed" kept="valid=$VALID_DESC bpe=$BPE size=$BPE_SIZE"
  if [ -f "$removed" ] && [ "$(cat "$removed")" != "$kept" ]; then
    echo "== the intermediate files were removed ($(cat "$removed")): redoing every step from the archives"
    rm -f "$WORK/.done/extract" "$WORK/.done/preprocess" "$removed"
  fi
  echo "== [1/8] archives: check${RAW_DIR:+ (from --raw-dir, no download)}"
  _fetch
  # free space, before hours of work (a corpus prepared before is rewritten in place); ALLOW_LOW_DISK=1 goes on
  local space=(--work "$WORK" --recipe "$RECIPE" $([ "${ALLOW_LOW_DISK:-0}" = 1 ] && echo --allow-low-disk))
  [ -f "$WORK/.done/preprocess" ] || "$PYTHON" "$RECIPE_PY/plan.py" prepare-space "${space[@]}" \
    --sources "$SOURCES" --archives-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" | sed 's/^/   /' || exit 2
  STEP_AFTER="" STEP_SETTINGS="archives=$("$PYTHON" "$RECIPE_PY/wmt_data.py" fingerprint \
    --sources "$SOURCES" --raw-dir "$ARCHIVES" --src "$SRC" --tgt "$TGT" \
    --cache "$WORK/.archives-sha256.json" --upgrade-marker "$WORK/.done/extract")" \
    step extract "[2/8] extract train / valid ($VALID_NAME) / test ($TEST_NAME) as plain text" _extract
  [ -f "$WORK/.done/preprocess" ] || "$PYTHON" "$RECIPE_PY/plan.py" prepare-space "${space[@]}" \
    --raw-text "$WORK/raw" | sed 's/^/   /' || exit 2
  step tokenize "[3/8] normalise and tokenize with sacremoses" _tokenize
  step split "[4/8] validation set: $VALID_DESC" _split_valid
  step learn_bpe "[5/8] learn joint $BPE ($BPE_SIZE)" _learn_bpe
  step apply_bpe "[6/8] apply $BPE" _apply_bpe
  step clean "[7/8] clean training pairs: ratio 1.5, 1-250 tokens" _clean
  step preprocess "[8/8] fairseq-preprocess --joined-dictionary -> $WORK/data-bin" _preprocess
  for split in train valid test; do
    echo "| $split: $(wc -l < "$WORK/$split.$SRC") sentence pairs ($WORK/$split.{$SRC,$TGT})"
  done
  if [ "${KEEP_INTERMEDIATES:-1}" = 0 ] && [ -d "$WORK/raw" ]; then
    # train.sh reads data-bin and corpus.env, evaluate.sh data-bin and test.raw.*, the extrapolation
    # recipe train.*, train.tok.*, valid.* and the BPE codes in bpe/: the rest goes
    local before; before=$(du -sk "$WORK" | cut -f1)
    rm -rf "$WORK/raw" "$WORK/tok" "$WORK/split"
    for split in train valid test; do rm -f "$WORK/bpe/$split.$SRC" "$WORK/bpe/$split.$TGT"; done
    echo "$kept" > "$removed"
    echo "== KEEP_INTERMEDIATES=0: removed raw/, tok/, split/ and bpe/'s segmented copies:" \
      "$(( (before - $(du -sk "$WORK" | cut -f1)) / 1024 )) MB freed (other settings will redo them from the archives)"
  fi
}

# ---------------------------------------------------------------------------------------------
# train / evaluate: DATA is a directory prepare_corpus wrote (its corpus.env says the languages)
# ---------------------------------------------------------------------------------------------
load_corpus() {
  DATA="${DATA:-data/$RECIPE}"
  [ -f "$DATA/corpus.env" ] && [ -d "$DATA/data-bin" ] \
    || die "no prepared corpus in DATA=$DATA ($DATA/corpus.env missing): run recipes/$RECIPE/prepare.sh first"
  # shellcheck disable=SC1091
  . "$DATA/corpus.env"
}

# train.sh / evaluate.sh arguments: --dry-run (train.sh: print the plan, train nothing), and
# --pair where the recipe has pairs (PAIR_CHOICES set); anything else is refused
parse_run_args() {
  DRY_RUN="${DRY_RUN:-0}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --dry-run) DRY_RUN=1; shift ;;
      --pair) [ -n "${PAIR_CHOICES:-}" ] || die "--pair: $RECIPE has one pair"
              PAIR="${2:?--pair needs e.g. en-de}"; shift 2 ;;
      -h|--help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d'; exit 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
}

# the encodings trained with FLOATER's warm-start protocol (recipes/floater/train.sh): FLOATER and
# the RNN position encoders of its Table 6, which take FLOATER's place in the same blocks
warm_started() { case "$1" in floater|rnn) return 0 ;; *) return 1 ;; esac; }

# the results label's encoding: the evaluated checkpoint's own label (fairseq_posenc/labels.py, from
# the model's state, not the flags: alibi, alibi (split), t5 (bias scale 10)); ENC where there is no
# checkpoint yet (--dry-run); with the RNN's form (Table 6's rows are one ENC, told apart by flags)
# evaluated_checkpoint: the checkpoint that average_and_generate decodes
evaluated_checkpoint() {
  if [ "${CHECKPOINT:-average}" = best ]; then echo "$(checkpoint_dir)/checkpoint_best.pt"
  else echo "$(checkpoint_dir)/averaged_last$AVERAGE.pt"; fi
}

# the evaluated model's label (fairseq_posenc/labels.py), read from its checkpoint: every option that
# made it, none taken from the command line; a checkpoint without one stops the recipe, naming it
encoding_label() {
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_posenc.labels "$(evaluated_checkpoint)"
}

# what differs between the corpora of the recipes (keyed by the corpus's RECIPE, so that the
# extrapolation recipe on an En-Fr corpus gets En-Fr's)
recipe_defaults() {
  case "$RECIPE" in
    wmt14_en_fr) BIG_DROPOUT="${BIG_DROPOUT:-0.1}"     # Vaswani et al.: big En-Fr used dropout 0.1
                 FLOATER_EPOCHS="${FLOATER_EPOCHS:-1}" ;; # FLOATER trained En-Fr one epoch after the warm start
    # fairseq's IWSLT'14 example (examples/translation/README.md): transformer_iwslt_de_en, separate
    # dictionaries with the decoder's input and output embeddings shared, weight decay 1e-4, Adam's
    # own eps and no warmup-init lr (both fairseq's defaults), fp32, 4096 tokens an update on one GPU
    iwslt14_de_en)
      DEFAULT_ARCH=iwslt
      SHARE_EMBEDDINGS="${SHARE_EMBEDDINGS:-decoder}"
      WEIGHT_DECAY="${WEIGHT_DECAY:-0.0001}"
      ADAM_EPS="${ADAM_EPS-}"              # empty: fairseq's default, 1e-8
      WARMUP_INIT_LR="${WARMUP_INIT_LR-}"  # empty: fairseq's default, the warmup starts from 0
      DEFAULT_DEVICE_FLAGS=""
      BATCH_TOKENS="${BATCH_TOKENS:-4096}" BATCH_SOURCE="fairseq's IWSLT example's"
      # fairseq's wps on one GPU for this model in fp32: an assumption (no GPU was lent to measure it)
      TOKENS_PER_SECOND="${TOKENS_PER_SECOND:-25000}"
      local note="TOKENS_PER_SECOND=$TOKENS_PER_SECOND target tokens a second is an assumption for fp32 on one"
      SPEED_NOTE="${SPEED_NOTE:-$note V100/A100-class GPU, not a measurement: set it from the wps of train.log}"
      # recipes/floater/train.sh (ENC=floater) is another process with its own RECIPE: it inherits these
      export DEFAULT_ARCH SHARE_EMBEDDINGS WEIGHT_DECAY ADAM_EPS WARMUP_INIT_LR DEFAULT_DEVICE_FLAGS BATCH_TOKENS \
        BATCH_SOURCE TOKENS_PER_SECOND SPEED_NOTE ;;
  esac
}

# the Scaling NMT flags (Ott et al., 2018) with the papers' base/big settings
set_training_defaults() {
  recipe_defaults
  ENC="${ENC:-sinusoidal}"
  ARCH="${ARCH:-${DEFAULT_ARCH:-base}}"
  case "$ARCH" in
    base) SUFFIX=wmt_en_de; DEFAULT_DROPOUT=0.1; DEFAULT_LR=7e-4; DEFAULT_MAX_UPDATE=100000; DEFAULT_AVERAGE=5 ;;
    big) SUFFIX=wmt_en_de_big; DEFAULT_DROPOUT="${BIG_DROPOUT:-0.3}"; DEFAULT_LR=5e-4; DEFAULT_MAX_UPDATE=300000
         DEFAULT_AVERAGE=20 ;;
    # fairseq's transformer_iwslt_de_en; 50k updates of 4096 tokens and the last 10 checkpoints
    # averaged: Wu et al.'s IWSLT'14 De-En budget ("Pay Less Attention", 2019, fairseq's authors)
    iwslt) SUFFIX=iwslt_de_en; DEFAULT_DROPOUT=0.3; DEFAULT_LR=5e-4; DEFAULT_MAX_UPDATE=50000; DEFAULT_AVERAGE=10 ;;
    *) die "ARCH must be base, big or iwslt, got '$ARCH'" ;;
  esac
  warm_started "$ENC" && DEFAULT_AVERAGE=5  # FLOATER's paper averages the last 5, base and big
  # LARGE_BATCH=1: fairseq's examples/scaling_nmt "big batches" (--update-freq 16 on its 8 GPUs: 16x
  # the batch; lr 0.001), for many GPUs, whose share of 32768 tokens is small (512 a GPU at 64).
  # Every count of updates is divided by 16, so that each stands for the same tokens: the budget
  # (6250 base, 18750 big: the same epochs), the warmup (250) and the checkpoint interval (125, 50)
  DEFAULT_WARMUP=4000 DEFAULT_SAVE_INTERVAL=auto
  case "${LARGE_BATCH:=0}" in
    0) ;;
    1) [ "$ARCH" = iwslt ] && die "LARGE_BATCH=1 is the WMT recipes' (fairseq's scaling_nmt): IWSLT keeps its example's 4096 tokens an update"
       BATCH_TOKENS="${BATCH_TOKENS:-524288}"; [ -n "${BATCH_SOURCE:-}" ] || BATCH_SOURCE="LARGE_BATCH=1's"
       DEFAULT_LR=1e-3 DEFAULT_MAX_UPDATE=$((DEFAULT_MAX_UPDATE / 16)) DEFAULT_WARMUP=250
       if [ "$ARCH" = base ]; then DEFAULT_SAVE_INTERVAL=125; else DEFAULT_SAVE_INTERVAL=50; fi ;;
    *) die "LARGE_BATCH must be 0 or 1, got '$LARGE_BATCH'" ;;
  esac
  DROPOUT="${DROPOUT:-$DEFAULT_DROPOUT}"
  LR="${LR:-$DEFAULT_LR}"
  MAX_EPOCH="${MAX_EPOCH:-}"
  # FLOATER's Appendix B.2 trains the vanilla model 30 epochs (for En-De and En-Fr alike) before
  # the warm start; MAX_UPDATE, if given, can stop it earlier
  warm_started "$ENC" && MAX_EPOCH="${MAX_EPOCH:-${VANILLA_EPOCHS:-30}}"
  # MAX_EPOCH alone stops at that epoch; MAX_UPDATE (100k base, 300k big) otherwise
  if [ -n "$MAX_EPOCH" ]; then MAX_UPDATE="${MAX_UPDATE:-}"; else MAX_UPDATE="${MAX_UPDATE:-$DEFAULT_MAX_UPDATE}"; fi
  AVERAGE="${AVERAGE:-$DEFAULT_AVERAGE}"
  SAVE_INTERVAL_UPDATES="${SAVE_INTERVAL_UPDATES:-$DEFAULT_SAVE_INTERVAL}"  # auto: 1250 base, 600 big (fairseq_posenc/recipe/plan.py)
  MAX_TOKENS="${MAX_TOKENS:-auto}"    # auto: at most 4096 a GPU, chosen with UPDATE_FREQ
  UPDATE_FREQ="${UPDATE_FREQ:-auto}"  # ~32768 tokens an update (within 5%) whatever the GPU count
  WARMUP="${WARMUP:-$DEFAULT_WARMUP}"
  MODEL_FLAGS="${MODEL_FLAGS:-}"      # e.g. smaller sizes for a dry run
  EXTRA_FLAGS="${EXTRA_FLAGS:-}"      # appended to fairseq-train
  DEVICE="${DEVICE:-auto}"            # cpu: run on the CPU (refused otherwise when no GPU is visible)
  NUM_GPUS="${NUM_GPUS:-auto}"        # the GPUs fairseq will use (auto: what torch sees)
  # precision on a GPU: --fp16 (default), --bf16, --amp, --memory-efficient-fp16, ...
  # (DEVICE_FLAGS="" set but empty: fp32 on the GPU)
  if [ "$DEVICE" = cpu ]; then DEVICE_FLAGS="${DEVICE_FLAGS:-}"; else DEVICE_FLAGS="${DEVICE_FLAGS-${DEFAULT_DEVICE_FLAGS---fp16}}"; fi
  FLOATER_EPOCHS="${FLOATER_EPOCHS:-10}"  # FLOATER's second stage: 10 epochs for En-De, 1 for En-Fr
  FLOATER_MAX_UPDATE="${FLOATER_MAX_UPDATE:-}"
  # FLOATER's Table 2: the position encoder at every block or at the input block only
  # (--position-blocks). The encoding's own default is the run without it: sinusoidal and learned
  # are input-only, FLOATER at every block (fairseq_posenc/positions); the other form is its own
  # run, its own default OUT.
  POSITION_BLOCKS="${POSITION_BLOCKS:-}"
  case "$ENC:$POSITION_BLOCKS" in
    *:|sinusoidal:input|learned:input|floater:all|rnn:all) POSITION_BLOCKS="" ;;
    sinusoidal:all|learned:all|floater:input|rnn:input) ;;
    *:input|*:all) die "POSITION_BLOCKS=$POSITION_BLOCKS: ENC=$ENC has no position encoder to place (sinusoidal, learned, floater and rnn have)" ;;
    *) die "POSITION_BLOCKS must be input or all, got '$POSITION_BLOCKS'" ;;
  esac
  POSITION_BLOCK_FLAGS="${POSITION_BLOCKS:+--position-blocks $POSITION_BLOCKS}"
  OUT="${OUT:-runs/$RECIPE/$ENC${POSITION_BLOCKS:+-$POSITION_BLOCKS}-$ARCH}"
}

# where the checkpoints to average are: FLOATER's protocol writes OUT/vanilla then OUT/floater
# (OUT/rnn for the RNN encoders)
# (CKPT_DIR names another: FLOATER's control, OUT/vanilla_continued)
checkpoint_dir() {
  if [ -n "${CKPT_DIR:-}" ]; then echo "$CKPT_DIR"; elif warm_started "$ENC"; then echo "$OUT/$ENC"; else echo "$OUT"; fi
}

# plan_training DATA_BIN: fairseq_posenc/recipe/plan.py prints the plan (devices, the world of every node,
# tokens per update, updates per epoch, checkpoints, averaging, disk) and sets UPDATE_FREQ,
# MAX_TOKENS, SAVE_INTERVAL_UPDATES, TRAIN_DEVICE_FLAGS (with the distributed flags), WORLD_SIZE,
# FIRST_NODE (1 where the shared files are written), LAUNCH_ID and TRAIN_LAUNCHER (torchrun's
# command on several nodes); it refuses a plan that cannot work. Several nodes: NNODES, NODE_RANK,
# MASTER_ADDR, MASTER_PORT, LAUNCH_ID (torchrun, the recipe run once per node), or srun's SLURM_*.
plan_training() {
  local data_bin=$1 plan_env
  plan_env="$(mktemp)"
  local stages=(--stage "${STAGE_NAME:-train}" "${MAX_UPDATE:--}" "${MAX_EPOCH:--}")
  warm_started "$ENC" && stages=(--stage vanilla "${MAX_UPDATE:--}" "${MAX_EPOCH:--}"
                                  --stage "$ENC" "${FLOATER_MAX_UPDATE:--}" "${FLOATER_EPOCHS:--}"
                                  --baseline-updates "${BASELINE_UPDATES:-${MAX_UPDATE:-$DEFAULT_MAX_UPDATE}}")
  warm_started "$ENC" && [ "${VANILLA_CONTINUED:-0}" = 1 ] && stages+=(--control-stage vanilla_continued)
  echo "== plan for $ENC-$ARCH on $data_bin"
  "$PYTHON" "$RECIPE_PY/plan.py" plan --data-bin "$data_bin" --arch "$ARCH" --model-flags "$MODEL_FLAGS" \
    "${stages[@]}" --average "$AVERAGE" --save-interval-updates "$SAVE_INTERVAL_UPDATES" --max-tokens "$MAX_TOKENS" \
    --update-freq "$UPDATE_FREQ" --gpus "$NUM_GPUS" --device "$DEVICE" --precision="$DEVICE_FLAGS" \
    --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "${NPROC_PER_NODE:-auto}" \
    --master-addr "${MASTER_ADDR:-}" --master-port "${MASTER_PORT:-}" --launch-id "${LAUNCH_ID:-}" --out "${OUT:-}" \
    $([ "${ALLOW_BATCH:-0}" = 1 ] && echo --allow-batch) ${BATCH_TOKENS:+--batch-target "$BATCH_TOKENS"} \
    ${BATCH_SOURCE:+--batch-source "$BATCH_SOURCE"} ${TOKENS_PER_SECOND:+--tokens-per-second "$TOKENS_PER_SECOND"} \
    ${SPEED_NOTE:+--speed-note "$SPEED_NOTE"} \
    $([ "${ALLOW_LOW_DISK:-0}" = 1 ] || [ "${DRY_RUN:-0}" = 1 ] && echo --allow-low-disk) \
    --env-out "$plan_env" | sed 's/^/   /' || { rm -f "$plan_env"; exit 2; }
  # shellcheck disable=SC1090
  . "$plan_env" && rm -f "$plan_env"
  # a recipe adding up several models' plans (the extrapolation recipe's --dry-run) names a file;
  # FLOATER's protocol writes its line once it knows where its shared vanilla stage lives
  if [ -n "${PLAN_TOTALS:-}" ] && ! warm_started "$ENC"; then
    echo "$OUT $TOTAL_UPDATES $CHECKPOINT_DISK" >> "$PLAN_TOTALS"
  fi
}

# run_settings DATA_BIN: what a stage depends on that fairseq's configuration does not hold (the
# configuration itself, every field of it, is recorded by fairseq_posenc/recipe/steps.py stage from the argument
# list fairseq-train will run): the training data by content (the dictionaries, train and valid:
# the same corpus at another path is the same run, another corpus at the same path is not, and
# another test set changes no model)
run_settings() {
  echo "data=$("$PYTHON" "$RECIPE_PY/steps.py" fingerprint --training-data "$1")"
}

# train_stage SAVE_DIR AFTER_DIR SETTING... -- FAIRSEQ_TRAIN_ARGS...
# One fairseq-train into SAVE_DIR, started from the stage in AFTER_DIR ("" for none).
# fairseq_posenc/recipe/steps.py stage (fairseq_posenc/recipe/stages.py) parses the argument list fairseq-train
# will run with fairseq's own parser and compares the resolved configuration with the one
# SAVE_DIR/stage.json recorded: start, resume (interrupted, or a larger budget), skip (finished:
# fairseq-train would train one update more and could replace checkpoint_best.pt), restart
# (AFTER_DIR trained again since, or another configuration under STAGE_ON_CHANGE=restart), or
# refuse (another configuration, naming each field; checkpoints without a record unless
# ADOPT_RUN=1; a budget below what was trained). STAGE_ACCEPTED names a function to run once the
# decision has accepted the run (what must not be written for a refused one). With several nodes
# the first decides and acts, the others take its decision (LAUNCH_ID names the launch they share).
# The stage is finished when its checkpoints say so, whatever fairseq-train's exit code.
train_stage() {
  local save_dir=$1 after_dir=$2; shift 2
  local settings=() decision end rc=0
  while [ "$1" != -- ]; do settings+=("$1"); shift; done; shift
  # shellcheck disable=SC2206
  local train_args=("$@" --save-dir "$save_dir" $TRAIN_DEVICE_FLAGS)
  mkdir -p "$save_dir"
  if [ "${FIRST_NODE:-1}" = 1 ]; then
    local flags=(--on-change "${STAGE_ON_CHANGE:-refuse}" --act)
    [ "${ADOPT_RUN:-0}" = 1 ] && flags+=(--adopt)
    [ -n "${LAUNCH_ID:-}" ] && flags+=(--launch "$LAUNCH_ID")
    decision="$("$PYTHON" "$RECIPE_PY/steps.py" stage --save-dir "$save_dir" --after-dir "$after_dir" "${flags[@]}" \
      --settings "${settings[@]}" -- "${train_args[@]}")" || exit 2
    printf '\n== %s %s: %s\n' "$(date -u '+%F %T UTC')" "$save_dir" "$decision" >> "$save_dir/train.log"
  else
    [ -n "${LAUNCH_ID:-}" ] || die "FIRST_NODE=0 needs LAUNCH_ID, shared by every node of the launch"
    decision="$("$PYTHON" "$RECIPE_PY/steps.py" stage --save-dir "$save_dir" --launch "$LAUNCH_ID" \
      --wait "${STAGE_WAIT:-1800}")" || exit 2
  fi
  echo "   $save_dir: $decision"
  if [ -n "${STAGE_ACCEPTED:-}" ] && [ "${FIRST_NODE:-1}" = 1 ]; then "$STAGE_ACCEPTED"; fi
  [ "${decision%% *}" = skip ] && return 0
  launch_fairseq_train "$save_dir" "${train_args[@]}" || rc=$?
  end="$("$PYTHON" "$RECIPE_PY/steps.py" stage-end --save-dir "$save_dir" --exit-code "$rc" \
    $([ "${FIRST_NODE:-1}" = 1 ] || echo --not-first --wait "${STAGE_WAIT:-1800}"))" || exit 2
  [ "$end" = finished ] || echo "== $end" >&2
}

# preflight_stage SAVE_DIR SETTING... -- FAIRSEQ_TRAIN_ARGS...: refuse now, before an earlier stage
# trains, when SAVE_DIR holds checkpoints of another configuration (see train_stage)
preflight_stage() {
  local save_dir=$1; shift
  local settings=()
  while [ "$1" != -- ]; do settings+=("$1"); shift; done; shift
  [ -f "$save_dir/checkpoint_last.pt" ] || return 0
  # shellcheck disable=SC2086
  "$PYTHON" "$RECIPE_PY/steps.py" stage --save-dir "$save_dir" --preflight --settings "${settings[@]}" -- \
    "$@" --save-dir "$save_dir" $TRAIN_DEVICE_FLAGS > /dev/null || exit 2
}

# the Scaling NMT flags every recipe trains with (Ott et al., 2018), into the array FAIRSEQ_FLAGS;
# what recipe_defaults sets per corpus (IWSLT: fairseq's example) replaces the WMT values:
# SHARE_EMBEDDINGS all|decoder, ADAM_EPS (1e-9; empty: Adam's default), WARMUP_INIT_LR (1e-07;
# empty: fairseq's default), WEIGHT_DECAY (0.0)
scaling_nmt_flags() {
  local share=(--share-all-embeddings) eps=() init=()
  case "${SHARE_EMBEDDINGS:-all}" in
    all) ;;
    decoder) share=(--share-decoder-input-output-embed) ;;
    *) die "SHARE_EMBEDDINGS must be all or decoder, got '$SHARE_EMBEDDINGS'" ;;
  esac
  [ -n "${ADAM_EPS-1e-9}" ] && eps=(--adam-eps "${ADAM_EPS-1e-9}")
  [ -n "${WARMUP_INIT_LR-1e-07}" ] && init=(--warmup-init-lr "${WARMUP_INIT_LR-1e-07}")
  FAIRSEQ_FLAGS=(--user-dir "$USER_DIR" "${share[@]}"
    --optimizer adam --adam-betas '(0.9, 0.98)' "${eps[@]}" --clip-norm 0.0
    --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" "${init[@]}"
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --weight-decay "${WEIGHT_DECAY:-0.0}" --dropout "$DROPOUT"
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --save-interval-updates "$SAVE_INTERVAL_UPDATES"
    --no-epoch-checkpoints --no-progress-bar --log-interval 100 --log-format simple)
  # EVAL_BLEU=1: checkpoint_best.pt by validation BLEU, decoded in process at every validation, as
  # fairseq's IWSLT example (in-process decoding sees the current position tables of every
  # encoding: tests/test_pipeline_consistency.py). The beam is the test's (EVAL_BEAM, 5) and the
  # length limit the test decode's, 1.5 x source + 50, not the example's 1.2 x + 10: selection
  # would otherwise favour a model on outputs the test decode would not cut
  if [ "${EVAL_BLEU:-0}" = 1 ]; then
    local remove=(--eval-bleu-remove-bpe)
    [ "${BPE:-subword-nmt}" = sentencepiece ] && remove=(--eval-bleu-remove-bpe sentencepiece)
    FAIRSEQ_FLAGS+=(--eval-bleu --eval-bleu-args "{\"beam\": ${EVAL_BEAM:-5}, \"max_len_a\": 1.5, \"max_len_b\": 50}"
      --eval-bleu-detok moses "${remove[@]}" --best-checkpoint-metric bleu --maximize-best-checkpoint-metric)
    [ "${TGT:-en}" = en ] || FAIRSEQ_FLAGS+=(--eval-bleu-detok-args "{\"target_lang\": \"$TGT\"}")
  fi
}

# launch_fairseq_train SAVE_DIR ARGS...: fairseq-train ARGS (--save-dir and the plan's device and
# distributed flags included) under the plan's launcher (torchrun on several nodes); returns
# fairseq-train's exit code, which train_stage weighs against the checkpoints. The first node
# appends the log to SAVE_DIR/train.log, each run under a dated header, so a run resumed after a
# preemption keeps the loss history, and echoes its train and valid lines; the other nodes write
# nothing there (on a shared filesystem they would race): fairseq's other ranks print only
# warnings and errors, left in their node's output.
launch_fairseq_train() {
  local save_dir=$1; shift
  # torchrun runs a Python file, so fairseq-train goes by its path
  # shellcheck disable=SC2206
  local command=(${TRAIN_LAUNCHER:-} "$(command -v fairseq-train || echo fairseq-train)")
  if [ "${FIRST_NODE:-1}" != 1 ]; then
    "${command[@]}" "$@" 2>&1 || return $?
    return 0
  fi
  printf '\n== %s %s %s\n' "$(date -u '+%F %T UTC')" "${TRAIN_LAUNCHER:+$TRAIN_LAUNCHER }fairseq-train" "$*" >> "$save_dir/train.log"
  "${command[@]}" "$@" 2>&1 \
    | tee -a "$save_dir/train.log" | awk '/\| (train|valid) \| epoch|done training/ { print "   " $0; fflush() }' \
    || return $?
}

# train_model DATA_BIN
train_model() {
  local data_bin=$1
  ls "$data_bin"/dict.*.txt > /dev/null 2>&1 || die "no fairseq dictionary in $data_bin: run prepare.sh first"
  if warm_started "$ENC"; then  # FLOATER's protocol plans its stages itself, in this shell
    if [ "$ENC" = floater ]; then echo "== FLOATER: the paper's warm-start protocol (recipes/floater/protocol.sh) -> $OUT"
    else echo "== RNN ($ENC): FLOATER's warm-start protocol (recipes/floater/protocol.sh) -> $OUT"; fi
    train_warm_started "$data_bin"
    return
  fi
  local settings; mapfile -t settings < <(run_settings "$data_bin")
  plan_training "$data_bin"
  scaling_nmt_flags
  # shellcheck disable=SC2206
  local train_args=("$data_bin" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_${ENC}_$SUFFIX" --lr "$LR"
    ${MAX_UPDATE:+--max-update $MAX_UPDATE} ${MAX_EPOCH:+--max-epoch $MAX_EPOCH} --keep-interval-updates "$AVERAGE"
    $POSITION_BLOCK_FLAGS $MODEL_FLAGS $EXTRA_FLAGS)
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "== --dry-run: nothing trained (device flags: ${TRAIN_DEVICE_FLAGS:-none})"
    # one line a shell can run again (what launch_fairseq_train adds included)
    echo "== --dry-run: would run ${TRAIN_LAUNCHER:+$TRAIN_LAUNCHER }fairseq-train $(printf '%q ' "${train_args[@]}" \
      --save-dir "$OUT")${TRAIN_DEVICE_FLAGS}"
    return 0
  fi
  mkdir -p "$OUT"
  echo "== fairseq-train --arch transformer_${ENC}_$SUFFIX: lr $LR, dropout $DROPOUT, max tokens $MAX_TOKENS x $UPDATE_FREQ," \
    "${MAX_EPOCH:+$MAX_EPOCH epochs / }${MAX_UPDATE:+$MAX_UPDATE updates }-> $OUT on $DEVICE_DESC (log: $OUT/train.log)"
  STAGE_ACCEPTED=write_train_env train_stage "$OUT" "" "${settings[@]}" -- "${train_args[@]}"
}

# what evaluate.sh checks the last checkpoint against, written once the stage's decision accepted
# the run (a refused re-run leaves the label of the run that trained it)
write_train_env() {
  printf 'TRAINED_MAX_UPDATE=%s\nTRAINED_MAX_EPOCH=%s\n' "$MAX_UPDATE" "$MAX_EPOCH" > "$OUT/train.env"
  if [ "${EVAL_BLEU:-0}" = 1 ]; then echo "TRAINED_BEST_METRIC=bleu" >> "$OUT/train.env"; fi
}

# check_finished: the last checkpoint reached what train.sh was asked for, or ALLOW_UNFINISHED=1
# (the results line then says UNFINISHED)
check_finished() {
  local ckpt max_update="$MAX_UPDATE" max_epoch="$MAX_EPOCH"
  ckpt="$(checkpoint_dir)/checkpoint_last.pt"
  if [ -f "$OUT/train.env" ]; then
    # shellcheck disable=SC1091
    . "$OUT/train.env"; max_update="${TRAINED_MAX_UPDATE:-}"; max_epoch="${TRAINED_MAX_EPOCH:-}"
  fi
  UNFINISHED=""
  local verdict
  if ! verdict="$("$PYTHON" "$RECIPE_PY/plan.py" check-finished --checkpoint "$ckpt" \
        ${max_update:+--max-update "$max_update"} ${max_epoch:+--max-epoch "$max_epoch"} 2>&1)"; then
    [ "${ALLOW_UNFINISHED:-0}" = 1 ] || die "${verdict#plan.py: error: } (re-run train.sh to finish it, or set ALLOW_UNFINISHED=1 to score it marked UNFINISHED)"
    echo "== WARNING: ${verdict#plan.py: error: }; scoring it anyway (ALLOW_UNFINISHED=1), marked UNFINISHED"
    UNFINISHED=" UNFINISHED"
  else
    echo "== $verdict" | sed 's/^== | /== /'
  fi
}

# average_and_generate DATA_BIN SUBSET OUTPUT [fairseq-generate flags...]: average the last
# AVERAGE interval checkpoints, then beam search. Vaswani et al. cap outputs at source length
# + 50, which cuts a long source's translation short (past 80 tokens it is below 1.5x + 10);
# 1.5 x source + 50 is never lower, so only an output that would be cut can differ.
# LENPEN_FORM=fairseq (default): --lenpen divides the summed log-probability by |Y|^LENPEN;
# LENPEN_FORM=gnmt: GNMT's ((5+|Y|)/6)^LENPEN, which Vaswani et al. and DIET used: fairseq
# writes every finished hypothesis (--nbest BEAM) with its raw score (--unnormalized) to
# OUTPUT.nbest and fairseq_posenc/recipe/rerank.py keeps the best by GNMT's penalty (the beam search does
# not depend on the penalty, only the final choice does: see that script).
average_and_generate() {
  local data_bin=$1 subset=$2 output=$3; shift 3
  local form="${LENPEN_FORM:-fairseq}" decode_flags
  case "$form" in
    fairseq) decode_flags=(--beam "$BEAM" --lenpen "$LENPEN") ;;
    gnmt) decode_flags=(--beam "$BEAM" --nbest "$BEAM" --unnormalized) ;;
    *) die "LENPEN_FORM=$form: choose fairseq (|Y|^LENPEN, fairseq's --lenpen) or gnmt (((5+|Y|)/6)^LENPEN)" ;;
  esac
  local ckpt; ckpt="$(checkpoint_dir)"
  local averaged; averaged="$(evaluated_checkpoint)"
  local device_env; device_env="$(mktemp)"
  "$PYTHON" "$RECIPE_PY/plan.py" device --gpus "$NUM_GPUS" --device "$DEVICE" --precision="$DEVICE_FLAGS" \
    --env-out "$device_env" > /dev/null || { rm -f "$device_env"; exit 2; }
  # shellcheck disable=SC1090
  . "$device_env" && rm -f "$device_env"
  # one command line for the run, for --dry-run's copy of it and for what a decode is keyed by
  # shellcheck disable=SC2206
  local command=(fairseq-generate "$data_bin" --user-dir "$USER_DIR" --path "$averaged" "${decode_flags[@]}"
    --max-len-a 1.5 --max-len-b 50 --max-tokens "${GEN_MAX_TOKENS:-8000}" --gen-subset "$subset" $GEN_DEVICE_FLAGS
    "$@" ${GEN_FLAGS:-})
  if [ "${GENERATE_KEY_ONLY:-0}" = 1 ]; then  # what the output depends on besides the checkpoints' content
    printf '%s\n' "form=$form" "checkpoint=${CHECKPOINT:-average}" "average=$AVERAGE" "${command[@]}"
    [ "$form" = gnmt ] && echo "rerank=gnmt/$LENPEN/$BEAM"
    return 0
  fi
  if [ "${CHECKPOINT:-average}" = best ]; then
    echo "== CHECKPOINT=best: $averaged (best by validation $(best_metric), not averaged)"
    [ "${DRY_RUN:-0}" = 1 ] || [ -f "$averaged" ] || die "no $averaged: has training run?"
  else
    echo "== averaging the last $AVERAGE interval checkpoints of $ckpt on the CPU -> $averaged"
    [ "${DRY_RUN:-0}" = 1 ] || "$PYTHON" "$SCRIPTS/average_checkpoints.py" --inputs "$ckpt" --num-update-checkpoints "$AVERAGE" --output "$averaged"
  fi
  local decoded="$output"
  if [ "$form" = gnmt ]; then
    decoded="$output.nbest"
    echo "== fairseq-generate --gen-subset $subset ${decode_flags[*]} on $DEVICE_DESC ($GEN_DEVICE_FLAGS) -> $decoded," \
      "reranked by GNMT's length penalty ((5+|Y|)/6)^$LENPEN -> $output"
  else
    echo "== fairseq-generate --gen-subset $subset ${decode_flags[*]} on $DEVICE_DESC ($GEN_DEVICE_FLAGS) -> $output"
  fi
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "== --dry-run: would run $(printf '%q ' "${command[@]}" | sed 's/ $//')"
    return 0
  fi
  "${command[@]}" > "$decoded.tmp" 2> "$output.log" \
    || { tail -20 "$output.log" >&2; die "fairseq-generate failed (log: $output.log)"; }
  mv "$decoded.tmp" "$decoded"
  if [ "$form" = gnmt ]; then
    local summary
    summary="$("$PYTHON" "$RECIPE_PY/rerank.py" --generation "$decoded" --out "$output" --form gnmt \
      --alpha "$LENPEN" --beam "$BEAM" 2>&1)" || { echo "$summary" >&2; die "rerank.py failed on $decoded"; }
    echo "$summary" | sed 's/^/   /'
  else
    grep "Generate test\|BLEU" "$output" | tail -1 | sed 's/^/   /' || true
  fi
}

# what checkpoint_best.pt is best by: validation BLEU where train.sh ran with EVAL_BLEU=1, else loss
best_metric() {
  if grep -qs "^TRAINED_BEST_METRIC=bleu" "$OUT/train.env"; then echo bleu; else echo loss; fi
}

# the results label's checkpoint: avg=N (the last N interval checkpoints averaged, the default) or
# ckpt=best-by-bleu / best-by-loss (CHECKPOINT=best)
checkpoint_label() {
  case "${CHECKPOINT:-average}" in
    average) echo "avg=$AVERAGE" ;;
    best) echo "ckpt=best-by-$(best_metric)" ;;
    *) die "CHECKPOINT must be average (the last AVERAGE interval checkpoints) or best (checkpoint_best.pt), got '$CHECKPOINT'" ;;
  esac
}

remove_bpe_flag() { if [ "$BPE" = sentencepiece ]; then echo "--remove-bpe=sentencepiece"; else echo "--remove-bpe"; fi; }

evaluate_model() {
  BEAM="${BEAM:-4}"
  LENPEN="${LENPEN:-0.6}"
  LENPEN_FORM="${LENPEN_FORM:-fairseq}"
  RESULTS="${RESULTS:-results/$RECIPE.txt}"
  local gen="$OUT/generate.$TEST_NAME.txt"
  checkpoint_label > /dev/null
  check_finished
  average_and_generate "$DATA/data-bin" test "$gen" "$(remove_bpe_flag)"
  [ "${DRY_RUN:-0}" = 1 ] && return 0
  # the model's label, from the checkpoint (compare.sh names its report's rows by it)
  local enc_label; enc_label="$(encoding_label)"
  printf '%s\n' "$enc_label" > "$OUT/label.$TEST_NAME.txt"
  echo "== BLEU on $TEST_NAME -> $RESULTS"
  # shellcheck disable=SC2086
  "$PYTHON" "$RECIPE_PY/scoring.py" score --generation "$gen" --lang "$TGT" --ref "$DATA/test.raw.$TGT" ${SCORE_FLAGS:-} \
    --label "$RECIPE $SRC-$TGT enc=$enc_label${POSITION_BLOCKS:+ blocks=$POSITION_BLOCKS}${SEED:+ seed=$SEED} arch=$ARCH $TEST_NAME beam=$BEAM lenpen=$LENPEN lenpen_form=$LENPEN_FORM $(checkpoint_label)$UNFINISHED" \
    --results "$RESULTS" --json "$OUT/bleu.$TEST_NAME.json"
  # FLOATER's control (VANILLA_CONTINUED=1 at training), scored beside it: FLOATER's difference
  # from it is what FLOATER does, its difference from the baseline also holds the extra updates
  if warm_started "$ENC" && [ -f "$OUT/vanilla_continued/checkpoint_last.pt" ]; then
    local control="$OUT/vanilla_continued"
    CKPT_DIR="$control" average_and_generate "$DATA/data-bin" test "$control/generate.$TEST_NAME.txt" "$(remove_bpe_flag)"
    echo "== BLEU of FLOATER's control (the vanilla model trained on with FLOATER's schedule) -> $RESULTS"
    # shellcheck disable=SC2086
    "$PYTHON" "$RECIPE_PY/scoring.py" score --generation "$control/generate.$TEST_NAME.txt" --lang "$TGT" ${SCORE_FLAGS:-} \
      --ref "$DATA/test.raw.$TGT" --results "$RESULTS" --json "$control/bleu.$TEST_NAME.json" \
      --label "$RECIPE $SRC-$TGT enc=vanilla_continued(control of $ENC) arch=$ARCH $TEST_NAME beam=$BEAM lenpen=$LENPEN lenpen_form=$LENPEN_FORM $(checkpoint_label)$UNFINISHED"
  fi
}

# FLOATER's warm-start protocol: train_warm_started
. "$ROOT/recipes/floater/protocol.sh"
