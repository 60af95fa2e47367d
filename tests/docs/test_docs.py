"""The docs cannot rot: every flag and recipe variable that README.md, recipes/README.md and
docs/*.md show in a command is one the program knows.

Commands are taken from ```bash blocks (continuation lines joined, comments dropped, split at ;,
&&, || and |) and from inline code that starts with a program (`fairseq-train ...`,
`python scripts/...`, `bash recipes/...`, `make ...`). fairseq's CLIs are checked against
fairseq's own parser with the plugin registered, extended for the command's --arch, --task,
--criterion, --optimizer and --lr-scheduler as fairseq-train extends it; the plugin's scripts
and torchrun against their --help; the recipes' entry points (recipes/*/run.sh) for their study
files, Snakemake's own options (its --help) and --config keys (recipes/conf/schema.yaml), with no
variable of their own; make targets and variables against the Makefile; pytest's test files
against the tests/ folder and its flags against its --help.
Launchers and shell built-ins that run another command (srun, cd, export, ...) are skipped by name.
"""
import functools
import os
import re
import shlex
import subprocess
import sys

import pytest
from fairseq import options

import fairseq_posenc  # noqa: F401  (registers the plugin's models, criterions and flags)
from helpers.doc_commands import DOCS, REPO, block_commands, simple_commands

FAIRSEQ_PARSERS = {
    "fairseq-train": lambda: options.get_training_parser(),
    "fairseq-generate": lambda: options.get_generation_parser(),
    "fairseq-interactive": lambda: options.get_interactive_generation_parser(),
    "fairseq-validate": lambda: options.get_validation_parser(),
    "fairseq-preprocess": lambda: options.get_preprocessing_parser(),
}
# programs whose arguments are another command or nothing this checker can know
SKIPPED = {"sbatch", "cd", "set", "for", "done", "fi", "if", "echo", "ls", "cat", "mkdir", "cp", "rm", "pip", "git",
           "nvidia-smi", "du", "df", "sacrebleu", "true"}
# words that run the command after them (srun's own options, if any, first)
PREFIXES = {"do", "then", "else", "srun", "time", "nohup", "valgrind"}
# variables of the environment, not of the recipes: the shell's, CUDA's, torch's, OpenMP's
ENVIRONMENT = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "CI", "PATH", "PYTHONPATH"}
PLACEHOLDER = re.compile(r"^(\.\.\.|…|\$.*|<.*>)$")


