#!/usr/bin/env python
"""Fetch the official WMT archives a recipe lists, and extract its corpora as plain text.

    # check (or download, giving up after --timeout s of silence) every archive of a recipe's `sources`
    # file, or --only one of them
    python recipes/posenc_workflow/wmt_data.py fetch --sources recipes/wmt14_en_de/sources --raw-dir orig/ \
        [--no-download] [--timeout 60] [--only dev.tgz]
    # write train/valid/test.{src,tgt}: training corpora concatenated, .sgm test sets read as text
    python recipes/posenc_workflow/wmt_data.py extract --sources recipes/wmt14_en_de/sources --raw-dir orig/ \\
        --src en --tgt de --out-dir raw/

A `sources` file has two kinds of lines (``#`` starts a comment; fields separated by spaces):

    archive FILE URL CHECKSUM              CHECKSUM is md5:HEX, sha256:HEX, - (not verified) or
                                           record (none published: the first use checks that the
                                           archive is whole, records its sha256 and size in
                                           FILE.sha256, later uses check them)
    SPLIT FILE SOURCE_MEMBER TARGET_MEMBER   SPLIT is train, valid or test; members of archive FILE

FILE may sit in a directory of the cache (``iwslt14/de-en.tgz``: every IWSLT year names its
archive de-en.tgz); in a --raw-dir of your own downloads it may also lie at the top
(``RAW/de-en.tgz``). Members may use {src}, {tgt} (the pair's languages) and {xx} (its
non-English language, for corpora named like europarl-v7.de-en whichever the direction). A member
ending in .sgm is read as WMT's SGML (the text of its <seg> lines), one ending in .xml as IWSLT's
(the <seg id> lines, as fairseq's prepare-iwslt14.sh greps them), an IWSLT ``train.tags.*`` file
without its talk metadata (fairseq's filter); one ending in .gz is decompressed.
"""
import argparse
import gzip
import hashlib
import itertools
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional



class DataError(Exception):
    """Something wrong with the raw data: the message is the one line the user sees."""


@dataclass
class Archive:
    file: str
    url: str
    checksum: str  # "" when none is published


@dataclass
class Corpus:
    split: str
    archive: str
    src_member: str
    tgt_member: str


def read_sources(path: str, src: str = "", tgt: str = ""):
    """The archives (in file order) and the corpora of a ``sources`` file, placeholders filled."""
    xx = tgt if src == "en" else src
    archives: Dict[str, Archive] = {}
    corpora: List[Corpus] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            fields = [x.format(src=src, tgt=tgt, xx=xx) for x in fields]
            if fields[0] == "archive" and len(fields) == 4:
                if fields[3] not in ("-", RECORD) and fields[3].partition(":")[0] not in ("md5", "sha256"):
                    raise DataError(f"{path}:{number}: checksum must be md5:HEX, sha256:HEX, - or {RECORD}, "
                                    f"got {fields[3]!r}")
                archives[fields[1]] = Archive(fields[1], fields[2], "" if fields[3] == "-" else fields[3])
            elif fields[0] in ("train", "valid", "test") and len(fields) == 4:
                if fields[1] not in archives:
                    raise DataError(f"{path}:{number}: archive {fields[1]} is not declared by an 'archive' line")
                corpora.append(Corpus(*fields))
            else:
                raise DataError(f"{path}:{number}: expected 'archive FILE URL CHECKSUM' or "
                                f"'train|valid|test FILE SRC_MEMBER TGT_MEMBER', got {line.strip()!r}")
    return list(archives.values()), corpora


RECORD = "record"


def archive_path(raw_dir: str, file: str) -> str:
    """Where archive ``file`` is: ``raw_dir/file``, or, for a file kept in a directory of the
    cache (``iwslt14/de-en.tgz``), ``raw_dir/de-en.tgz`` when only that exists (a --raw-dir of
    downloads saved under their own names)."""
    path = os.path.join(raw_dir, file)
    top = os.path.join(raw_dir, os.path.basename(file))
    if not os.path.isfile(path) and os.path.dirname(file) and os.path.isfile(top):
        return top
    return path


