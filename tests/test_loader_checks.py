"""Loaders check what they load: damaged copies of the real files raise a `DataFileError` whose message starts
with the file's path and says what is wrong, and downloads are https only, digest-checked and atomic.

Each test writes a small corruption of a real file (or of a tiny fixture file) under ``tmp_path`` and loads it
through the public loader; nothing is downloaded (``urlopen`` is replaced by a fake that serves bytes).
"""

import gzip
import hashlib
import importlib
import io
import os
import re
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import torchssvm as ts
from torchssvm.data import DataFileError, DownloadError, UnverifiedDownloadWarning
from torchssvm.data.ocr import parse_letter_data
from torchssvm.data.paths import download_file, sha256

conll_module = importlib.import_module("torchssvm.data.conll2000")  # the package's names are the loader functions
ocr_module = importlib.import_module("torchssvm.data.ocr")


def _expect(path, message, load):
    """``load()`` raises a DataFileError that starts with ``path`` and matches ``message`` (a regex)."""
    with pytest.raises(DataFileError) as info:
        load()
    text = str(info.value)
    assert text.startswith(str(path) + ": "), text
    assert re.search(message, text), text
    return info.value


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _gz(text: str) -> bytes:
    return gzip.compress(text.encode("utf-8"), compresslevel=1, mtime=0)


def _put(root: Path, relpath: str, data: bytes) -> Path:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------------------------------- OCR


@pytest.fixture(scope="module")
def ocr_arrays(data_root):
    with np.load(os.path.join(data_root, "ocr", "letters.npz")) as z:
        return {k: z[k] for k in ("pixels", "labels", "lengths", "folds")}


def _ocr_with(tmp_path, arrays, **changes):
    a = {**arrays, **changes}
    path = tmp_path / "ocr" / "letters.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{k: v for k, v in a.items() if v is not None})
    return path


def _ocr_cases(a):
    """(name, changed arrays, message) of the npz corruptions."""
    lengths0 = a["lengths"].copy()
    lengths0[6] += lengths0[5]
    lengths0[5] = 0  # the case: the sum still matches, every later word would shift
    lengths_sum = a["lengths"].copy()
    lengths_sum[5] += 1
    labels = a["labels"].copy()
    labels[100] = 26
    folds_empty = a["folds"].copy()
    folds_empty[folds_empty == 3] = 4
    folds_range = a["folds"].copy()
    folds_range[0] = 10
    nan = a["pixels"].astype(np.float32)
    nan[7, 3] = np.nan
    gray = a["pixels"].copy()
    gray[0, 0] = 2
    moved = a["folds"].copy()
    moved[0] = 1  # one fold-0 word moved to fold 1: every count is fine except the fold sizes
    return [
        ("word length 0", {"lengths": lengths0}, r"lengths\[5\] = 0: every word needs at least one letter"),
        ("lengths off by one", {"lengths": lengths_sum}, r"lengths add up to 52,153 letters but the file holds 52,152"),
        ("label past 25", {"labels": labels}, r"labels\[100\] = 26 is outside \[0, 26\)"),
        ("empty fold", {"folds": folds_empty}, r"fold 3 holds no word"),
        ("fold past 9", {"folds": folds_range}, r"folds\[0\] = 10 is outside \[0, 10\)"),
        ("NaN pixel", {"pixels": nan}, r"pixels\[7, 3\] = nan is not finite"),
        ("non-binary pixel", {"pixels": gray}, r"pixels\[0, 0\] = 2: pixels must be 0 or 1"),
        ("missing array", {"folds": None}, r"has no array 'folds'"),
        ("word dropped", {"lengths": a["lengths"][:-1], "folds": a["folds"][:-1],
                          "labels": a["labels"][: -int(a["lengths"][-1])],
                          "pixels": a["pixels"][: -int(a["lengths"][-1])]}, r"expected 6,877 words \(the OCR data"),
        ("fold sizes", {"folds": moved}, r"expected folds of 626/704/.* got 625/705/"),
        ("string labels", {"labels": np.array(["a"] * len(a["labels"]))}, r"labels must hold integers"),
    ]


def test_ocr_npz_corruptions_name_the_file(tmp_path, ocr_arrays):
    cases = _ocr_cases(ocr_arrays)
    for i, (_name, changes, message) in enumerate(cases):
        path = _ocr_with(tmp_path / str(i), ocr_arrays, **changes)
        _expect(path, message, lambda i=i: ts.data.ocr("train", "small", root=str(tmp_path / str(i))))
    assert len(cases) == 11


