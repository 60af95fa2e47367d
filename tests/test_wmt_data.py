"""fairseq_posenc/recipe/wmt_data.py downloads: a download shorter than its Content-Length never takes the
archive's name; a mirror replaces statmt.org; the fingerprint follows a replaced archive, is the
same for a copy of the archives elsewhere, and reads an unchanged archive once."""
import io
import json
import os
import shutil
import sys

import pytest

from fairseq_posenc.recipe import wmt_data  # noqa: E402


class _Response(io.BytesIO):
    def __init__(self, data, length):
        super().__init__(data)
        self.headers = {"Content-Length": str(length)}


def test_a_truncated_download_is_refused_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(wmt_data.urllib.request, "urlopen", lambda url, timeout=None: _Response(b"x" * 600, 1000))
    archive = wmt_data.Archive("dev.tgz", "http://www.statmt.org/wmt14/dev.tgz", "")
    with pytest.raises(wmt_data.DataError) as e:
        wmt_data.fetch([archive], str(tmp_path), allow_download=True)
    assert str(e.value) == ("http://www.statmt.org/wmt14/dev.tgz: the download stopped at 600 of 1000 bytes; "
                            "run again to download it again")
    assert os.listdir(tmp_path) == []


def test_mirror_downloads_from_mirror_slash_file_and_fingerprint_follows_the_archive(tmp_path, capsys):
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    (mirror / "dev.tgz").write_bytes(b"archive bytes")
    archive = wmt_data.Archive("dev.tgz", "http://www.statmt.org/wmt14/dev.tgz", "")
    before = wmt_data.fingerprint([archive], str(cache))
    wmt_data.fetch([archive], str(cache), allow_download=True, mirror=f"file://{mirror}")
    assert f"| downloading file://{mirror}/dev.tgz" in capsys.readouterr().out
    assert (cache / "dev.tgz").read_bytes() == b"archive bytes"
    after = wmt_data.fingerprint([archive], str(cache))
    (cache / "dev.tgz").write_bytes(b"another archive")
    assert len({before, after, wmt_data.fingerprint([archive], str(cache))}) == 3


def test_iwslt_xml_segments_are_read_as_fairseqs_grep_and_sed_read_them():
    """prepare-iwslt14.sh: grep '<seg id', sed 's/<seg id="[0-9]*">\\s*//g' and 's/\\s*<\\/seg>\\s*//g'.
    sed's \\s is ASCII whitespace only: a no-break space at a segment's edge stays (Python's \\s
    would strip it); spaces inside a segment stay as they are."""
    text = ('<refset setid="x">\n<doc docid="1">\n<seg id="1">  Ein  Satz. </seg>\n'
            '<seg id="22">\u00a0Zwei\u00a0</seg>  \n<title>no seg</title>\n</doc>\n')
    assert wmt_data.read_iwslt_xml(text) == ["Ein  Satz.", "\u00a0Zwei\u00a0"]


# ------------------------------------------------------------------------------------------------
# the extract step's key: the archives' content, not their paths or dates (issue 31, item 6)
ARCHIVES = [wmt_data.Archive("training-parallel-nc-v9.tgz",
                             "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", ""),
            wmt_data.Archive("dev.tgz", "http://www.statmt.org/wmt14/dev.tgz", "")]


def _archive_set(directory, seed=b"x"):
    os.makedirs(directory, exist_ok=True)
    for i, a in enumerate(ARCHIVES):
        with open(os.path.join(directory, a.file), "wb") as f:
            f.write(seed * (3000 + i) + bytes(range(256)))


def test_a_copy_of_the_archives_elsewhere_with_new_dates_keeps_the_fingerprint_and_a_changed_byte_changes_it(tmp_path):
    _archive_set(tmp_path / "local")
    shutil.copytree(tmp_path / "local", tmp_path / "cluster", copy_function=shutil.copy)  # new mtimes
    for a in ARCHIVES:
        os.utime(tmp_path / "cluster" / a.file, ns=(1_000_000_000, 1_000_000_000))  # other dates, surely
    key = wmt_data.fingerprint(ARCHIVES, str(tmp_path / "local"))
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "cluster")) == key
    assert key.startswith("sha256-") and len(key) == len("sha256-") + 16  # not an old key (16 hex digits)
    # one byte changed, size and dates kept: another key
    path = tmp_path / "cluster" / "dev.tgz"
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "cluster")) != key


def test_the_cache_reads_an_unchanged_archive_once_and_a_copy_or_a_rewrite_again(tmp_path, monkeypatch):
    reads = []
    digest = wmt_data.file_digest
    monkeypatch.setattr(wmt_data, "file_digest", lambda path, algorithm: reads.append(os.path.basename(path))
                        or digest(path, algorithm))
    _archive_set(tmp_path / "local")
    cache = str(tmp_path / "work" / ".archives-sha256.json")
    key = wmt_data.fingerprint(ARCHIVES, str(tmp_path / "local"), cache)
    assert sorted(reads) == sorted(a.file for a in ARCHIVES)
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "local"), cache) == key and len(reads) == 2  # nothing read
    entry = json.load(open(cache))["files"][str((tmp_path / "local" / "dev.tgz").resolve())]
    assert entry["sha256"] == digest(str(tmp_path / "local" / "dev.tgz"), "sha256") and entry["size"] == 3257
    assert {"mtime_ns", "ctime_ns", "inode"} <= set(entry)
    # a copy (another path, another inode) is read once, then kept too; same key
    shutil.copytree(tmp_path / "local", tmp_path / "cluster", copy_function=shutil.copy)
    reads.clear()
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "cluster"), cache) == key and len(reads) == 2
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "cluster"), cache) == key and len(reads) == 2
    # a rewrite with size and mtime restored is still noticed (its ctime moved): read again, new key
    path = tmp_path / "cluster" / "dev.tgz"
    st = os.stat(path)
    path.write_bytes(b"y" + path.read_bytes()[1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    reads.clear()
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "cluster"), cache) != key and reads == ["dev.tgz"]
    # an unreadable cache is read past: every archive hashed again, the same key
    with open(cache, "w") as f:
        f.write("{not json")
    reads.clear()
    assert wmt_data.fingerprint(ARCHIVES, str(tmp_path / "local"), cache) == key and len(reads) == 2


def test_a_large_archive_reports_its_hashing_on_stderr_and_stdout_is_the_key_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wmt_data, "PROGRESS_FROM", 3000)  # the two test archives count as large
    _archive_set(tmp_path / "raw")
    sources = tmp_path / "sources"
    sources.write_text("".join(f"archive {a.file} {a.url} -\n" for a in ARCHIVES))
    expected = wmt_data.fingerprint(ARCHIVES, str(tmp_path / "raw"))
    capsys.readouterr()
    wmt_data.main(["fingerprint", "--sources", str(sources), "--raw-dir", str(tmp_path / "raw"),
                   "--cache", str(tmp_path / "cache.json")])
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert "   sha256 of dev.tgz: 0 MiB in " in err and " MB/s)" in err
    wmt_data.main(["fingerprint", "--sources", str(sources), "--raw-dir", str(tmp_path / "raw"),
                   "--cache", str(tmp_path / "cache.json")])
    assert capsys.readouterr().err == ""  # kept: nothing hashed, nothing said
