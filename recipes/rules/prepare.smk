# Preparing the study's corpus: the demo's generated pair, or a corpus's archives -> plain text ->
# tokens -> subwords -> fairseq-preprocess, as fairseq's prepare-*.sh scripts make them
# (fairseq_posenc/recipe/prepare.py). Each rule's params hold the settings it runs with, its
# inputs the sources file and the archives: an edit of either redoes it and what follows.
from fairseq_posenc.recipe import prepare as prep

DATA = STUDY.data
CORPUS = prep.Corpus.of(STUDY)

if CORPUS.style == "toy":

    rule toy_corpus:
        output:
            directory(DATA + "/data-bin"),
        params:
            toy=json.dumps(STUDY.config["corpus"]["toy"], sort_keys=True),
        shell:
            "{PY} {RECIPE_PY}/prepare.py toy --settings {params.toy:q} --out {DATA}"

else:

    rule fetch:
        # check every archive the sources file names, downloading what is missing (corpus.download)
        output:
            CORPUS.archive_paths(),
        params:
            command=CORPUS.fetch_command(),
        retries: 1
        shell:
            "{PY} {RECIPE_PY}/wmt_data.py {params.command:q}"

    rule extract:
        input:
            sources=CORPUS.sources,
            archives=CORPUS.archive_paths(),
        output:
            [f"{DATA}/raw/{split}.{lang}" for split in ("train", "valid", "test") for lang in CORPUS.langs
             if split != "valid" or CORPUS.has_valid],
        params:
            command=CORPUS.extract_command(),
        shell:
            "{PY} {RECIPE_PY}/wmt_data.py {params.command:q}"

    rule tokenize:
        input:
            rules.extract.output,
        output:
            [f"{DATA}/tok/{split}.{lang}" for split in ("train", "valid", "test") for lang in CORPUS.langs
             if split != "valid" or CORPUS.has_valid],
        params:
            settings=CORPUS.tokenize_settings(),
        threads: CORPUS.workers
        shell:
            "{PY} {RECIPE_PY}/prepare.py tokenize --data {DATA} --settings {params.settings:q} --workers {threads}"

    rule segment:
        input:
            rules.tokenize.output,
        output:
            [f"{DATA}/{split}.{lang}" for split in ("train", "valid", "test") for lang in CORPUS.langs]
            + [f"{DATA}/train.tok.{lang}" for lang in CORPUS.langs]
            + [f"{DATA}/test.raw.{lang}" for lang in CORPUS.langs]
            + [CORPUS.bpe_model()],
        params:
            settings=CORPUS.segment_settings(),
        threads: CORPUS.workers
        shell:
            "{PY} {RECIPE_PY}/prepare.py segment --data {DATA} --settings {params.settings:q} --workers {threads}"

    rule binarize:
        input:
            rules.segment.output,
        output:
            directory(DATA + "/data-bin"),
        params:
            settings=CORPUS.binarize_settings(),
        threads: CORPUS.workers
        shell:
            "{PY} {RECIPE_PY}/prepare.py binarize --data {DATA} --settings {params.settings:q} --workers {threads}"


if STUDY.split:

    rule length_split:
        # short-to-long: training and validation pairs below split.train_below, test pairs binned by length
        input:
            [f"{DATA}/{part}.{lang}" for part in ("train", "valid", "train.tok") for lang in CORPUS.langs],
            data=DATA + "/data-bin",
        output:
            directory(OUT + "/split/data-bin"),
        params:
            settings=json.dumps(STUDY.split, sort_keys=True),
            corpus=CORPUS.settings_json(),
        threads: CORPUS.workers
        shell:
            "{PY} {RECIPE_PY}/prepare.py length-split --data {DATA} --out {OUT}/split --settings {params.settings:q} "
            "--corpus {params.corpus:q} --workers {threads}"