def test_ocr_damaged_npz_bytes(tmp_path, data_root):
    real = (Path(data_root) / "ocr" / "letters.npz").read_bytes()
    cases = [  # (bytes, message, chained low-level error)
        (real[: len(real) // 2], r"not a readable npz archive: not a valid zip archive.*File is not a zip file",
         True),
        (_flip(real, len(real) // 3), r"not a readable npz archive: .*Bad CRC-32 for file 'pixels\.npy'", True),
        (b"pixels,labels\n0,1\n", r"is not an npz \(zip\) archive: it starts with b'pixe'", False),
        (b"", r"is empty, not an npz archive", False),
    ]
    for i, (data, message, chained) in enumerate(cases):
        path = _put(tmp_path / str(i), "ocr/letters.npz", data)
        err = _expect(path, message, lambda i=i: ts.data.ocr(root=str(tmp_path / str(i))))
        assert (err.__cause__ is not None) == chained  # the low-level error is chained


def _letter_lines(words):
    """Taskar's letter.data lines of ``[(word, fold)]`` (ids from 1, positions from 1)."""
    rng = np.random.default_rng(0)
    rows, idx = [], 1
    for w, (word, fold) in enumerate(words):
        for p, ch in enumerate(word):
            nxt = -1 if p == len(word) - 1 else idx + 1
            rows.append("\t".join(map(str, [idx, ch, nxt, w + 1, p + 1, fold, *rng.integers(0, 2, 128)])))
            idx += 1
    return rows


def test_ocr_letter_data_corruptions_name_the_file(tmp_path):
    good = _letter_lines([("cat", 3), ("ox", 0)])
    assert parse_letter_data(_put(tmp_path / "ok", "letter.data.gz", _gz("\n".join(good) + "\n")))["lengths"].tolist() \
        == [3, 2]
    fields = good[1].split("\t")
    cases = [
        ("upper-case letter", [good[0], "\t".join(fields[:1] + ["A"] + fields[2:]), *good[2:]],
         r"line 2: the letter must be one of a\.\.z, got 'A'"),
        ("line missing", [good[0], *good[2:]], r"line 2: id 3, but the previous line's next_id is 2"),
        ("position skips", [good[0], "\t".join(fields[:4] + ["3"] + fields[5:]), *good[2:]],
         r"line 2: letter position 3 follows 1"),
        ("word id changes inside a word", [good[0], "\t".join(fields[:3] + ["7"] + fields[4:]), *good[2:]],
         r"line 2: word id 7 inside word 1"),
        ("not an integer", [good[0], "\t".join(fields[:5] + ["x"] + fields[6:]), *good[2:]],
         r"line 2: the ids, position, fold and pixels must be integers"),
        ("pixel 2", [good[0], "\t".join(fields[:-1] + ["2"]), *good[2:]], r"line 2: pixels must be 0 or 1"),
        ("fold changes inside a word", [good[0], "\t".join(fields[:5] + ["4"] + fields[6:]), *good[2:]],
         r"line 2: fold 4 inside a word of fold 3"),
        ("short line", [good[0], good[1][:50], *good[2:]], r"line 2: expected 134 fields"),
        ("no end marker", good[:-1], r"the last word has no end marker"),
    ]
    for i, (_name, lines, message) in enumerate(cases):
        path = _put(tmp_path / str(i), "letter.data.gz", _gz("\n".join(lines) + "\n"))
        _expect(path, message, lambda path=path: parse_letter_data(path))
    whole = _gz("\n".join(good) + "\n")
    raw = [("truncated gzip", whole[:-12], r"truncated"),
           ("not utf-8", gzip.compress(b"1\t\xe9\t-1\n"), r"not utf-8 text: byte 0xe9"),
           ("not gzip", b"1\ta\t-1\n", r"not a valid gzip file")]
    for i, (_name, data, message) in enumerate(raw):
        path = _put(tmp_path / f"raw{i}", "letter.data.gz", data)
        _expect(path, message, lambda path=path: parse_letter_data(path))
    assert len(cases) + len(raw) == 12


# ------------------------------------------------------------------------------------------------ CoNLL-2000


@pytest.fixture(scope="module")
def conll_text(data_root):
    return {s: gzip.decompress((Path(data_root) / "conll2000" / f"{s}.txt.gz").read_bytes()).decode("utf-8")
            for s in ("train", "test")}


def test_conll2000_corruptions_name_the_file(tmp_path, conll_text, data_root):
    train, test = conll_text["train"], conll_text["test"]
    assert test.startswith("Rockwell NNP B-NP\n")
    real_train = (Path(data_root) / "conll2000" / "train.txt.gz").read_bytes()
    blank = test.index("\n\n")
    cases = [  # (split damaged, its bytes, message)
        ("train", real_train[: len(real_train) // 2], r"truncated"),
        ("train", _flip(real_train, len(real_train) // 2), r"corrupted|CRC|line \d+"),
        ("test", gzip.compress(test.replace("Rockwell", "Rockw\xe9ll", 1).encode("latin-1"), 1),
         r"not utf-8 text: byte 0xe9"),
        ("test", _gz(test.replace("Rockwell NNP B-NP", "Rockwell B-NP", 1)), r"line 1: expected 'word POS chunk'"),
        ("test", _gz(test.replace("Rockwell NNP B-NP", "Rockwell NNP X-NP", 1)),
         r"line 1: chunk tag 'X-NP' is not IOB2"),
        ("test", _gz(test[: test.rstrip().rindex("\n\n")] + "\n"), r"expected 2,012 sentences .* got 2,011"),
        ("test", _gz(test[:blank] + "\n" + test[blank + 2 :]), r"expected 2,012 sentences .* got 2,011"),
        ("train", _gz(train.replace(" B-NP\n", " B-FOO\n", 1)), r"expected 22 chunk tags .* got 23"),
        ("test", b"", r"expected 2,012 sentences"),
    ]
    for i, (split, data, message) in enumerate(cases):
        root = tmp_path / str(i)
        files = {"train": real_train, "test": _gz(test)}
        files[split] = data
        for s, b in files.items():
            _put(root, f"conll2000/{s}.txt.gz", b)
        _expect(root / "conll2000" / f"{split}.txt.gz", message,
                lambda root=root: ts.data.conll2000("test", root=str(root)))
    assert len(cases) == 9


# ------------------------------------------------------------------------------------------------------ a9a


@pytest.fixture(scope="module")
def a9a_lines(data_root):
    return gzip.decompress((Path(data_root) / "adult" / "a9a.txt.gz").read_bytes()).decode().splitlines()


def test_a9a_corruptions_name_the_file(tmp_path, a9a_lines, data_root):
    lines = a9a_lines
    real = (Path(data_root) / "adult" / "a9a.txt.gz").read_bytes()
    flipped = list(lines)
    i_neg = next(i for i, line in enumerate(lines) if line.startswith("-1"))
    flipped[i_neg] = "+1" + lines[i_neg][2:]
    text = "\n".join(lines) + "\n"
    cases = [
        (real[: len(real) - 100], r"truncated"),
        (gzip.compress(text.replace("\n", " \xe9\n", 1).encode("latin-1"), 1), r"not utf-8 text: byte 0xe9"),
        (text.encode(), r"not a valid gzip file"),
        (_gz("\n".join(["+2 3:1", *lines[1:]])), r"line 1: label must be \+1 or -1, got '\+2'"),
        (_gz("\n".join([lines[0] + " 123:nan", *lines[1:]])), r"line 1: feature 123 has non-finite value 'nan'"),
        (_gz("\n".join(lines[:-1])), r"expected 32,561 examples \(the a9a size\), got 32,560"),
        (_gz("\n".join(flipped)), r"expected 7,841 examples labelled \+1 \(the a9a count\), got 7,842"),
    ]
    for i, (data, message) in enumerate(cases):
        path = _put(tmp_path / str(i), "adult/a9a.txt.gz", data)
        err = _expect(path, message, lambda i=i: ts.data.a9a("all", root=str(tmp_path / str(i))))
        assert sha256(path) in str(err) and ts.data.adult.SHA256 in str(err)  # both digests, to tell them apart
    assert len(cases) == 7
    # a value finite in the file but past float32's range: named, not loaded as inf; float64 holds it
    label, first, *rest = lines[0].split()
    feature = int(first.split(":")[0])
    path = _put(tmp_path / "big", "adult/a9a.txt.gz", _gz("\n".join([" ".join([label, f"{feature}:1e300", *rest]),
                                                                     *lines[1:]])))
    for split in ("all", "train"):
        _expect(path, rf"x\[0, {feature - 1}\] = 1e\+300 does not fit float32",
                lambda split=split: ts.data.a9a(split, root=str(tmp_path / "big")))
    assert float(ts.data.a9a("all", root=str(tmp_path / "big"), dtype=torch.float64)[0][0, feature - 1]) == 1e300


# ---------------------------------------------------------------------------------------------------- Yeast


def test_yeast_corruptions_name_the_file(tmp_path, data_root):
    real = (Path(data_root) / "yeast" / "yeast_test.svm.gz").read_bytes()
    lines = gzip.decompress(real).decode().splitlines()
    head, feats = lines[0].split(" ", 1)
    assert feats.startswith("1:0.004168 ")
    cases = [
        (_gz("\n".join([f"{head},14 {feats}", *lines[1:]])), r"line 1: label 14 outside \[0, 14\)"),
        (_gz("\n".join([f"{head} {feats.replace('1:0.004168', '1:nan', 1)}", *lines[1:]])),
         r"line 1: feature 1 has the non-finite value 'nan'"),
        (_gz("\n".join([f"{head} {feats} 104:1", *lines[1:]])), r"line 1: feature id 104 outside \[1, 103\]"),
        (_gz("\n".join(lines[:-1])), r"expected 917 examples \(the Yeast test split\), got 916"),
        (real[: len(real) // 2], r"truncated"),
        (gzip.compress(b"0,1 1:0.5\n\xff 2:1\n"), r"not utf-8 text: byte 0xff"),
    ]
    for i, (data, message) in enumerate(cases):
        path = _put(tmp_path / str(i), "yeast/yeast_test.svm.gz", data)
        _expect(path, message, lambda i=i: ts.data.yeast("test", root=str(tmp_path / str(i))))
    assert len(cases) == 6
    path = _put(tmp_path / "big", "yeast/yeast_test.svm.gz",
                _gz("\n".join([f"{head} {feats.replace('1:0.004168', '1:1e300', 1)}", *lines[1:]])))
    _expect(path, r"x\[0, 0\] = 1e\+300 does not fit float32",
            lambda: ts.data.yeast("test", root=str(tmp_path / "big")))
    _expect(path, r"x\[0, 0\] = 1e\+300 does not fit float16",
            lambda: ts.data.yeast("test", root=str(tmp_path / "big"), dtype=torch.float16))


@pytest.mark.parametrize("relpath, load", [
    ("ocr/letters.npz", lambda root: ts.data.ocr("train", "small", root=root)),
    ("conll2000/train.txt.gz", lambda root: ts.data.conll2000("train", root=root)),
    ("adult/a9a.txt.gz", lambda root: ts.data.a9a("all", root=root)),
    ("yeast/yeast_test.svm.gz", lambda root: ts.data.yeast("test", root=root)),
])
def test_a_folder_where_the_file_should_be_is_named(tmp_path, relpath, load):
    (tmp_path / relpath).mkdir(parents=True)
    _expect(tmp_path / relpath, r"is a folder or another non-regular file", lambda: load(str(tmp_path)))


def test_conll2000_reads_a_file_changed_on_disk_again(tmp_path, conll_text, data_root):
    """The parse caches are keyed on the file's modification time and size, not its path alone: a file damaged
    after a first load raises on the next, as it would in a fresh process."""
    real_train = (Path(data_root) / "conll2000" / "train.txt.gz").read_bytes()
    _put(tmp_path, "conll2000/train.txt.gz", real_train)
    test = _put(tmp_path, "conll2000/test.txt.gz", _gz(conll_text["test"]))
    assert len(ts.data.conll2000("test", root=str(tmp_path))) == 2012
    data = test.read_bytes()
    test.write_bytes(data[: len(data) // 2])
    _expect(test, r"truncated", lambda: ts.data.conll2000("test", root=str(tmp_path)))


# ------------------------------------------------------------------------------------------------- downloads


class _Response(io.BytesIO):
    """A stand-in for ``urlopen``'s answer: serves ``data`` (announcing ``length`` bytes), ends at ``url``, and
    raises ConnectionResetError once ``fail_after`` bytes were read."""

    def __init__(self, data, url, *, length=None, fail_after=None):
        super().__init__(data)
        self.url, self.fail_after = url, fail_after
        self.headers = {"Content-Length": str(len(data) if length is None else length)}

    def geturl(self):
        return self.url

    def read(self, n=-1):
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise ConnectionResetError("connection reset by peer")
        return super().read(n)


def _serve(monkeypatch, data, **kw):
    calls = []

    def urlopen(url, timeout=None):
        calls.append(url)
        return _Response(data, kw.pop("final_url", url), **kw)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


def _left(folder: Path):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


URL = "https://example.org/data/file.gz"


def test_download_good_bytes_appear_atomically(tmp_path, monkeypatch):
    data = os.urandom(3 << 20)
    digest = hashlib.sha256(data).hexdigest()
    calls = _serve(monkeypatch, data)
    path = download_file(URL, tmp_path / "d" / "file.gz", digest=digest)
    assert calls == [URL] and path.read_bytes() == data and _left(tmp_path / "d") == ["file.gz"]


def test_download_failures_leave_nothing(tmp_path, monkeypatch):
    data = os.urandom(3 << 20)
    dest = tmp_path / "d" / "file.gz"
    cases = [  # (what the server does, digest, error, message)
        ({}, "0" * 64, DataFileError, r"the download from https://example.org/data/file.gz has SHA-256 [0-9a-f]{64}, "
                                      r"expected 0{64}; nothing was written"),
        ({"fail_after": 1 << 20}, None, DownloadError, r"download from https://example.org/data/file.gz failed: "
                                                        r"ConnectionResetError"),
        ({"length": len(data) + 10}, None, DownloadError, r"was cut short: 3,145,728 of 3,145,738 bytes"),
        ({"final_url": "http://example.org/data/file.gz"}, None, DownloadError, r"redirected to http://"),
    ]
    for kw, digest, error, message in cases:
        _serve(monkeypatch, data, **kw)
        with pytest.raises(error, match=message) as info:
            download_file(URL, dest, digest=digest)
        assert str(info.value).startswith(str(dest) + ": ")
        assert _left(dest.parent) == []  # neither the file nor a partial download
    calls = _serve(monkeypatch, data)
    for url in ("http://example.org/data/file.gz", "ftp://example.org/f", "file:///etc/hostname"):
        with pytest.raises(ValueError, match="only https:// URLs are fetched"):
            download_file(url, dest)
    assert calls == [] and _left(dest.parent) == []


def test_download_of_unknown_digest_warns(tmp_path, monkeypatch):
    _serve(monkeypatch, b"abc")
    with pytest.warns(UnverifiedDownloadWarning, match=r"no SHA-256 digest is known for https://example.org"):
        download_file(URL, tmp_path / "file.gz")
    assert (tmp_path / "file.gz").read_bytes() == b"abc"


def test_loader_downloads_are_https_and_checked(tmp_path, monkeypatch):
    """conll2000 checks its downloads against the recorded digests; OCR's source has none, so it warns and the
    content checks judge the file."""
    assert all(u.startswith("https://") for u in conll_module.URLS.values())
    assert ocr_module.SOURCE_URL.startswith("https://") and ocr_module.SOURCE_SHA256 is None
    calls = _serve(monkeypatch, _gz("not the shared-task file\n"))
    with pytest.raises(DataFileError, match=r"train\.txt\.gz: the download from https://www\.clips.*has SHA-256"):
        ts.data.conll2000(root=str(tmp_path), download=True)
    assert calls == [conll_module.URLS["train"]] and _left(tmp_path / "conll2000") == []

    _serve(monkeypatch, _gz("\n".join(_letter_lines([("cat", 3), ("ox", 0)])) + "\n"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _expect(tmp_path / "ocr" / "letter.data.gz", r"fold 1 holds no word",
                lambda: ts.data.ocr(root=str(tmp_path), download=True))
    assert any(issubclass(w.category, UnverifiedDownloadWarning) for w in seen)
    assert _left(tmp_path / "ocr") == ["letter.data.gz"]


def _letter_data_of(a) -> str:
    """Taskar's letter.data text of the npz arrays ``a`` (ids and positions from 1)."""
    rows, idx, start = [], 1, 0
    for w, (length, fold) in enumerate(zip(a["lengths"].tolist(), a["folds"].tolist())):
        for p in range(length):
            nxt = -1 if p == length - 1 else idx + 1
            px = "\t".join(map(str, a["pixels"][start + p].tolist()))
            rows.append(f"{idx}\t{chr(97 + int(a['labels'][start + p]))}\t{nxt}\t{w + 1}\t{p + 1}\t{fold}\t{px}\n")
            idx += 1
        start += length
    return "".join(rows)


def test_ocr_download_of_the_full_source_loads(tmp_path, monkeypatch, ocr_arrays, data_root):
    """A good download of Taskar's file passes every check and gives the shipped npz's data, with a warning that
    its bytes could not be verified."""
    _serve(monkeypatch, _gz(_letter_data_of(ocr_arrays)))
    with pytest.warns(UnverifiedDownloadWarning, match=r"letter\.data\.gz: no SHA-256 digest is known"):
        got = ts.data.ocr("train", "small", root=str(tmp_path), download=True)
    want = ts.data.ocr("train", "small", root=data_root)
    assert torch.equal(got.x, want.x) and torch.equal(got.y, want.y) and torch.equal(got.lengths, want.lengths)
