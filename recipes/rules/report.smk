# The study's report: the score lines of every model (results.txt), the table per bin of source
# length over seeds (bleu_by_length.*: with a split or report.bins), or the demo's tables.
EVALUATED = [STUDY.model_dir(m) for m in STUDY.evaluated()]
# the rows in the order of models.encodings, then FLOATER's control and the students; seeds in order
EVALUATED.sort(key=lambda d: [m.name for m in STUDY.evaluated()].index(os.path.basename(os.path.dirname(d))))
STUDY_JSON = OUT + "/study.json"
LENGTH_REPORT = bool(STUDY.split or STUDY.config["report"].get("bins"))

if STUDY.config["corpus"]["name"] == "toy":
    REPORT_FILES = [OUT + "/results.md", OUT + "/results.json"]
else:
    REPORT_FILES = [OUT + "/results.txt"] + ([OUT + "/bleu_by_length.md"] if LENGTH_REPORT else [])


rule study_config:
    # the configuration the report reads (its title, seeds, baseline, bins)
    output:
        STUDY_JSON,
    params:
        config=json.dumps(STUDY.config, sort_keys=True),
    run:
        with open(output[0], "w", encoding="utf-8") as f:
            f.write(params.config)


rule results:
    input:
        [d + "/score.txt" for d in EVALUATED],
        scripts=scripts(f"{RECIPE_PY}/report.py"),
    output:
        report(OUT + "/results.txt", category="scores"),
    log:
        OUT + "/logs/results.log",
    params:
        models=EVALUATED,
    shell:
        "{PY} {RECIPE_PY}/report.py results --models {params.models} --out {output} 2>&1 | tee {log}"


rule length_report:
    input:
        study=STUDY_JSON,
        files=[d + f for d in EVALUATED for f in ("/test.detok.txt", "/label.txt", "/test.log", "/averaged.pt",
                                                  "/trained.json")],
        scripts=scripts(f"{RECIPE_PY}/report.py"),
    output:
        report(OUT + "/bleu_by_length.md", category="BLEU by source length"),
        OUT + "/bleu_by_length.json",
        report(OUT + "/bleu_by_length.png", category="BLEU by source length"),
    log:
        OUT + "/logs/length_report.log",
    params:
        models=EVALUATED,
    shell:
        "{PY} {RECIPE_PY}/report.py length --study {input.study} --models {params.models} --out {OUT}/bleu_by_length "
        "2>&1 | tee {log}"


rule demo_report:
    input:
        study=STUDY_JSON,
        files=[d + f for d in EVALUATED for f in ("/test.txt", "/label.txt", "/averaged.pt", "/trained.json")],
        scripts=scripts(f"{RECIPE_PY}/report.py"),
    output:
        report(OUT + "/results.md", category="results"),
        OUT + "/results.json",
        report(OUT + "/bleu_by_length.png", category="results"),
    log:
        OUT + "/logs/demo_report.log",
    params:
        models=EVALUATED,
    shell:
        "{PY} {RECIPE_PY}/report.py demo --study {input.study} --models {params.models} --out {OUT} 2>&1 | tee {log}"
