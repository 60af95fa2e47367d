"""scripts/wmt_data.py downloads: a download shorter than its Content-Length never takes the
archive's name; a mirror replaces statmt.org; the fingerprint follows a replaced archive."""
import io
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import wmt_data  # noqa: E402


class _Response(io.BytesIO):
    def __init__(self, data, length):
        super().__init__(data)
        self.headers = {"Content-Length": str(length)}


def test_a_truncated_download_is_refused_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(wmt_data.urllib.request, "urlopen", lambda url: _Response(b"x" * 600, 1000))
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
