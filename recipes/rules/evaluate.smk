# Evaluation of every trained model: average its last checkpoints, label the average (from the
# model itself: python -m fairseq_posenc.labels), decode each test set, score it. A test set's
# decodes go to OUT/WHERE/NAME/seedS (corpus.TestSet.where): beside the model (OUT/models) for the
# corpus's or the split's test set, OUT/tests/TEST for each named test set of a files corpus.
MODEL_DIR = OUT + "/models/{name}/seed{seed}"
TEST_DIR = OUT + "/{where}/{name}/seed{seed}"
TESTS = {test.where: test for test in STUDY.test_sets()}


wildcard_constraints:
    where="|".join(re.escape(where) for where in TESTS),
    name=r"[^/]+",


def _test(wildcards):
    return TESTS[wildcards.where]


def _model_file(name):
    return lambda w: os.path.join(OUT, "models", w.name, f"seed{w.seed}", name)


def _decoding(test):
    """fairseq-generate's flags for ``test``, each flag with its value one string, less the
    checkpoint and the data (inputs) and the plugin's directory (code: the model's key): the decode
    job's params, compared one by one, so that a changed setting reruns the decode and its dry-run
    reason names that flag, old and new."""
    command = wf.generate_command(STUDY, "", test)[2:]  # fairseq-generate DATA ...
    flags = []
    for word in command:
        if word.startswith("--"):
            flags.append(word)
        else:
            flags[-1] += f" {word}"
    return [flag for flag in flags if flag.split()[0] not in ("--path", "--user-dir")]


DECODING = len(_decoding(next(iter(TESTS.values()))))


def _average_count(wildcards):
    return STUDY.average(_model(wildcards))


rule average:
    input:
        record=MODEL_DIR + "/trained.json",
        scripts=scripts(f"{SCRIPTS}/average_checkpoints.py"),
    output:
        MODEL_DIR + "/averaged.pt",
    log:
        MODEL_DIR + "/average.log",
    params:
        number=_average_count,
        kind=STUDY.evaluate["checkpoints"],
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "{PY} {SCRIPTS}/average_checkpoints.py --inputs $(dirname {input.record})/checkpoints "
        "--num-{params.kind}-checkpoints {params.number} --output {output} > {log} 2>&1 "
        "|| {{ tail -20 {log} >&2; exit 1; }}"


rule label:
    # the report's name of the model, read from its averaged checkpoint (fairseq_posenc/labels.py);
    # FLOATER's control is the sinusoidal model trained on: its row says so
    input:
        checkpoint=MODEL_DIR + "/averaged.pt",
        scripts=scripts(os.path.join(REPO, "fairseq_posenc", "labels.py")),
    output:
        MODEL_DIR + "/label.txt",
    log:
        MODEL_DIR + "/label.log",
    params:
        role=lambda w: {"control": wf.CONTROL, "distilled": "distilled"}.get(_model(w).kind, ""),
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "label=$({PY} -m fairseq_posenc.labels {input.checkpoint} 2> {log}) || {{ cat {log} >&2; exit 1; }}; "
        "case '{params.role}' in "
        "  '') echo \"$label\" ;; "
        "  {wf.CONTROL}) [ \"$label\" = sinusoidal ] || {{ echo \"control: $label, not sinusoidal\" >&2; exit 1; }}; "
        "     echo {wf.CONTROL} ;; "
        "  *) echo \"{params.role} $label\" ;; "
        "esac > {output}"


rule test_model:
    # a named test set's directory holds its model's label and record and a link to its average:
    # what the report reads to name the rows
    input:
        label=_model_file("label.txt"),
        record=_model_file("trained.json"),
        averaged=_model_file("averaged.pt"),
    output:
        label=OUT + "/tests/{test}/{name}/seed{seed}/label.txt",
        record=OUT + "/tests/{test}/{name}/seed{seed}/trained.json",
        averaged=OUT + "/tests/{test}/{name}/seed{seed}/averaged.pt",
    log:
        OUT + "/tests/{test}/{name}/seed{seed}/test_model.log",
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "(cp {input.label} {output.label} && cp {input.record} {output.record} && "
        "ln -sfr {input.averaged} {output.averaged}) > {log} 2>&1 || {{ cat {log} >&2; exit 1; }}"


