"""recipes/posenc_workflow/wmt_data.py downloads: a download shorter than its Content-Length never takes the
archive's name; a mirror replaces statmt.org; one archive alone (the workflow's download rule);
the timeout is corpus.download_timeout's."""
import io
import os

import pytest

from posenc_workflow import wmt_data  # noqa: E402


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


def test_mirror_downloads_from_mirror_slash_file(tmp_path, capsys):
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    (mirror / "dev.tgz").write_bytes(b"archive bytes")
    archive = wmt_data.Archive("dev.tgz", "http://www.statmt.org/wmt14/dev.tgz", "")
    wmt_data.fetch([archive], str(cache), allow_download=True, mirror=f"file://{mirror}")
    assert f"| downloading file://{mirror}/dev.tgz" in capsys.readouterr().out
    assert (cache / "dev.tgz").read_bytes() == b"archive bytes"


def test_only_fetches_one_archive_of_the_sources_file(tmp_path, capsys):
    """The workflow's download rule: one job per missing archive (--only FILE)."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "dev.tgz").write_bytes(b"dev")
    sources = tmp_path / "sources"
    sources.write_text("archive dev.tgz http://www.statmt.org/wmt14/dev.tgz -\n"
                       "archive test-full.tgz http://www.statmt.org/wmt14/test-full.tgz -\n")
    fetch = ["fetch", "--sources", str(sources), "--raw-dir", str(tmp_path / "raw"), "--mirror", f"file://{mirror}"]
    wmt_data.main(fetch + ["--only", "dev.tgz"])
    assert os.listdir(tmp_path / "raw") == ["dev.tgz"]
    with pytest.raises(SystemExit):
        wmt_data.main(fetch + ["--only", "nc.tgz"])
    assert "--only nc.tgz: not an archive of" in capsys.readouterr().err


def test_iwslt_xml_segments_are_read_as_fairseqs_grep_and_sed_read_them():
    """prepare-iwslt14.sh: grep '<seg id', sed 's/<seg id="[0-9]*">\\s*//g' and 's/\\s*<\\/seg>\\s*//g'.
    sed's \\s is ASCII whitespace only: a no-break space at a segment's edge stays (Python's \\s
    would strip it); spaces inside a segment stay as they are."""
    text = ('<refset setid="x">\n<doc docid="1">\n<seg id="1">  Ein  Satz. </seg>\n'
            '<seg id="22">\u00a0Zwei\u00a0</seg>  \n<title>no seg</title>\n</doc>\n')
    assert wmt_data.read_iwslt_xml(text) == ["Ein  Satz.", "\u00a0Zwei\u00a0"]


def test_the_download_timeout_is_the_flags_not_the_environments(tmp_path, monkeypatch):
    seen = []

    def urlopen(url, timeout=None):
        seen.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(wmt_data.urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("DOWNLOAD_TIMEOUT", "0.5")  # not read
    sources = tmp_path / "sources"
    sources.write_text("archive dev.tgz http://www.statmt.org/wmt14/dev.tgz -\n")
    fetch = ["fetch", "--sources", str(sources), "--raw-dir", str(tmp_path)]
    for extra in ([], ["--timeout", "7"]):
        with pytest.raises(SystemExit):
            wmt_data.main(fetch + extra)
    assert seen == [60, 7]
    # the workflow's fetch rule passes corpus.download_timeout
    from helpers.snakemake_runs import shipped

    from posenc_workflow import workflow
    from posenc_workflow.corpus import Corpus

    study = workflow.Study(shipped("wmt14_en_de", corpus={"download_timeout": 300}), preflight=False)
    command = Corpus.of(study).download_command()
    assert command[command.index("--timeout") + 1] == "300.0"