PROGRESS_FROM = 256 << 20  # a file this large says how far its hashing got (on stderr), every PROGRESS_EVERY s
PROGRESS_EVERY = 2.0


def file_digest(path: str, algorithm: str) -> str:
    """The hex digest of a file's content, read in 4 MiB blocks; a file of PROGRESS_FROM bytes or
    more reports its progress and its speed on stderr (stdout may be a value the caller keeps)."""
    digest = hashlib.new(algorithm)
    size, done, name = os.path.getsize(path), 0, os.path.basename(path)
    show = size >= PROGRESS_FROM
    start = last = time.monotonic()
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            done += n
            if show and time.monotonic() - last >= PROGRESS_EVERY:
                last = time.monotonic()
                print(f"\r   {algorithm} of {name}: {done >> 20} / {size >> 20} MiB", end="", file=sys.stderr, flush=True)
    if show:
        seconds = max(time.monotonic() - start, 1e-9)
        print(f"\r   {algorithm} of {name}: {size >> 20} MiB in {seconds:.1f} s ({size / seconds / 1e6:.0f} MB/s)",
              file=sys.stderr, flush=True)
    return digest.hexdigest()


def verify(path: str, checksum: str) -> str:
    """A line saying whether ``path`` matches ``checksum``; raises DataError if it does not."""
    if not checksum:
        return f"{os.path.basename(path)}: no published checksum, skipped verification"
    if checksum == RECORD:
        return verify_recorded(path)
    algorithm, _, expected = checksum.partition(":")
    actual = file_digest(path, algorithm)
    if actual != expected.lower():
        raise DataError(f"{path}: {algorithm} is {actual}, expected {expected} (a partial or different download? "
                        f"delete it and run again)")
    return f"{os.path.basename(path)}: {algorithm} verified"


def verify_recorded(path: str) -> str:
    """No checksum is published (IWSLT'14's de-en.tgz): the first use writes the archive's sha256
    and size to ``path.sha256``; every later use checks the archive against them, so that a
    replaced or re-downloaded archive that differs is noticed rather than silently prepared."""
    record = path + ".sha256"
    size = os.path.getsize(path)
    digest = file_digest(path, "sha256")
    name = os.path.basename(path)
    if not os.path.isfile(record):
        check_complete(path)  # what is recorded now is what every later run is held to
        try:
            with open(record, "w", encoding="utf-8") as f:
                f.write(f"{digest}  {size}  {name}\n")
        except OSError as e:
            return f"{name}: no published checksum; sha256 {digest}, {size} bytes (not recorded: {e})"
        return f"{name}: no published checksum; recorded sha256 {digest}, {size} bytes in {record}"
    fields = open(record, encoding="utf-8").read().split()
    if len(fields) < 2 or fields[0] != digest or fields[1] != str(size):
        raise DataError(f"{path}: sha256 {digest}, {size} bytes, but {record} recorded {' '.join(fields[:2])} at its "
                        f"first use: another archive? delete {record} to accept this one")
    return f"{name}: sha256 and size ({size} bytes) as recorded at its first use ({record})"


def check_complete(path: str):
    """Raise DataError unless ``path`` is a whole archive: a compressed stream (gzip, bzip2, xz)
    read to its end (its checksum and length checked), a plain tar archive whose last member lies
    inside the file. Run before a checksum is recorded for an archive that has none published, so
    that a download cut short (by a server that announced no Content-Length) is not recorded as
    the reference."""
    import bz2
    import lzma

    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        opener = {b"\x1f\x8b": gzip.open, b"BZ": bz2.open, b"\xfd7": lzma.open}.get(magic[:2])
        if opener:
            with opener(path, "rb") as f:
                while f.read(1 << 22):
                    pass
        else:
            with tarfile.open(path, "r:") as tar:
                end = max((m.offset_data + m.size for m in tar), default=0)
            if end > os.path.getsize(path):
                raise EOFError(f"its last member ends at byte {end}, past the file's end")
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError, lzma.LZMAError) as e:
        raise DataError(f"{path} is incomplete or not an archive ({e}): a download cut short? delete it and run "
                        f"again (nothing was recorded for it)") from None


