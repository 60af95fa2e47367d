"""Miniature WMT archives with the official names and member paths (a toy language pair: every
word has one translation, order kept; hyphenated compounds, punctuation, quotes and an ampersand
exercise tokenization, escaping and compound splitting), for the workflow's tests."""
import gzip
import io
import os
import random
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, "recipes")
from fairseq_posenc.recipe.wmt_data import read_sources  # noqa: E402

# the names fairseq's prepare-wmt14en2*.sh and the WMT sites use (wmt18: both test archives are
# test.tgz upstream, kept under the year's name)
OFFICIAL = {
    "wmt14_en_de": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                    "training-parallel-nc-v9.tgz", "dev.tgz", "test-full.tgz"},
    "wmt14_en_fr": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                    "training-parallel-un.tgz", "training-parallel-nc-v9.tgz", "training-giga-fren.tar",
                    "dev.tgz", "test-full.tgz"},
    "wmt18": {"training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
              "training-parallel-nc-v13.tgz", "wmt17-test.tgz", "wmt18-test.tgz"},
}
PAIRS = {"wmt14_en_de": ("en", "de"), "wmt14_en_fr": ("en", "fr"), "wmt18": ("cs", "en")}

# ------------------------------------------------------------------------------------------------
# a toy language pair: every word has one translation, order kept; hyphenated compounds,
# punctuation, quotes and an ampersand exercise tokenization, escaping and compound splitting
_WORDS = ["house", "cat", "dog", "tree", "river", "city", "green", "small", "old", "new", "sees", "has",
          "likes", "near", "the", "a", "and", "of", "big", "red", "car", "road", "book", "reads"]


def _translate(word, lang):
    return {"de": word[::-1] + "en", "fr": word[::-1] + "é", "cs": "ř" + word[::-1], "en": word}[lang]


def _sentence(rng, n, src, tgt):
    words = [rng.choice(_WORDS) for _ in range(n)]
    if n > 4 and rng.random() < 0.3:
        words[1] = words[1] + "-" + words[2]  # a compound: "well-known" style
    extra_s, extra_t = "", ""
    if rng.random() < 0.2:
        extra_s = extra_t = ' "&"'
    s = " ".join(_translate_compound(w, src) for w in words) + extra_s + "."
    t = " ".join(_translate_compound(w, tgt) for w in words) + extra_t + "."
    return s[0].upper() + s[1:], t[0].upper() + t[1:]


def _translate_compound(word, lang):
    return "-".join(_translate(part, lang) for part in word.split("-"))


def _pairs(rng, count, src, tgt, lengths=(3, 16)):
    return [_sentence(rng, rng.randint(*lengths), src, tgt) for _ in range(count)]


def _sgm(lines, setid, lang):
    segs = "".join(f'<seg id="{i + 1}">{line}</seg>\n' for i, line in enumerate(lines))
    return (f'<srcset setid="{setid}" srclang="any">\n<doc sysid="ref" docid="toy" genre="news" origlang="{lang}">\n'
            f"<p>\n{segs}</p>\n</doc>\n</srcset>\n")


def write_archives(recipe, raw_dir, src, tgt, seed=1, train_pairs=360, sources=None):
    """Every archive of the recipe's sources file, with the members it names, in ``raw_dir``."""
    archives, corpora = read_sources(sources or os.path.join(RECIPES, recipe, "sources"), src, tgt)
    assert {a.file for a in archives} == OFFICIAL[recipe]
    rng = random.Random(seed)
    members = {a.file: {} for a in archives}
    n_train = sum(c.split == "train" for c in corpora)
    for c in corpora:
        count = {"train": train_pairs // n_train, "valid": 30, "test": 40}[c.split]
        pairs = _pairs(rng, count, src, tgt)
        for member, lang, lines in ((c.src_member, src, [p[0] for p in pairs]), (c.tgt_member, tgt, [p[1] for p in pairs])):
            if member.endswith(".sgm"):
                data = _sgm(lines, c.split, lang).encode()
            else:
                data = "".join(line + "\n" for line in lines).encode()
            members[c.archive][member] = gzip.compress(data) if member.endswith(".gz") else data
    os.makedirs(raw_dir, exist_ok=True)
    for name, files in members.items():
        with tarfile.open(os.path.join(raw_dir, name), "w:gz" if name.endswith(".tgz") else "w") as tar:
            for member, data in files.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return archives, corpora
