# FLOATER's training protocol (Liu et al., 2020) as one function of the recipes' shell, sourced by
# recipes/common.sh: recipes/floater/train.sh runs it on its own, every corpus recipe's train.sh
# runs it for ENC=floater or rnn (train_model), in the same shell, so that every setting the
# corpus recipe resolved (its corpus.env, its per-corpus defaults) reaches it unlisted.
#   1. a vanilla (sinusoidal) Transformer, 30 epochs (Appendix B.2), in a directory keyed by its
#      own resolved configuration and shared by every run that starts from the same one (Table
#      2's input/all rows, Table 6's RNN rows): the first trains it, the others wait on its lock
#      and then find it finished; OUT/vanilla links to it;
#   2. the warm-started encoding from its best checkpoint at half the peak lr, FLOATER_EPOCHS;
#   3. with VANILLA_CONTINUED=1, the control: the vanilla model trained on with stage 2's schedule.
# Each stage is a train_stage (see common.sh): decided from its resolved configuration.

# warm_start_dir: where the vanilla stage lives (set VANILLA_DIR to choose; an OUT/vanilla that is
# a directory of an older layout is kept as it is)
_vanilla_dir() {
  local key=$1
  if [ -n "${VANILLA_DIR:-}" ]; then echo "$VANILLA_DIR"
  elif [ -d "$OUT/vanilla" ] && [ ! -L "$OUT/vanilla" ]; then echo "$OUT/vanilla"
  else echo "$(dirname "$OUT")/shared/vanilla-$ARCH-$key"; fi
}

