"""Miniature WMT and IWSLT archives with the official names and member paths (a toy language pair: every
word has one translation, order kept; hyphenated compounds, punctuation, quotes and an ampersand
exercise tokenization, escaping and compound splitting), for the workflow's tests."""
import gzip
import io
import os
import random
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(REPO, "recipes")
from posenc_workflow.wmt_data import read_sources  # noqa: E402

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


# ------------------------------------------------------------------------------------------------
# IWSLT'14's de-en.tgz: the members fairseq's prepare-iwslt14.sh reads (train.tags.* with their
# talk metadata, the five test sets as .xml); a toy pair word for word (German: each English word
# reversed + "en"), with capitals, a hyphenated word (kept whole: no -a) and quotes (escaped)
IWSLT_TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                   "IWSLT14.TED.tst2012"]
IWSLT_TEST_SIZES = [7, 5, 6, 4, 8]  # 30 test pairs, a count per set so that a set left out shows


def _iwslt_pair(rng, n):
    words = [rng.choice(_WORDS) for _ in range(n)]
    if n > 4 and rng.random() < 0.3:
        words[1] = words[1] + "-" + words[2]
    en = " ".join(words)
    de = " ".join("-".join(w[::-1] + "en" for w in word.split("-")) for word in words)
    return de[0].upper() + de[1:] + ".", en[0].upper() + en[1:] + "."


def write_iwslt_archive(path, seed=1, talks=3, per_talk=40):
    """de-en.tgz with the members prepare-iwslt14.sh reads. Per talk: the metadata lines fairseq
    drops (<url>, <keywords>, <talkid>), a <title> and a <description> line kept without their
    tags, then ``per_talk`` sentences; among them one pair of 180 tokens a side and one of ratio 2
    (the 1-175 / 1.5 cleaning drops both) and one empty pair. Returns the expected counts."""
    assert talks >= 3 and per_talk >= 10
    rng = random.Random(seed)
    de_lines, en_lines, text_pairs = [], [], 0
    for talk in range(talks):
        meta = [f"<url>http://www.ted.com/talks/toy_{talk}.html</url>", f"<keywords>talks, toy {talk}</keywords>",
                f"<talkid>{100 + talk}</talkid>"]
        de_lines += meta
        en_lines += meta
        de_lines += [f"<title>Toy-Vortrag {talk}: Das Haus</title>",
                     f"<description>TED Talk Subtitles and Transcript: Vortrag {talk} Über Häuser</description>"]
        en_lines += [f"<title>Toy talk {talk}: The House</title>",
                     f"<description>TED Talk Subtitles and Transcript: Talk {talk} About Houses</description>"]
        text_pairs += 2
        for i in range(per_talk):
            if talk == 0 and i == 5:
                de, en = " ".join(["Haus"] * 180), " ".join(["House"] * 180)
            elif talk == 1 and i == 7:
                de, en = " ".join(["Katze"] * 10), " ".join(["Cat"] * 20)
            elif talk == 2 and i == 9:
                de = en = ""
            else:
                de, en = _iwslt_pair(rng, rng.randint(3, 12))
                if rng.random() < 0.1:
                    de, en = f'Er sagt "{de}"', f'He says "{en}"'
            de_lines.append(de)
            en_lines.append(en)
            text_pairs += 1
    members = {"de-en/train.tags.de-en.de": "\n".join(de_lines) + "\n",
               "de-en/train.tags.de-en.en": "\n".join(en_lines) + "\n"}
    test_pairs = []
    for name, size in zip(IWSLT_TEST_SETS, IWSLT_TEST_SIZES):
        pairs = [_iwslt_pair(rng, rng.randint(3, 12)) for _ in range(size)]
        pairs[0] = (pairs[0][0].replace(".", "\u2019s."), pairs[0][1].replace(".", "\u2019s."))  # ’ -> '
        test_pairs += pairs
        for side, lang in ((0, "de"), (1, "en")):
            segs = "".join(f'<seg id="{i + 1}"> {p[side]} </seg>\n' for i, p in enumerate(pairs))
            members[f"de-en/{name}.de-en.{lang}.xml"] = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<refset setid="iwslt2014-{name}" srclang="german" '
                f'trglang="english" refid="ref">\n<doc docid="1" genre="lectures">\n<url>http://www.ted.com/talks/x.html</url>\n'
                f"<description>TED Talk Subtitles and Transcript: toy</description>\n<talkid>1</talkid>\n"
                f"<title>Toy</title>\n{segs}</doc>\n</refset>\n</mteval>\n")
    members["de-en/README"] = "toy\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return {"text_pairs": text_pairs, "cleaned": text_pairs - 3, "test": [p[1] for p in test_pairs]}


def write_plain_pairs(prefix, count, src, tgt, seed=1, lengths=(3, 16)):
    """PREFIX.SRC and PREFIX.TGT: ``count`` pairs of the toy language pair as plain text, one a
    line (a corpus of the user's own files)."""
    rng = random.Random(seed)
    pairs = _pairs(rng, count, src, tgt, lengths)
    for side, lang in enumerate((src, tgt)):
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(pair[side] + "\n" for pair in pairs)
    return pairs
