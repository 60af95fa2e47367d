# Preparing the study's corpus: the demo's generated pair, or a corpus's archives (a files corpus:
# the user's own files) -> plain text -> tokens -> subwords -> fairseq-preprocess, as fairseq's
# prepare-*.sh scripts make them (recipes/posenc_workflow/prepare.py). Each rule's params hold the
# settings it runs with, its inputs the sources file, the archives (or files) and the scripts it
# runs: an edit of any redoes it and what follows. The disk check before the text is written
# (plan.py prepare-space) is no input: it changes no output.
import re
import shlex

from posenc_workflow.corpus import Corpus

DATA = STUDY.data
try:
    CORPUS = Corpus.of(STUDY)
except wf.ConfigError as error:
    raise WorkflowError(f"configuration refused: {error}") from None

if CORPUS.style == "toy":

    rule toy_corpus:
        input:
            scripts=scripts(f"{WORKFLOW_PY}/toy_corpus.py"),
        output:
            directory(DATA + "/data-bin"),
        params:
            toy=json.dumps(STUDY.config["corpus"]["toy"], sort_keys=True),
        log:
            DATA + "/logs/toy_corpus.log",
        shell:
            "{PY} {WORKFLOW_PY}/toy_corpus.py --settings {params.toy:q} --out {DATA} 2>&1 | tee {log}"

elif CORPUS.style == "files":

    # on the submitting host: a sacrebleu test set may be downloaded
    localrules: gather

    rule gather:
        # the user's files (and sacrebleu's test sets by name) as DATA/raw/SPLIT.{src,tgt}
        input:
            files=CORPUS.own_files(),
            scripts=scripts(f"{WORKFLOW_PY}/prepare.py"),
        output:
            [f"{DATA}/raw/{split}.{lang}" for split in CORPUS.splits() for lang in CORPUS.langs],
        params:
            settings=CORPUS.gather_settings(),
            space=f"--raw-text {shlex.join(CORPUS.own_files())}" if CORPUS.own_files() else "",
        log:
            DATA + "/logs/gather.log",
        shell:
            "({PY} {WORKFLOW_PY}/plan.py prepare-space --work {DATA} {params.space} && "
            "{PY} {WORKFLOW_PY}/prepare.py gather --data {DATA} --settings {params.settings:q}) 2>&1 | tee {log}"

    RAW = rules.gather.output

    rule prepare_test:
        # a named test set, apart from the corpus: its files (or sacrebleu's set) tokenized and
        # segmented with the corpus's BPE, binarized with its dictionaries. Adding, removing or
        # renaming one runs its own job and nothing of the corpus; another BPE or dictionary (the
        # corpus prepared again) redoes it
        input:
            files=lambda w: CORPUS.test_files(w.test),
            bpe=CORPUS.bpe_model(),
            data=DATA + "/data-bin",
            scripts=scripts(f"{WORKFLOW_PY}/prepare.py"),
        output:
            data=directory(OUT + "/tests/{test}/data/data-bin"),
            refs=[OUT + "/tests/{test}/data/test.raw." + lang for lang in CORPUS.langs],
        params:
            settings=lambda w: CORPUS.test_settings(w.test),
        wildcard_constraints:
            test="|".join(re.escape(t.name) for t in CORPUS.tests),
        log:
            OUT + "/logs/prepare_test.{test}.log",
        shell:
            "{PY} {WORKFLOW_PY}/prepare.py test --data {DATA} --out {OUT}/tests/{wildcards.test}/data "
            "--settings {params.settings:q} 2>&1 | tee {log}"

    # on the submitting host: a sacrebleu test set may be downloaded
    localrules: prepare_test

