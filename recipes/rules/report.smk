# The study's report: the score lines of every model and test set (results.txt), the table per bin
# of source length over seeds (bleu_by_length.*: with a split or report.bins; a files corpus's
# named test set TEST: bleu_by_length.TEST.*), or the demo's tables.
EVALUATED = [STUDY.model_dir(m) for m in STUDY.evaluated()]
# the rows in the order of models.encodings, then FLOATER's control and the students; seeds in order
EVALUATED.sort(key=lambda d: [m.name for m in STUDY.evaluated()].index(os.path.basename(os.path.dirname(d))))
LENGTH_REPORT = bool(STUDY.split or STUDY.config["report"].get("bins"))
# each test set's report files: "" for the corpus's (or the split's) test set, ".TEST" for a named one
SUFFIXES = {("" if test.where == "models" else "." + test.name): test for test in STUDY.test_sets()}


def test_dirs(suffix):
    """The decodes of the test set of ``suffix``, model by model (OUT/WHERE/NAME/seedS)."""
    where = SUFFIXES[suffix].where
    return [os.path.join(OUT, where, *d.split(os.sep)[-2:]) for d in EVALUATED]


if STUDY.config["corpus"]["name"] == "toy":
    REPORT_FILES = [OUT + "/results.md", OUT + "/results.json"]
else:
    REPORT_FILES = [OUT + "/results.txt"] + ([OUT + f"/bleu_by_length{s}.md" for s in SUFFIXES] if LENGTH_REPORT else [])


def report_config(suffix):
    return STUDY.report_config(SUFFIXES[suffix].name if suffix else None)


def _leaves(config, prefix=""):
    """FIELD=VALUE of every leaf: the params Snakemake compares one by one, so that a dry run's
    reason names the field that changed, old and new, not the whole configuration."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}={json.dumps(value, sort_keys=True)}"


rule study_config:
    # the configuration the report reads (report_config), written whole by a param derived from the
    # output (Snakemake leaves such params out of its params trigger); before it a param a field
    output:
        OUT + "/study{suffix}.json",
    wildcard_constraints:
        suffix="(?:" + "|".join(re.escape(s) for s in SUFFIXES) + ")",
    params:
        *[lambda w, i=i: sorted(_leaves(report_config(w.suffix)))[i] for i in range(len(list(_leaves(report_config("")))))],
        config=lambda w, output: json.dumps(report_config(w.suffix), sort_keys=True),
    log:
        OUT + "/logs/study_config{suffix}.log",
    # a shell command, not run: (Snakemake starts a run: job as a Snakemake process of its own,
    # which reads the Snakefile again: seconds for a file of one line)
    shell:
        "printf '%s' {params.config:q} > {output} 2> {log}"


rule results:
    # each score line under its row's name, as the length report names it (from these files)
    input:
        [d + f for s in SUFFIXES for d in test_dirs(s)
         for f in ("/score.txt", "/label.txt", "/averaged.pt", "/trained.json")],
        scripts=scripts(f"{WORKFLOW_PY}/report.py"),
    output:
        report(OUT + "/results.txt", category="scores"),
    log:
        OUT + "/logs/results.log",
    params:
        models=[d for s in SUFFIXES for d in test_dirs(s)],
    shell:
        "{PY} {WORKFLOW_PY}/report.py results --models {params.models} --out {output} 2>&1 | tee {log}"


rule length_report:
    input:
        study=OUT + "/study{suffix}.json",
        files=lambda w: [d + f for d in test_dirs(w.suffix)
                         for f in ("/test.detok.txt", "/label.txt", "/test.log", "/averaged.pt", "/trained.json")],
        scripts=scripts(f"{WORKFLOW_PY}/report.py"),
    output:
        report(OUT + "/bleu_by_length{suffix}.md", category="BLEU by source length"),
        OUT + "/bleu_by_length{suffix}.json",
        report(OUT + "/bleu_by_length{suffix}.png", category="BLEU by source length"),
    log:
        OUT + "/logs/length_report{suffix}.log",
    wildcard_constraints:
        suffix="(?:" + "|".join(re.escape(s) for s in SUFFIXES) + ")",
    params:
        models=lambda w: test_dirs(w.suffix),
    shell:
        "{PY} {WORKFLOW_PY}/report.py length --study {input.study} --models {params.models} "
        "--out {OUT}/bleu_by_length{wildcards.suffix} 2>&1 | tee {log}"


rule demo_report:
    input:
        study=OUT + "/study.json",
        files=[d + f for d in EVALUATED for f in ("/test.txt", "/label.txt", "/averaged.pt", "/trained.json")],
        scripts=scripts(f"{WORKFLOW_PY}/report.py"),
    output:
        report(OUT + "/results.md", category="results"),
        OUT + "/results.json",
        report(OUT + "/bleu_by_length.png", category="results"),
    log:
        OUT + "/logs/demo_report.log",
    params:
        models=EVALUATED,
    shell:
        "{PY} {WORKFLOW_PY}/report.py demo --study {input.study} --models {params.models} --out {OUT} 2>&1 | tee {log}"
