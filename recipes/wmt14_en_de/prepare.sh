#!/usr/bin/env bash
# WMT14 English-German: download (or take from --raw-dir) the archives listed in ./sources,
# normalise and tokenize with sacremoses, learn and apply joint BPE, clean, fairseq-preprocess.
#
#   bash recipes/wmt14_en_de/prepare.sh [--raw-dir DIR] [--out data/wmt14_en_de] [--valid split|newstest2013]
#
#   --raw-dir DIR   the archives were downloaded elsewhere: read them from DIR, download nothing
#   --out DIR       where everything goes (default data/wmt14_en_de; DIR/data-bin for fairseq)
#   --valid V       split (default): every 100th training pair validates and the rest is trained
#                   on, as fairseq's prepare-wmt14en2de.sh (the FLOATER paper's data); newstest2013:
#                   train on every pair, validate on newstest2013
#   env: ARCHIVES (data/archives, shared by every recipe), MIRROR (a mirror of statmt.org: the
#        archives are fetched from MIRROR/FILE), BPE=subword-nmt|sentencepiece (subword-nmt),
#        BPE_SIZE (40000 merges, as fairseq), WORKERS
#
# A re-run checks the archives again and skips the steps that finished with the same settings
# (markers in DIR/.done/); a changed setting (BPE, BPE_SIZE, --valid) redoes its step and the
# ones after it.
set -euo pipefail
RECIPE=wmt14_en_de SRC=en TGT=de VALID_NAME=newstest2013 TEST_NAME=newstest2014
VALID_EVERY=100  # fairseq prepare-wmt14en2de.sh: every 100th training pair validates
SOURCES="$(dirname "${BASH_SOURCE[0]}")/sources"
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
parse_prepare_args "$@"
prepare_corpus
