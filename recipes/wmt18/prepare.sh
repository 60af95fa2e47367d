#!/usr/bin/env bash
# WMT18 as in DIET: Europarl v7 + Common Crawl + News Commentary v13, validation newstest2017,
# test newstest2018, for one pair: en-de, de-en, en-cs or cs-en. Archives from ./sources
# (downloaded, or taken from --raw-dir), sacremoses, joint BPE, clean, fairseq-preprocess.
#
#   bash recipes/wmt18/prepare.sh --pair en-de [--raw-dir DIR] [--out data/wmt18_en_de]
#
#   --pair P        en-de (default), de-en, en-cs, cs-en
#   --raw-dir DIR   the archives were downloaded elsewhere: read them from DIR, download nothing
#                   (the two test archives are both called test.tgz on statmt.org: keep them as
#                   wmt17-test.tgz and wmt18-test.tgz)
#   --out DIR       where everything goes (default data/wmt18_<src>_<tgt>)
#   --valid V       newstest2017 (default, as DIET) or split (every 100th training pair, as fairseq)
#   env: ARCHIVES (data/archives: the four pairs share one download), MIRROR (as wmt14_en_de)
#   env: BPE=subword-nmt|sentencepiece (subword-nmt), BPE_SIZE (40000), WORKERS
#
# A re-run skips the steps that finished (markers in DIR/.done/).
set -euo pipefail
VALID_NAME=newstest2017 TEST_NAME=newstest2018 RECIPE=wmt18
VALID="${VALID:-newstest2017}" VALID_EVERY=100  # DIET validated on newstest2017; --valid split as fairseq
SOURCES="$(dirname "${BASH_SOURCE[0]}")/sources"
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
PAIR="${PAIR:-en-de}" PAIR_CHOICES=1
parse_prepare_args "$@"
. "$(dirname "${BASH_SOURCE[0]}")/pair.sh"
prepare_corpus
