"""The commands the docs show, as tests/docs reads them: README.md, recipes/README.md and
docs/*.md, the simple commands of their ```bash blocks and of any one line."""
import glob
import os
import re
import shlex

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", "recipes/README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md"))


def block_commands(text):
    """The simple commands (shlex tokens) of every ```bash (sh, shell) block of ``text``, its
    continuation lines joined."""
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if match.group(1) in ("bash", "sh", "shell"):
            for line in match.group(2).replace("\\\n", " ").splitlines():
                yield from simple_commands(line)


def simple_commands(line):
    """shlex tokens of one logical line, cut into simple commands at ; && || | and ( ).
    ``$(which X)`` and ``$(command -v X)`` stand for X."""
    line = re.sub(r"\$\((?:which|command -v) ([\w-]+)\)", r"\1", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    command = []
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote in a prose span: nothing to check
        return
    for token in tokens:
        if token and set(token) <= set(";&|()"):
            if command:
                yield command
            command = []
        else:
            command.append(token)
    if command:
        yield command