def _inline_commands(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.match(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*(fairseq-(train|generate|interactive|validate|preprocess)\b|"
                    r"python3? scripts/|bash recipes/|make )", span):
            yield span


def doc_commands():
    """(file, tokens) of every command the docs show."""
    found = []
    for doc in DOCS:
        text = open(os.path.join(REPO, doc), encoding="utf-8").read()
        found += [(doc, tokens) for tokens in block_commands(text)]
        for span in _inline_commands(text):
            found += [(doc, tokens) for tokens in simple_commands(span)]
    return found


def _flags(tokens):
    return [t.split("=", 1)[0] for t in tokens if re.match(r"^--[A-Za-z]", t)]


def _value(tokens, flag, default):
    for i, t in enumerate(tokens):
        if t == flag and i + 1 < len(tokens) and not PLACEHOLDER.match(tokens[i + 1]):
            return tokens[i + 1]
        if t.startswith(flag + "="):
            return t.split("=", 1)[1]
    return default


@functools.lru_cache(maxsize=None)
def _fairseq_options(program, arch, task, criterion, optimizer, scheduler):
    parser = FAIRSEQ_PARSERS[program]()
    argv = ["data-bin", "--task", task]
    if program in ("fairseq-train",):
        argv += ["--arch", arch, "--criterion", criterion, "--optimizer", optimizer, "--lr-scheduler", scheduler]
    if program != "fairseq-preprocess":
        options.parse_args_and_arch(parser, argv, parse_known=True)
    return frozenset(parser._option_string_actions)


def fairseq_unknown(program, tokens):
    known = _fairseq_options(program, _value(tokens, "--arch", "transformer_posenc"),
                             _value(tokens, "--task", "translation"),
                             _value(tokens, "--criterion", "label_smoothed_cross_entropy"),
                             _value(tokens, "--optimizer", "adam"), _value(tokens, "--lr-scheduler", "inverse_sqrt"))
    return [f for f in _flags(tokens) if f not in known]


@functools.lru_cache(maxsize=None)
def _help_flags(*command):
    proc = subprocess.run(list(command) + ["--help"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{' '.join(command)} --help failed:\n{proc.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", proc.stdout))


def script_unknown(tokens):
    script = tokens[0]
    path = os.path.join(REPO, script)
    if not os.path.isfile(path):
        return [f"{script} (no such script)"]
    command = (sys.executable, path)
    subcommand = next((t for t in tokens[1:2] if re.match(r"^[a-z][\w-]*$", t)), None)
    known = _help_flags(*command)
    if subcommand and "{" in subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=REPO).stdout:
        known = known | _help_flags(*command, subcommand)
    return [f for f in _flags(tokens[1:]) if f not in known]


@functools.lru_cache(maxsize=None)
def _snakemake_flags():
    return _help_flags(os.path.join(os.path.dirname(sys.executable), "snakemake"))


@functools.lru_cache(maxsize=None)
def _config_keys():
    import yaml

    with open(os.path.join(REPO, "recipes", "conf", "schema.yaml"), encoding="utf-8") as f:
        return frozenset(yaml.safe_load(f)["properties"])


def recipe_unknown(variables, tokens):
    """recipes/CORPUS/run.sh [STUDY.yaml|.yml...] [snakemake options]: the files exist, the options are
    Snakemake's, a --config key is the schema's; the recipes read no variable of their own."""
    recipe = tokens[0]
    if not re.fullmatch(r"recipes/[\w]+/run\.sh|recipes/run\.sh", recipe) or not os.path.isfile(os.path.join(REPO, recipe)):
        return [f"{recipe} (no such entry point)"]
    unknown = [v for v in variables if v not in ENVIRONMENT]
    rest = tokens[1:]
    while rest and rest[0].endswith((".yaml", ".yml")):
        if not os.path.isfile(os.path.join(REPO, rest[0])) and not PLACEHOLDER.match(rest[0]) \
                and "/" in rest[0]:
            unknown.append(f"{rest[0]} (no such file)")
        rest = rest[1:]
    unknown += [f for f in _flags(rest) if f not in _snakemake_flags()]
    if "--config" in rest:
        for item in rest[rest.index("--config") + 1:]:
            if item.startswith("-"):
                break
            key = item.split("=", 1)[0]
            if key not in _config_keys():
                unknown.append(f"--config {key}")
    return unknown


def make_unknown(variables, tokens):
    makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    unknown = [t for t in tokens[1:] if "=" not in t and t not in targets]
    assigned = variables + [t.split("=", 1)[0] for t in tokens[1:] if "=" in t]
    unknown += [v for v in assigned if v not in ENVIRONMENT and not re.search(rf"\b{v}\b", makefile)]
    for token in tokens[1:]:  # the demo's own flags
        if token.startswith("DEMO_ARGS="):
            unknown += script_unknown(["scripts/demo.py", *shlex.split(token.split("=", 1)[1])])
    return unknown


def pytest_unknown(tokens):
    """The test files a pytest command names that do not exist, and flags pytest does not know."""
    missing = [f"{t} (no such test file)" for t in tokens[1:]
               if re.match(r"^tests(/|$)", t) and not os.path.exists(os.path.join(REPO, t.split("::")[0]))]
    known = _help_flags(os.path.join(os.path.dirname(sys.executable), "pytest"))
    return missing + [f for f in _flags(tokens[1:]) if f not in known]


def unknown_in(tokens):
    """The flags and variables of one command that its program does not know ([] if none)."""
    variables = []
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        variables.append(tokens.pop(0).split("=", 1)[0])
    if not tokens:  # assignments alone: nothing reads them but the environment's own
        return [v for v in variables if v not in ENVIRONMENT]
    program = os.path.basename(tokens[0])
    if program in PREFIXES:
        rest = tokens[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        return unknown_in([f"{v}=" for v in variables] + rest)
    if program == "export":
        return unknown_in(tokens[1:])
    if program in SKIPPED:
        return []
    if program in FAIRSEQ_PARSERS:
        return fairseq_unknown(program, tokens)
    if program in ("python", "python3"):
        return script_unknown(tokens[1:])
    if program == "bash" and tokens[1:2] and not tokens[1].startswith("recipes/"):  # a script of the repo (.ci/run)
        return [v for v in variables if v not in ENVIRONMENT] + \
            ([] if os.path.isfile(os.path.join(REPO, tokens[1])) else [f"{tokens[1]} (no such script)"])
    if program == "bash":
        return recipe_unknown(variables, tokens[1:])
    if program == "make":
        return make_unknown(variables, tokens)
    if program == "pytest":
        return pytest_unknown(tokens)
    if program == "torchrun":
        end = next((i for i, t in enumerate(tokens) if "fairseq-" in t), len(tokens))
        torchrun = _help_flags(os.path.join(os.path.dirname(sys.executable), "torchrun"))
        unknown = [f for f in _flags(tokens[1:end]) if f not in torchrun]
        return unknown + (fairseq_unknown("fairseq-train", tokens[end:]) if end < len(tokens) else [])
    return [f"{tokens[0]}: a program this check does not know (add it to tests/docs/test_docs.py)"]


COMMANDS = doc_commands()


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds what the pages hold (a broken parser would check nothing)."""
    programs = {os.path.basename(t[0]) for _, t in COMMANDS if t and not re.match(r"^[A-Z_]+=", t[0])}
    assert {"fairseq-train", "fairseq-generate", "python", "bash", "make"} <= programs
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_and_variable_in_the_docs_is_known(doc):
    wrong = []
    for where, tokens in COMMANDS:
        if where == doc:
            unknown = unknown_in(list(tokens))
            if unknown:
                wrong.append(f"{' '.join(tokens)[:160]}\n    unknown: {', '.join(unknown)}")
    assert not wrong, f"{doc}:\n" + "\n".join(wrong)


def test_the_check_finds_a_misspelt_flag_and_variable():
    assert unknown_in(["fairseq-train", "data", "--user-dir", "fairseq_posenc", "--arch", "transformer_t5_wmt_en_de",
                       "--t5-num-buckets", "32", "--positon-encoding", "t5"]) == ["--positon-encoding"]
    assert unknown_in(["ENC=t5", "bash", "recipes/wmt14_en_de/run.sh", "-n"]) == ["ENC"]
    assert unknown_in(["bash", "recipes/wmt14_en_de/run.sh", "recipes/conf/nope.yaml", "--dry-rnu", "--config",
                       "modles={}", "out=x"]) == ["recipes/conf/nope.yaml (no such file)", "--dry-rnu", "--config modles"]
    assert unknown_in(["bash", "recipes/wmt14_en_de/train.sh"]) == ["recipes/wmt14_en_de/train.sh (no such entry point)"]
    assert unknown_in(["python", "scripts/bleu_by_length.py", "--generation", "a=b", "--baseline", "a",
                       "--bootstrap", "10"]) == ["--bootstrap"]
    assert unknown_in(["make", "demo", "DEMO_ARGS=--seeds 3 --encoding t5"]) == ["--encoding"]
    assert unknown_in(["do", "ARHC=base", "bash", "recipes/wmt14_en_de/run.sh"]) == ["ARHC"]
    assert unknown_in(["export", "OMP_NUM_THREADS=2", "ARHC=base"]) == ["ARHC"]
    assert unknown_in(["srun", "bash", "recipes/wmt14_en_de/run.sh", "--dry-rnu"]) == ["--dry-rnu"]
    assert unknown_in(["OMP_NUM_THREADS=1", ".venv/bin/pytest", "tests/test_doc.py", "-x", "--durations", "5",
                       "--dist", "loadfile", "--maxfail=1", "--no-capture"]) == [
        "tests/test_doc.py (no such test file)", "--no-capture"]
    assert unknown_in(["torchrun", "--nnodes", "2", "--nproc-per-gpu", "8", "fairseq-train", "x"]) == [
        "--nproc-per-gpu"]


# --- what a page may cite: no ids of this project's commits or issues, no link out of the checkout --
#: hex of 7 to 40 digits with at least one letter and one digit: a commit id, short or full
COMMIT = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])")
#: an issue or pull request by number: "issue 38", "issues 12 and", "#38"
ISSUE = re.compile(r"\b(?:issues?|PRs?|pull requests?)\s+#?\d+|(?<![\w/])#\d+", re.I)
#: what may precede an issue number of another project: "fairseq's issue #5036", "pytorch/pytorch#110213"
UPSTREAM = re.compile(r"(?:\b(?:fairseq|pytorch|torch|torchdiffeq|snakemake|sacrebleu)(?:'s)?|[\w.-]+/[\w.-]+)\s*$", re.I)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text):
    """The text of a page without its code blocks (commands may hold hashes and paths of their own)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def own_ids(text):
    """The ids of this project's commits and issues that ``text`` cites, commands included."""
    found = [m.group(0) for m in COMMIT.finditer(text)]
    found += [m.group(0) for m in ISSUE.finditer(text) if not UPSTREAM.search(text[max(0, m.start() - 40):m.start()])]
    return found


def _anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    text = _prose(open(path, encoding="utf-8").read())
    return {_anchor(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def _inside(path):
    return os.path.commonpath([path, REPO]) == REPO


def broken_links(doc, text):
    """The links of ``doc`` that leave the checkout or name a file or heading it does not have
    (web addresses are the reader's to follow)."""
    broken = []
    here = os.path.dirname(os.path.join(REPO, doc))
    for path in re.findall(r"`(\.\./[^`\s]*)`", _prose(text)):  # a path named in the text: from the page or the root
        if not any(_inside(os.path.normpath(os.path.join(base, path))) and os.path.exists(os.path.join(base, path))
                   for base in (here, REPO)):
            broken.append(f"{path} (not in the checkout)")
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(REPO, doc)
        if not _inside(full):
            broken.append(f"{target} (outside the repository)")
        elif not os.path.exists(full):
            broken.append(f"{target} (no such file)")
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("doc", DOCS)
def test_no_ids_of_this_projects_commits_or_issues(doc):
    """A reader of a clone has neither the project's tracker nor, in a shallow clone, its history:
    a page says what was run and on what, not where in the history."""
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    assert not own_ids(text), f"{doc} cites {own_ids(text)}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_stays_inside_the_repository(doc):
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    assert not broken_links(doc, text), f"{doc}: {broken_links(doc, text)}"


def test_the_checks_find_ids_and_links_out():
    assert own_ids("at commit 7f98e57 plus this change; before issue 40 (issue 32, item 3) and #38") == [
        "7f98e57", "issue 40", "issue 32", "#38"]
    assert own_ids("fairseq's issue #5036, pytorch/pytorch#110213, 1,024 tokens, 0.0017, cafe, 1.5e-3, "
                   "arXiv 2003.09229, Table 2, deadbeefcafe0") == ["deadbeefcafe0"]
    assert own_ids("```bash\ngit worktree add ../before f7e026a\n```\n") == ["f7e026a"]
    assert broken_links("docs/papers.md", "in `../shared/seeds/` (`../recipes/README.md`, `../docs/`)") == [
        "../shared/seeds/ (not in the checkout)"]
    assert broken_links("docs/papers.md", "[seeds](../shared/seeds/), [a](../../x.md), [b](floater.md), "
                        "[c](nope.md), [d](encodings.md#adding-an-encoding), [e](encodings.md#nope), "
                        "[f](https://arxiv.org/abs/1706.03762), [g](#nope)") == [
        "../shared/seeds/ (no such file)", "../../x.md (outside the repository)", "nope.md (no such file)",
        "encodings.md#nope (no such heading)", "#nope (no such heading)"]