DOWNLOAD_TIMEOUT = 60.0  # seconds without a byte from the server before a download gives up (corpus.download_timeout)


def download(url: str, path: str, timeout: float = DOWNLOAD_TIMEOUT):
    """Download to ``path`` through ``path.part``: an interrupted download, one that ends
    before the Content-Length the server announced, or one that receives nothing for ``timeout``
    seconds (connecting, or between two reads) leaves no file at ``path``."""
    part = path + ".part"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            for block in iter(lambda: response.read(1 << 22), b""):
                out.write(block)
                done += len(block)
                if total:
                    print(f"\r  {os.path.basename(path)}: {done >> 20} / {total >> 20} MiB", end="", file=sys.stderr)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise
    print(file=sys.stderr)
    if total and done != total:
        os.remove(part)
        raise DataError(f"{url}: the download stopped at {done} of {total} bytes; run again to download it again")
    os.replace(part, path)


def fetch(archives: List[Archive], raw_dir: str, allow_download: bool, check: bool = True, mirror: str = "",
          timeout: float = DOWNLOAD_TIMEOUT):
    """Check every archive first (so that nothing is written when one is missing), then download
    (from ``mirror``/FILE instead of the official URL when a mirror is given), giving up on a
    server silent for ``timeout`` seconds."""
    missing = [a for a in archives if not os.path.isfile(archive_path(raw_dir, a.file))]
    if missing and not allow_download:
        a = missing[0]
        save_as = "" if a.url.rstrip("/").endswith("/" + a.file) else f" and save it as {a.file}"
        if os.path.dirname(a.file) and a.url.rstrip("/").endswith("/" + os.path.basename(a.file)):
            save_as = f" into {os.path.join(raw_dir, os.path.dirname(a.file))}/ or {raw_dir}/"
        raise DataError(f"missing {os.path.join(raw_dir, a.file)}: download it from {a.url}{save_as}"
                        + (f" ({len(missing) - 1} more missing: {', '.join(m.file for m in missing[1:])})"
                           if len(missing) > 1 else ""))
    os.makedirs(raw_dir, exist_ok=True)
    for a in archives:
        path = archive_path(raw_dir, a.file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.isfile(path):
            print(f"| {a.file} already there, not downloading")
        else:
            url = f"{mirror.rstrip('/')}/{a.file}" if mirror else a.url
            print(f"| downloading {url}")
            try:
                download(url, path, timeout)
            except OSError as e:
                if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
                    e = f"nothing received for {timeout:g} s; corpus.download_timeout (--timeout) waits longer"
                raise DataError(f"could not download {url} ({e}): download it by hand into {raw_dir}/ "
                                f"and pass --raw-dir {raw_dir}") from None
        print("| " + (verify(path, a.checksum) if check else f"{a.file}: checksum not verified (asked not to)"))


def read_sgm(text: str) -> List[str]:
    """The segments of a WMT SGML file, in order, spaces collapsed (as sacrebleu reads them)."""
    return [re.sub(r"\s+", " ", m.group(1)).strip()
            for m in re.finditer(r"^\s*<seg[^>]*>(.*?)</seg>", text, flags=re.MULTILINE)]


def read_iwslt_xml(text: str) -> List[str]:
    """The <seg id> lines of an IWSLT .xml file, as fairseq's prepare-iwslt14.sh reads them:
    grep '<seg id', then sed 's/<seg id="[0-9]*">\\s*//g' and 's/\\s*<\\/seg>\\s*//g' (spaces
    inside a segment are kept as they are). sed's \\s is ASCII whitespace: Python's would also take a
    no-break space."""
    out = []
    for line in text.split("\n"):
        if "<seg id" in line:
            line = re.sub(r'<seg id="[0-9]*">[ \t\r\n\f\v]*', "", line)
            out.append(re.sub(r"[ \t\r\n\f\v]*</seg>[ \t\r\n\f\v]*", "", line))
    return out


IWSLT_DROPPED_TAGS = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIPPED_TAGS = ("<title>", "</title>", "<description>", "</description>")


def iwslt_tags_line(line: str) -> Optional[str]:
    """A line of IWSLT's train.tags.* as fairseq's prepare-iwslt14.sh keeps it: lines holding
    <url>, <talkid> or <keywords> dropped (grep -v), the title and description tags removed and
    their text kept (sed); None for a dropped line."""
    if any(tag in line for tag in IWSLT_DROPPED_TAGS):
        return None
    for tag in IWSLT_STRIPPED_TAGS:
        line = line.replace(tag, "")
    return line


def unpack_members(archive: str, members: List[str], dest: str) -> Dict[str, str]:
    """Copy the wanted members of a tar archive to files under ``dest`` in one pass, streaming
    (``.gz`` members decompressed), and return member -> file."""
    wanted, found = set(members), {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for info in tar:
                name = info.name if info.name in wanted else info.name.lstrip("./")
                if name not in wanted or not info.isfile():
                    continue
                path = os.path.join(dest, f"{len(found)}.{os.path.basename(name)}").removesuffix(".gz")
                with tar.extractfile(info) as raw, open(path, "wb") as out:
                    shutil.copyfileobj(gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw, out, 1 << 22)
                found[name] = path
                if len(found) == len(wanted):
                    break
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{archive} is not a readable tar archive ({e}): delete it and download it again") from None
    absent = [m for m in members if m not in found]
    if absent:
        raise DataError(f"{archive} has no member {absent[0]}: is it the official archive?")
    return found


def read_text_lines(path: str, name: str) -> Iterator[str]:
    """The lines of an unpacked member (the segments of a .sgm), checked to be UTF-8."""
    try:
        if name.endswith(".sgm"):
            with open(path, encoding="utf-8") as f:
                yield from read_sgm(f.read())
            return
        if name.endswith(".xml"):
            with open(path, encoding="utf-8", newline="\n") as f:
                yield from read_iwslt_xml(f.read())
            return
        tags = os.path.basename(name).startswith("train.tags.")
        with open(path, encoding="utf-8", newline="\n") as f:
            for line in f:
                line = line.rstrip("\n")
                if tags:
                    line = iwslt_tags_line(line)
                    if line is None:
                        continue
                yield line
    except UnicodeDecodeError as e:
        raise DataError(f"{name} is not UTF-8 ({e.reason} at byte {e.start})") from None


def extract(corpora: List[Corpus], raw_dir: str, src: str, tgt: str, out_dir: str) -> Dict[str, int]:
    """Write ``out_dir/{split}.{src,tgt}``, the split's corpora concatenated in file order.
    Nothing is left at those names unless every corpus was read whole and checked."""
    for c in corpora:
        if not os.path.isfile(archive_path(raw_dir, c.archive)):
            raise DataError(f"missing {archive_path(raw_dir, c.archive)}: run the fetch step first")
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="members.", dir=out_dir)
    outputs: Dict[str, Dict[str, str]] = {}
    counts: Dict[str, int] = {}
    try:
        files: Dict[tuple, str] = {}
        by_archive: Dict[str, List[str]] = {}
        for c in corpora:
            by_archive.setdefault(c.archive, []).extend([c.src_member, c.tgt_member])
        for archive, members in by_archive.items():
            print(f"| reading {len(set(members))} members of {archive}")
            unpacked = unpack_members(archive_path(raw_dir, archive), sorted(set(members)), work)
            files.update({(archive, m): p for m, p in unpacked.items()})
        handles = {}
        for c in corpora:
            if c.split not in handles:
                outputs[c.split] = {lang: os.path.join(work, f"{c.split}.{lang}") for lang in (src, tgt)}
                handles[c.split] = {lang: open(p, "w", encoding="utf-8") for lang, p in outputs[c.split].items()}
            out = handles[c.split]
            n = 0
            pairs = itertools.zip_longest(read_text_lines(files[c.archive, c.src_member], f"{c.archive}:{c.src_member}"),
                                          read_text_lines(files[c.archive, c.tgt_member], f"{c.archive}:{c.tgt_member}"))
            for s, t in pairs:
                if s is None or t is None:
                    n_src, n_tgt = (_count(files[c.archive, m], m) for m in (c.src_member, c.tgt_member))
                    raise DataError(f"{c.archive}: {c.src_member} has {n_src} lines but {c.tgt_member} has {n_tgt}")
                out[src].write(s.replace("\r", " ") + "\n")
                out[tgt].write(t.replace("\r", " ") + "\n")
                n += 1
            if n == 0:
                raise DataError(f"{c.archive}: {c.src_member} is empty")
            counts[c.split] = counts.get(c.split, 0) + n
            print(f"| {c.split}: {n:9d} lines from {c.archive}:{c.src_member}")
        for split in handles.values():
            for h in split.values():
                h.close()
        handles = {}
        for split, paths in outputs.items():
            for lang, path in paths.items():
                os.replace(path, os.path.join(out_dir, f"{split}.{lang}"))
    finally:
        for split in locals().get("handles", {}).values():
            for h in split.values():
                h.close()
        shutil.rmtree(work, ignore_errors=True)
    return counts


def _count(path: str, name: str) -> int:
    return sum(1 for _ in read_text_lines(path, name))


def main(argv: Optional[List[str]] = None):
    # before fairseq's import configures the root logger at INFO (fairseq/tasks/text_to_speech.py); not at
    # import: the workflow imports this module into Snakemake's process, whose log it would repeat
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="check the archives, downloading the missing ones")
    p_fetch.add_argument("--no-download", action="store_true", help="stop at the first missing archive")
    p_fetch.add_argument("--no-verify", action="store_true", help="do not check the published checksums")
    p_fetch.add_argument("--mirror", default="", help="download FILE from MIRROR/FILE (a URL) instead of its URL")
    p_fetch.add_argument("--timeout", type=float, default=DOWNLOAD_TIMEOUT,
                         help=f"give up on a server that sends nothing for this many seconds (default {DOWNLOAD_TIMEOUT:g})")
    p_fetch.add_argument("--only", default="", help="this archive of the sources file alone (its FILE)")
    p_extract = sub.add_parser("extract", help="write SPLIT.{src,tgt} from the archives' members")
    p_extract.add_argument("--out-dir", required=True)
    for p in (p_fetch, p_extract):
        p.add_argument("--sources", required=True, help="the recipe's sources file")
        p.add_argument("--raw-dir", required=True, help="where the archives are (or go)")
        p.add_argument("--src", default="", help="source language (fills {src} in member names)")
        p.add_argument("--tgt", default="", help="target language (fills {tgt})")
    args = parser.parse_args(argv)
    if args.command == "fetch" and not args.timeout > 0:
        parser.error(f"--timeout must be a number of seconds above 0, got {args.timeout:g}")
    prog = os.path.basename(sys.argv[0] if argv is None else "wmt_data.py")
    try:
        archives, corpora = read_sources(args.sources, args.src, args.tgt)
        if args.command == "fetch":
            if args.only:
                archives = [a for a in archives if a.file == args.only]
                if not archives:
                    raise DataError(f"--only {args.only}: not an archive of {args.sources}")
            fetch(archives, args.raw_dir, allow_download=not args.no_download, check=not args.no_verify,
                  mirror=args.mirror, timeout=args.timeout)
        else:
            counts = extract(corpora, args.raw_dir, args.src, args.tgt, args.out_dir)
            print("| " + ", ".join(f"{k}: {v} pairs" for k, v in counts.items()))
    except (DataError, OSError) as e:
        parser.exit(2, f"{prog}: error: {e}\n")


if __name__ == "__main__":
    main()
