"""What each choice of the schema's enums means (recipes/conf/schema.yaml): ``models.arch``,
``corpus.name``, ``train.recipe``'s ``auto`` values, ``train.precision`` and
``train.share_embeddings`` as fairseq-train flags."""
from typing import NamedTuple


class Arch(NamedTuple):
    """What ``auto`` means for a fairseq architecture of ``models.arch`` (``transformer_ENC_SUFFIX``)."""
    suffix: str
    dropout: float
    lr: float
    max_update: int
    average: int  # checkpoints averaged
    save_interval_updates: int


#: fairseq's architectures per ``models.arch``: Vaswani et al.'s base and big, fairseq's IWSLT
#: example with Wu et al.'s 50k updates; the demo's sizes (models/from_flags.py MODEL_SIZES) train
#: transformer_posenc and have no defaults
ARCHS = {
    "base": Arch("wmt_en_de", dropout=0.1, lr=7e-4, max_update=100000, average=5, save_interval_updates=1250),
    "big": Arch("wmt_en_de_big", dropout=0.3, lr=5e-4, max_update=300000, average=20, save_interval_updates=600),
    "iwslt": Arch("iwslt_de_en", dropout=0.3, lr=5e-4, max_update=50000, average=10, save_interval_updates=1000),
}
#: what every corpus recipe knows of its corpus: languages, the official validation and test
#: sets, fairseq's split of the training pairs, how fairseq's own scripts prepare it, and its
#: published size (training pairs by the languages of the pair; the plan's estimate before the
#: corpus is prepared): WMT14 by Vaswani et al. (4.5M En-De, 36M En-Fr), WMT18 by its parts
#: (Europarl v7, Common Crawl, News Commentary v13: about 4.6M de-en, 1.0M cs-en), IWSLT'14 by
#: fairseq's examples/translation (160k)
CORPORA = {
    "wmt14_en_de": dict(pair="en-de", valid_name="newstest2013", test_name="newstest2014", valid_every=100,
                        bpe_size=40000, valid="split", style="wmt", train_pairs={"de-en": 4_500_000}),
    "wmt14_en_fr": dict(pair="en-fr", valid_name="newstest2013", test_name="newstest2014", valid_every=1333,
                        bpe_size=40000, valid="split", style="wmt", train_pairs={"en-fr": 36_000_000}),
    "wmt18": dict(pair="en-de", valid_name="newstest2017", test_name="newstest2018", valid_every=100,
                  bpe_size=40000, valid="newstest2017", style="wmt", pairs=("en-de", "de-en", "en-cs", "cs-en"),
                  train_pairs={"de-en": 4_600_000, "cs-en": 1_000_000}),
    "iwslt14_de_en": dict(pair="de-en", valid_name="split", test_name="dev2010_dev2012_tst2010-2012",
                          valid_every=23, bpe_size=10000, valid="split", style="iwslt", train_pairs={"de-en": 160_000}),
    # your own files (corpus.train, .valid, .test): prepared as WMT's, 10k BPE merges as IWSLT's
    "files": dict(pair=None, valid_name="split", test_name=None, valid_every=100, bpe_size=10000, valid="split",
                  style="files", train_pairs={}),
    "toy": dict(pair="src-tgt", valid_name="valid", test_name="test", valid_every=0, bpe_size=0, valid="valid",
                style="toy", train_pairs={}),
}
#: what ``auto`` means for the train settings each recipe sets its own way: Ott et al.'s
#: scaling_nmt flags (large_batch: 250 warmup updates, fairseq's examples/scaling_nmt), the demo's
#: toy flags (recipes/posenc_workflow/pipeline.py toy_train_flags; None: not passed, fairseq's own default)
RECIPE_AUTO = {
    "scaling_nmt": {"warmup_updates": 4000, "warmup_init_lr": 1e-7, "adam_eps": 1e-9},
    "toy": {"warmup_updates": 100, "warmup_init_lr": None, "adam_eps": None, "dropout": 0.1, "max_tokens": 2000,
            "update_freq": None},
}
#: train.precision: fairseq-train's flags on GPUs
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"],
                   "memory-efficient-fp16": ["--memory-efficient-fp16"]}
SHARE_FLAGS = {"all": ["--share-all-embeddings"], "decoder": ["--share-decoder-input-output-embed"]}