rule decode:
    input:
        checkpoint=_model_file("averaged.pt"),
        data=lambda w: STUDY.test_data_bin(_test(w)),
        scripts=scripts(f"{WORKFLOW_PY}/rerank.py") if STUDY.evaluate["lenpen_form"] == "gnmt" else [],
    output:
        TEST_DIR + "/test.txt",
    log:
        TEST_DIR + "/test.log",
    params:
        *[lambda w, i=i: _decoding(_test(w))[i] for i in range(DECODING)],
        # GNMT's length penalty is rerank.py's, not a flag of fairseq-generate
        reranked=f"rerank.py --form gnmt --alpha {STUDY.evaluate['lenpen']}"
        if STUDY.evaluate["lenpen_form"] == "gnmt" else "rerank.py not run",
        # derived from the input: left out of Snakemake's params trigger (the params above are it)
        command=lambda w, input: wf.generate_command(STUDY, input.checkpoint, _test(w)),
        gnmt=lambda w, input: STUDY.evaluate["lenpen_form"] == "gnmt",
        rerank=lambda w, input: f"--form gnmt --alpha {STUDY.evaluate['lenpen']} --beam {STUDY.evaluate['beam']}",
    threads: int(STUDY.train["threads"])
    resources:
        gpus=1 if GPU else 0,  # one GPU where Snakemake runs the jobs itself (train.smk)
        gres="gpu:1" if GPU else None,
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "if [ {params.gnmt} = True ]; then "
        "  OMP_NUM_THREADS={threads} {params.command:q} > {output}.nbest 2> {log} && "
        "  {PY} {WORKFLOW_PY}/rerank.py --generation {output}.nbest --out {output} {params.rerank}; "
        "else OMP_NUM_THREADS={threads} {params.command:q} > {output} 2> {log}; fi"


rule detok:
    # H- and T- lines as detokenized words for the length report; S- lines stay in the bins' unit
    input:
        generation=TEST_DIR + "/test.txt",
        scripts=scripts(f"{WORKFLOW_PY}/scoring.py"),
    output:
        TEST_DIR + "/test.detok.txt",
    log:
        TEST_DIR + "/detok.log",
    params:
        bpe=wf.segmentation(STUDY),
        lang=STUDY.tgt,
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "{PY} {WORKFLOW_PY}/scoring.py detok-generation --generation {input.generation} --lang {params.lang} --bpe {params.bpe} "
        "--out {output} > {log} 2>&1 || {{ tail -20 {log} >&2; exit 1; }}"


def _reference(wildcards):
    """--ref of a test set: its raw references; none (the T- lines, detokenized) for the split's
    long pairs (training pairs, no raw reference kept) and for text given tokenized."""
    test = _test(wildcards)
    if (STUDY.split and test.where == "models") or STUDY.config["corpus"].get("tokenize") == "none":
        return ""
    return "--ref " + STUDY.test_reference(test)


rule score:
    # SacreBLEU (detokenized, with its signature) and tokenized BLEU, as the papers report them:
    # against the test set's raw references, or with a split against the long pairs' own
    # references (the T- lines: the split's test set is made of training pairs)
    input:
        generation=TEST_DIR + "/test.txt",
        label=_model_file("label.txt"),
        refs=lambda w: _reference(w).split()[1:],
        scripts=scripts(f"{WORKFLOW_PY}/scoring.py"),
    output:
        lines=TEST_DIR + "/score.txt",
        json=TEST_DIR + "/score.json",
    log:
        TEST_DIR + "/score.log",
    params:
        ref=_reference,
        bpe=wf.segmentation(STUDY),
        lang=STUDY.tgt,
        lowercase="--lowercase" if STUDY.evaluate["lowercase"] else "",
        what=lambda w: (f"{STUDY.corpus_name} {STUDY.pair} seed={w.seed} arch={STUDY.arch} "
                        f"{_test(w).name} beam={STUDY.evaluate['beam']} lenpen={STUDY.evaluate['lenpen']} "
                        f"lenpen_form={STUDY.evaluate['lenpen_form']} avg={STUDY.average(_model(w))}"),
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "{PY} {WORKFLOW_PY}/scoring.py score --generation {input.generation} --lang {params.lang} {params.ref} "
        "--bpe {params.bpe} {params.lowercase} --label \"enc=$(cat {input.label}) {params.what}\" "
        "--results {output.lines} --json {output.json} 2>&1 | tee {log}"