# train_warm_started DATA_BIN (after set_training_defaults)
train_warm_started() {
  local data_bin=$1 name=FLOATER
  warm_started "$ENC" || die "ENC=$ENC: this protocol trains floater or rnn"
  [ "$ENC" = rnn ] && name=RNN
  VANILLA_CONTINUED="${VANILLA_CONTINUED:-0}"
  case "$VANILLA_CONTINUED" in 0|1) ;; *) die "VANILLA_CONTINUED must be 0 or 1, got '$VANILLA_CONTINUED'" ;; esac
  ls "$data_bin"/dict.*.txt >/dev/null 2>&1 || die "no fairseq dictionary in ${DATA_BIN_NAME:-}$data_bin: run fairseq-preprocess first"
  local half_lr; half_lr=$("$PYTHON" -c "print(float('$LR') / 2)")
  echo "== $name protocol ($ARCH): vanilla at lr $LR, $name at lr $half_lr, dropout $DROPOUT -> $OUT"
  plan_training "$data_bin"
  scaling_nmt_flags
  local settings; mapfile -t settings < <(run_settings "$data_bin")
  # the warm-started encoding's own flags (--rnn-*, --floater-*) go to its stage only: the
  # sinusoidal stages refuse them (fairseq_posenc/recipe/flags.py reads them off the configs); and
  # the vanilla stage's key, from its resolved configuration (one fairseq import for both)
  # shellcheck disable=SC2206
  local vanilla_args=("$data_bin" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_sinusoidal_$SUFFIX" --lr "$LR"
    ${MAX_UPDATE:+--max-update $MAX_UPDATE} ${MAX_EPOCH:+--max-epoch $MAX_EPOCH} --keep-interval-updates 1)
  local both own key vanilla split
  # shellcheck disable=SC2086
  split="$("$PYTHON" "$RECIPE_PY/steps.py" stage-key --split-for "$ENC" --flags="$MODEL_FLAGS $EXTRA_FLAGS" \
    --settings "${settings[@]}" stage=vanilla -- "${vanilla_args[@]}" $TRAIN_DEVICE_FLAGS)" || exit 2
  both="$(sed -n 1p <<< "$split")" own="$(sed -n 2p <<< "$split")" key="$(sed -n 3p <<< "$split")"
  # shellcheck disable=SC2206
  vanilla_args+=($both)
  vanilla="$(_vanilla_dir "$key")"
  # the plans added up (PLAN_TOTALS): the vanilla stage counts once for every variant that shares it
  if [ -n "${PLAN_TOTALS:-}" ]; then
    echo "$OUT $TOTAL_UPDATES $CHECKPOINT_DISK $vanilla $STAGE1_END $STAGE1_DISK" >> "$PLAN_TOTALS"
  fi
  echo "== 1/3 vanilla stage: $vanilla (key $key: every run whose vanilla stage resolves to this configuration shares it)"
  if grep -qs '"finished": true' "$vanilla/stage.json"; then
    echo "   it has finished (an earlier run trained it): the plan above counts it, this run trains from stage 2 on"
  fi
  if [ "${DRY_RUN:-0}" = 1 ]; then echo "== --dry-run: nothing trained"; return 0; fi
  mkdir -p "$OUT" "$vanilla"
  # the first node links it (on a shared filesystem the nodes' ln would race); the others use the path
  if [ "${FIRST_NODE:-1}" = 1 ] && [ "$vanilla" != "$OUT/vanilla" ]; then
    ln -sfn "$(cd "$vanilla" && pwd)" "$OUT/vanilla"
  fi

  # the stages that start from it, checked first: a refusal comes before the vanilla stage trains
  # shellcheck disable=SC2206
  local second_args=("$data_bin" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_${ENC}_$SUFFIX"
    --floater-init-from "$vanilla/checkpoint_best.pt" --lr "$half_lr"
    --max-epoch "$FLOATER_EPOCHS" ${FLOATER_MAX_UPDATE:+--max-update $FLOATER_MAX_UPDATE}
    --keep-interval-updates "$AVERAGE" $POSITION_BLOCK_FLAGS $both $own)
  # shellcheck disable=SC2206
  local control_args=("$data_bin" "${FAIRSEQ_FLAGS[@]}" --arch "transformer_sinusoidal_$SUFFIX"
    --finetune-from-model "$vanilla/checkpoint_best.pt" --lr "$half_lr"
    --max-epoch "$FLOATER_EPOCHS" ${FLOATER_MAX_UPDATE:+--max-update $FLOATER_MAX_UPDATE}
    --keep-interval-updates "$AVERAGE" $both)
  if [ "${FIRST_NODE:-1}" = 1 ]; then
    # the stages' configurations, resolved in one process (one fairseq import) into the cache the
    # stage calls below read (fairseq_posenc/recipe/train_config.py: keyed by all they depend on)
    # shellcheck disable=SC2206
    local lists=("${vanilla_args[@]}" --save-dir "$vanilla" $TRAIN_DEVICE_FLAGS
      ::: "${second_args[@]}" --save-dir "$OUT/$ENC" $TRAIN_DEVICE_FLAGS)
    # shellcheck disable=SC2206
    [ "$VANILLA_CONTINUED" = 1 ] && lists+=(::: "${control_args[@]}" --save-dir "$OUT/vanilla_continued" $TRAIN_DEVICE_FLAGS)
    "$PYTHON" "$RECIPE_PY/steps.py" resolve -- "${lists[@]}" || true
  fi
  if [ "${FIRST_NODE:-1}" = 1 ] && [ "${STAGE_ON_CHANGE:-refuse}" = refuse ]; then
    preflight_stage "$OUT/$ENC" "${settings[@]}" stage="$ENC" -- "${second_args[@]}"
    [ "$VANILLA_CONTINUED" = 1 ] && preflight_stage "$OUT/vanilla_continued" "${settings[@]}" stage=vanilla_continued -- "${control_args[@]}"
  fi

  echo "== 1/3 vanilla transformer_sinusoidal_$SUFFIX, lr $LR, ${MAX_EPOCH:+$MAX_EPOCH epochs / }${MAX_UPDATE:+$MAX_UPDATE updates }on $DEVICE_DESC -> $vanilla"
  # one run trains it, the others (another variant started at the same time) wait for it
  local lock
  exec {lock}>"$vanilla.lock"
  if [ "${FIRST_NODE:-1}" = 1 ] && ! flock -n "$lock"; then
    echo "   another run is training $vanilla: waiting for it (lock $vanilla.lock)"
    flock "$lock"
  fi
  # stage 1 keeps checkpoint_best.pt, checkpoint_last.pt and its last interval checkpoint
  train_stage "$vanilla" "" "${settings[@]}" stage=vanilla -- "${vanilla_args[@]}"
  flock -u "$lock"; exec {lock}>&-

  echo "== 2/3 $name warm-started from $OUT/vanilla/checkpoint_best.pt, lr $half_lr, $FLOATER_EPOCHS epochs${FLOATER_MAX_UPDATE:+ / $FLOATER_MAX_UPDATE updates} on $DEVICE_DESC"
  STAGE_ACCEPTED=_write_warm_started_env train_stage "$OUT/$ENC" "$vanilla" "${settings[@]}" stage="$ENC" -- \
    "${second_args[@]}"

  if [ "$VANILLA_CONTINUED" = 1 ]; then
    echo "== 2/3 control: the vanilla model trained on from $OUT/vanilla/checkpoint_best.pt with stage 2's schedule, without $name"
    train_stage "$OUT/vanilla_continued" "$vanilla" "${settings[@]}" stage=vanilla_continued -- "${control_args[@]}"
  fi

  [ "${FIRST_NODE:-1}" = 1 ] || return 0  # the first node averages
  local stage
  for stage in "$ENC" $([ "$VANILLA_CONTINUED" = 1 ] && echo vanilla_continued); do
    echo "== 3/3 averaging the last $AVERAGE interval checkpoints -> $OUT/$stage/averaged_last$AVERAGE.pt"
    "$PYTHON" "$SCRIPTS/average_checkpoints.py" --inputs "$OUT/$stage" \
      --num-update-checkpoints "$AVERAGE" --output "$OUT/$stage/averaged_last$AVERAGE.pt"
  done
}

# what evaluate.sh checks stage 2's last checkpoint against, written once its decision accepted it
_write_warm_started_env() {
  printf 'TRAINED_MAX_UPDATE=%s\nTRAINED_MAX_EPOCH=%s\n' "$FLOATER_MAX_UPDATE" "$FLOATER_EPOCHS" > "$OUT/train.env"
  if [ "${EVAL_BLEU:-0}" = 1 ]; then echo "TRAINED_BEST_METRIC=bleu" >> "$OUT/train.env"; fi
}
