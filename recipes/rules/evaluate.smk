# Evaluation of every trained model: average its last checkpoints, label the average (from the
# model itself: python -m fairseq_posenc.labels), decode the test set, score it.
MODEL_DIR = OUT + "/models/{name}/seed{seed}"


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


rule decode:
    input:
        checkpoint=MODEL_DIR + "/averaged.pt",
        data=STUDY.data_bin(),
        scripts=scripts(f"{RECIPE_PY}/rerank.py") if STUDY.evaluate["lenpen_form"] == "gnmt" else [],
    output:
        MODEL_DIR + "/test.txt",
    log:
        MODEL_DIR + "/test.log",
    params:
        command=lambda w, input: wf.generate_command(STUDY, input.checkpoint),
        gnmt=STUDY.evaluate["lenpen_form"] == "gnmt",
        rerank=f"--form gnmt --alpha {STUDY.evaluate['lenpen']} --beam {STUDY.evaluate['beam']}",
    threads: int(STUDY.train["threads"])
    resources:
        gpus=1 if GPU else 0,  # one GPU where Snakemake runs the jobs itself (train.smk)
        gres="gpu:1" if GPU else None,
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "if [ {params.gnmt} = True ]; then "
        "  OMP_NUM_THREADS={threads} {params.command:q} > {output}.nbest 2> {log} && "
        "  {PY} {RECIPE_PY}/rerank.py --generation {output}.nbest --out {output} {params.rerank}; "
        "else OMP_NUM_THREADS={threads} {params.command:q} > {output} 2> {log}; fi"


rule detok:
    # H- and T- lines as detokenized words for the length report; S- lines stay in the bins' unit
    input:
        generation=MODEL_DIR + "/test.txt",
        scripts=scripts(f"{RECIPE_PY}/scoring.py"),
    output:
        MODEL_DIR + "/test.detok.txt",
    log:
        MODEL_DIR + "/detok.log",
    params:
        bpe=wf.segmentation(STUDY),
        lang=STUDY.tgt,
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "{PY} {RECIPE_PY}/scoring.py detok-generation --generation {input.generation} --lang {params.lang} --bpe {params.bpe} "
        "--out {output} > {log} 2>&1 || {{ tail -20 {log} >&2; exit 1; }}"


rule score:
    # SacreBLEU (detokenized, with its signature) and tokenized BLEU, as the papers report them:
    # against the corpus's raw test references, or with a split against the long pairs' own
    # references (the T- lines: the split's test set is made of training pairs)
    input:
        generation=MODEL_DIR + "/test.txt",
        label=MODEL_DIR + "/label.txt",
        scripts=scripts(f"{RECIPE_PY}/scoring.py"),
    output:
        lines=MODEL_DIR + "/score.txt",
        json=MODEL_DIR + "/score.json",
    log:
        MODEL_DIR + "/score.log",
    params:
        ref="" if STUDY.split else "--ref " + os.path.join(STUDY.data, f"test.raw.{STUDY.tgt}"),
        bpe=wf.segmentation(STUDY),
        lang=STUDY.tgt,
        lowercase="--lowercase" if STUDY.evaluate["lowercase"] else "",
        what=lambda w: (f"{STUDY.corpus_name} {STUDY.pair} seed={w.seed} arch={STUDY.arch} "
                        f"{STUDY.test_set()} beam={STUDY.evaluate['beam']} lenpen={STUDY.evaluate['lenpen']} "
                        f"lenpen_form={STUDY.evaluate['lenpen_form']} avg={STUDY.average(_model(w))}"),
    wildcard_constraints:
        seed=r"\d+",
    shell:
        "{PY} {RECIPE_PY}/scoring.py score --generation {input.generation} --lang {params.lang} {params.ref} "
        "--bpe {params.bpe} {params.lowercase} --label \"enc=$(cat {input.label}) {params.what}\" "
        "--results {output.lines} --json {output.json} 2>&1 | tee {log}"