else:

    # how the archives are fetched and checked (corpus.download, .download_timeout, .mirror,
    # .verify_checksums): in the commands, not params, so that another timeout prepares nothing again
    DOWNLOAD = shlex.join(CORPUS.download_command())
    VERIFY = shlex.join(CORPUS.verify_command())
    SPACE = shlex.join(CORPUS.space_command())

    # on the submitting host, also under the SLURM profile: a download needs the internet, which
    # compute nodes often lack, and the extraction reads the archives where they were put
    localrules: download, extract

    rule download:
        # one job per missing archive of the sources file (corpus.download: false fails it, naming
        # where to put the archive). An archive that is there runs nothing. Write-protected once
        # downloaded: Snakemake deletes a job's outputs before running it again, which no change
        # of the workflow may do to an archive
        output:
            protected(os.path.join(STUDY.config["corpus"]["archives"], "{archive}")),
        wildcard_constraints:
            archive="|".join(re.escape(name) for name in CORPUS.archive_names()),
        retries: 1
        log:
            DATA + "/logs/download/{archive}.log",
        shell:
            "{PY} {WORKFLOW_PY}/wmt_data.py {DOWNLOAD} --only {wildcards.archive:q} 2>&1 | tee {log}"

    rule extract:
        # the archives checked (their published checksums; IWSLT's recorded at its first use), then
        # their members as plain text
        input:
            sources=CORPUS.sources,
            archives=CORPUS.archive_paths(),
            scripts=scripts(f"{WORKFLOW_PY}/wmt_data.py"),
        output:
            [f"{DATA}/raw/{split}.{lang}" for split in CORPUS.splits() for lang in CORPUS.langs],
        params:
            command=CORPUS.extract_command(),
        log:
            DATA + "/logs/extract.log",
        shell:
            "({PY} {WORKFLOW_PY}/wmt_data.py {VERIFY} && {PY} {WORKFLOW_PY}/plan.py prepare-space {SPACE} && "
            "{PY} {WORKFLOW_PY}/wmt_data.py {params.command:q}) 2>&1 | tee {log}"

    RAW = rules.extract.output


if CORPUS.style != "toy":

    rule tokenize:
        input:
            RAW,
            scripts=scripts(f"{WORKFLOW_PY}/prepare.py"),
        output:
            [f"{DATA}/tok/{split}.{lang}" for split in CORPUS.splits() for lang in CORPUS.langs],
        params:
            settings=CORPUS.tokenize_settings(),
        threads: CORPUS.workers
        log:
            DATA + "/logs/tokenize.log",
        shell:
            "{PY} {WORKFLOW_PY}/prepare.py tokenize --data {DATA} --settings {params.settings:q} --workers {threads} "
            "2>&1 | tee {log}"

    rule segment:
        input:
            rules.tokenize.output,
            scripts=scripts(f"{WORKFLOW_PY}/prepare.py"),
        output:
            [f"{DATA}/{split}.{lang}" for split in CORPUS.splits(valid=True) for lang in CORPUS.langs]
            + [f"{DATA}/train.tok.{lang}" for lang in CORPUS.langs]
            + [f"{DATA}/{test.prefix}.raw.{lang}" for test in CORPUS.corpus_tests for lang in CORPUS.langs]
            + [CORPUS.bpe_model()],
        params:
            settings=CORPUS.segment_settings(),
        threads: CORPUS.workers
        log:
            DATA + "/logs/segment.log",
        shell:
            "{PY} {WORKFLOW_PY}/prepare.py segment --data {DATA} --settings {params.settings:q} --workers {threads} "
            "2>&1 | tee {log}"

    rule binarize:
        input:
            rules.segment.output,
            scripts=scripts(f"{WORKFLOW_PY}/prepare.py"),
        output:
            directory(DATA + "/data-bin"),
        params:
            settings=CORPUS.binarize_settings(),
        threads: CORPUS.workers
        log:
            DATA + "/logs/binarize.log",
        shell:
            "{PY} {WORKFLOW_PY}/prepare.py binarize --data {DATA} --settings {params.settings:q} --workers {threads} "
            "2>&1 | tee {log} && printf '%s\\n' {RECORD:q} > {DATA}/prepared.json"

    # which study prepared DATA, with what: another study's settings are refused there (not its own
    # edits, which prepare it again); in the command, not params: another study preparing nothing
    # again must not rewrite it
    RECORD = json.dumps({"study": OUT, "preparation": CORPUS.preparation()}, sort_keys=True)
    if workflow.is_main_process:
        try:
            CORPUS.check_owner(OUT)
        except ValueError as error:
            raise WorkflowError(f"configuration refused: {error}") from None


if STUDY.split:

    rule length_split:
        # short-to-long: training and validation pairs below split.train_below, test pairs binned by length
        input:
            [f"{DATA}/{part}.{lang}" for part in ("train", "valid", "train.tok") for lang in CORPUS.langs],
            data=DATA + "/data-bin",
            scripts=scripts(f"{WORKFLOW_PY}/short_to_long.py"),
        output:
            directory(OUT + "/split/data-bin"),
        params:
            settings=json.dumps(STUDY.split, sort_keys=True),
            corpus=CORPUS.settings_json(),
        threads: CORPUS.workers
        log:
            OUT + "/logs/length_split.log",
        shell:
            "{PY} {WORKFLOW_PY}/short_to_long.py --data {DATA} --out {OUT}/split --settings {params.settings:q} "
            "--corpus {params.corpus:q} --workers {threads} 2>&1 | tee {log}"
