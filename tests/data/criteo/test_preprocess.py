"""Criteo preprocessing: the real sample read back row by row, bad input under both policies, re-runs."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from dlrm.data.criteo.format import KAGGLE_TABLE_SIZES, CriteoFormatError, ParseOptions, parse_block
from dlrm.data.criteo.preprocess import main, preprocess
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.criteo import SAMPLE, needs_sample

pytestmark = needs_sample
MODULO = ParseOptions(policy="fail", id_map="modulo", table_sizes=tuple(KAGGLE_TABLE_SIZES))


def raw_rows():
    """The sample parsed by plain Python, independently of the vectorised parser."""
    text = SAMPLE.read_text()
    assert not text.endswith("\n"), "the sample is meant to lack a trailing newline"
    return [line.split("\t") for line in text.split("\n")]


def load(out, day=0):
    return {k: np.load(os.path.join(out, f"day_{day}_{k}.npy")) for k in ("dense", "sparse", "labels")}


def write_lines(path: Path, lines, end="\n"):
    path.write_text("\n".join(lines) + end)
    return str(path)


def test_sample_read_back_row_by_row(tmp_path):
    m = preprocess([str(SAMPLE)], str(tmp_path), MODULO)
    rows = raw_rows()
    got = load(tmp_path)
    assert len(rows) == 100 and m["total_rows"] == 100 and m["days"][0]["skipped"] == 0
    assert got["dense"].dtype == np.float32 and got["dense"].shape == (100, 13)
    assert got["sparse"].dtype == np.int32 and got["sparse"].shape == (100, 26)
    assert got["labels"].dtype == np.int32 and got["labels"].shape == (100, 1)
    for i, r in enumerate(rows):
        assert got["labels"][i, 0] == int(r[0])
        for j in range(13):
            want = np.float32(math.log1p(max(int(r[1 + j] or 0), 0)))
            assert got["dense"][i, j] == pytest.approx(want, rel=1e-6), (i, j)
        for j in range(26):
            assert got["sparse"][i, j] == int(r[14 + j] or "0", 16) % KAGGLE_TABLE_SIZES[j], (i, j)
    assert got["labels"].sum() == 29
    assert (got["dense"] == 0).any(), "missing and negative dense values map to 0"
    # manifest: inputs, counts, transform, mapping, checksums that match the files
    day = m["days"][0]
    assert day["input"]["path"] == os.path.abspath(SAMPLE) and day["lines"] == 100
    assert m["table_sizes"] == KAGGLE_TABLE_SIZES and m["id_map"]["kind"] == "modulo"
    assert "log(1 + max(x, 0))" in m["dense_transform"]
    assert day["max_ids"] == got["sparse"].max(0).tolist()
    for f in day["files"].values():
        data = (tmp_path / f["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == m


def test_raw_ids_without_hashing(tmp_path):
    preprocess([str(SAMPLE)], str(tmp_path), ParseOptions())
    sparse = load(tmp_path)["sparse"]
    assert sparse.dtype == np.int64
    for i, r in enumerate(raw_rows()):
        assert sparse[i].tolist() == [int(x or "0", 16) for x in r[14:]]


def test_gzip_blocks_and_ranges_give_the_same_output(tmp_path):
    ref = tmp_path / "ref"
    preprocess([str(SAMPLE)], str(ref), MODULO)
    gz = tmp_path / "sample.tsv.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    # gzip, tiny blocks (lines split across reads), and a plain file cut into 2 byte ranges on 2 workers
    preprocess([str(gz)], str(tmp_path / "gz"), MODULO, block_bytes=1000)
    preprocess([str(SAMPLE)], str(tmp_path / "ranges"), MODULO, workers=2, block_bytes=3000, min_range_bytes=1)
    for name in ("gz", "ranges"):
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        assert m["days"][0]["files"] == json.loads((ref / "manifest.json").read_text())["days"][0]["files"], name


def test_parallel_files_and_cli(tmp_path):
    a = write_lines(tmp_path / "a.tsv", SAMPLE.read_text().split("\n")[:40])
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrm.data.criteo.preprocess",
            "--out",
            str(out),
            "--table-sizes",
            "kaggle",
            "--workers",
            "2",
            a,
            str(SAMPLE),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "rows/s" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert [d["rows"] for d in m["days"]] == [40, 100]
    assert np.array_equal(load(out, 0)["sparse"], load(out, 1)["sparse"][:40])


# ------------------------------------------------------------------ bad input, both policies
def good_lines():
    return SAMPLE.read_text().split("\n")[:10]


def with_bad(line_no: int, bad_line: str):
    lines = good_lines()
    lines.insert(line_no - 1, bad_line)
    return lines


def _field(line: str, i: int, value: str) -> str:
    f = line.split("\t")
    f[i] = value
    return "\t".join(f)


BAD_CASES = {
    # name: (lines, bad line number, words the error must contain)
    "too_few_fields": (lambda L: with_bad(4, "\t".join(L[0].split("\t")[:39])), 4, ["39 tab-separated fields"]),
    "too_many_fields": (lambda L: with_bad(3, L[0] + "\textra"), 3, ["41 tab-separated fields"]),
    "dense_not_integer": (lambda L: with_bad(5, _field(L[1], 3, "1.5")), 5, ["I3", "'1.5'", "decimal"]),
    "dense_garbage": (lambda L: with_bad(2, _field(L[1], 1, "-")), 2, ["I1", "'-'"]),
    "invalid_hex": (lambda L: with_bad(7, _field(L[1], 20, "zz12ab34")), 7, ["C7", "'zz12ab34'", "hexadecimal"]),
    "hex_too_long": (lambda L: with_bad(7, _field(L[1], 14, "1" * 17)), 7, ["C1", "hexadecimal"]),
    "bad_label": (lambda L: with_bad(6, _field(L[1], 0, "2")), 6, ["label", "'2'"]),
    "empty_line": (lambda L: with_bad(3, ""), 3, ["empty line"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_line_fail_policy(tmp_path, case):
    make, line_no, words = BAD_CASES[case]
    path = write_lines(tmp_path / "bad.tsv", make(good_lines()))
    with pytest.raises(CriteoFormatError) as e:
        preprocess([path], str(tmp_path / "out"), MODULO)
    msg = str(e.value)
    for w in [path, f"line {line_no}", "--policy skip", *words]:
        assert w in msg, (w, msg)
    assert not list((tmp_path / "out").glob("day_0*")), "a failed day leaves no output that looks complete"


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_line_skip_policy(tmp_path, case):
    make, line_no, _ = BAD_CASES[case]
    path = write_lines(tmp_path / "bad.tsv", make(good_lines()))
    m = preprocess([path], str(tmp_path / "out"), ParseOptions("skip", "modulo", tuple(KAGGLE_TABLE_SIZES)))
    day = m["days"][0]
    assert (day["rows"], day["skipped"], day["lines"]) == (10, 1, 11)
    assert day["skipped_examples"][0]["line"] == line_no
    ref = tmp_path / "ref"
    preprocess([write_lines(tmp_path / "good.tsv", good_lines())], str(ref), MODULO)
    for k, v in load(tmp_path / "out").items():
        assert np.array_equal(v, load(ref)[k]), k


def test_missing_trailing_newline_is_not_an_error(tmp_path):
    lines = good_lines()
    for end in ("", "\n"):
        m = preprocess([write_lines(tmp_path / f"x{len(end)}.tsv", lines, end)], str(tmp_path / f"o{len(end)}"), MODULO)
        assert m["days"][0]["rows"] == 10 and m["days"][0]["skipped"] == 0
    assert np.array_equal(load(tmp_path / "o0")["sparse"], load(tmp_path / "o1")["sparse"])


def test_id_outside_table_without_hashing(tmp_path):
    sizes = [2**32] * 26
    sizes[4] = 100  # C5 values are 8-digit hex: far outside
    path = write_lines(tmp_path / "x.tsv", good_lines())
    with pytest.raises(CriteoFormatError, match=r"line 1, field C5: id \d+ is outside the table of 100 rows"):
        preprocess([path], str(tmp_path / "fail"), ParseOptions("fail", "none", tuple(sizes)))
    m = preprocess([path], str(tmp_path / "skip"), ParseOptions("skip", "none", tuple(sizes)))
    raw_c5 = [int(line.split("\t")[18] or "0", 16) for line in good_lines()]
    assert m["days"][0]["skipped"] == sum(v >= 100 for v in raw_c5)
    assert (load(tmp_path / "skip")["sparse"][:, 4] < 100).all()


def test_truncated_gzip(tmp_path):
    """A gzip stream that breaks in the middle of line 51: 50 rows, the cut-off line counted, never parsed."""
    text = SAMPLE.read_bytes()
    cut = text.index(b"\t", sum(len(line) + 1 for line in text.split(b"\n")[:50]))  # inside line 51
    gz = zlib.compressobj(wbits=31)  # gzip framing
    path = tmp_path / "cut.tsv.gz"
    path.write_bytes(gz.compress(text[:cut]) + gz.flush(zlib.Z_FULL_FLUSH))  # no end of stream, no trailer
    with pytest.raises(CriteoFormatError, match="truncated or corrupt.*--policy skip"):
        preprocess([str(path)], str(tmp_path / "fail"), MODULO)
    m = preprocess([str(path)], str(tmp_path / "skip"), ParseOptions("skip", "modulo", tuple(KAGGLE_TABLE_SIZES)))
    day = m["days"][0]
    assert day["truncated"] and day["rows"] == 50
    assert day["skipped"] == 1 and "incomplete last line" in day["skipped_examples"][0]["reason"]
    assert day["skipped_examples"][0]["line"] == 51
    ref = tmp_path / "ref"
    preprocess([str(SAMPLE)], str(ref), MODULO)
    for k, v in load(tmp_path / "skip").items():  # only complete lines, all of them correct
        assert np.array_equal(v, load(ref)[k][: day["rows"]]), k


def test_empty_file(tmp_path):
    path = tmp_path / "empty.tsv"
    path.write_bytes(b"")
    with pytest.raises(CriteoFormatError, match="empty"):
        preprocess([str(path)], str(tmp_path / "fail"), MODULO)
    m = preprocess([str(path)], str(tmp_path / "skip"), ParseOptions("skip", "modulo", tuple(KAGGLE_TABLE_SIZES)))
    assert m["days"][0]["rows"] == 0 and m["days"][0]["empty"]
    assert load(tmp_path / "skip")["dense"].shape == (0, 13)


def test_cli_error_message_and_exit_code(tmp_path, capsys):
    path = write_lines(tmp_path / "bad.tsv", with_bad(2, _field(good_lines()[0], 2, "x")))
    assert main([path, "--out", str(tmp_path / "o"), "--table-sizes", "kaggle"]) == 2
    err = capsys.readouterr().err
    assert "line 2, field I2" in err and "'x'" in err


def test_parse_block_reports_every_bad_line():
    lines = good_lines()
    lines[1] = ""
    lines[8] = _field(lines[8], 30, "g")
    p = parse_block(("\n".join(lines) + "\n").encode(), MODULO, first_line=11)
    assert [(b.line, b.field) for b in p.bad] == [(12, "line"), (19, "C17")]
    assert p.dense.shape == (8, 13) and p.lines == 10


# ------------------------------------------------------------------ re-runs and killed runs
def test_rerun_skips_complete_days_and_redoes_the_rest(tmp_path):
    a = write_lines(tmp_path / "a.tsv", good_lines())
    out = tmp_path / "out"
    m1 = preprocess([a, str(SAMPLE)], str(out), MODULO)
    assert m1["last_run"]["days_converted"] == [0, 1]
    m2 = preprocess([a, str(SAMPLE)], str(out), MODULO)
    assert m2["last_run"]["days_converted"] == []
    assert m2["days"] == m1["days"]
    # a killed run: day 1 renamed but its day_1.json never written, plus stray temporary files
    (out / "day_1.json").unlink()
    (out / ".tmp_day_1_part0_dense.npy").write_bytes(b"partial")
    # a run that fails part-way leaves no manifest.json, so the loader refuses the directory
    bad = write_lines(tmp_path / "bad.tsv", with_bad(2, ""))
    with pytest.raises(CriteoFormatError):
        preprocess([a, str(SAMPLE), bad], str(out), MODULO)
    assert not (out / "manifest.json").exists() and (out / "day_1.json").exists()
    (out / "day_1.json").unlink()
    m3 = preprocess([a, str(SAMPLE)], str(out), MODULO)
    assert m3["last_run"]["days_converted"] == [1]
    assert not list(out.glob(".tmp*"))
    assert m3["days"] == m1["days"]
    # changed options redo everything
    m4 = preprocess([a, str(SAMPLE)], str(out), ParseOptions())
    assert m4["last_run"]["days_converted"] == [0, 1] and m4["sparse_dtype"] == "int64"
    shutil.rmtree(out)


def test_integer_edge_cases_match_python():
    """Dense values of every width and sign, and hex ids of 0-16 digits, against int()."""
    dense_ok = ["", "0", "-0", "7", "-1", "-2", "12345678", "123456789", "-123456789", "999999999999999999", "00012"]
    dense_bad = ["-", "--1", "1-2", "+5", " 5", "1.5", "1e3", "0x10", "9" * 19, "ab"]
    hex_ok = ["", "0", "a", "F", "05db9164", "ABCDEF01", "123456789", "7fffffffffffffff", "0000000000000001"]
    hex_bad = ["g", "-1", "0x1f", "1" * 17, " 1", "12 4", "ffffffffffffffff"]  # the last does not fit int64
    base = good_lines()[0].split("\t")
    lines, want = [], []
    for v in dense_ok + dense_bad:
        lines.append("\t".join(base[:5] + [v] + base[6:]))
        want.append(v in dense_ok)
    for v in hex_ok + hex_bad:
        lines.append("\t".join(base[:20] + [v] + base[21:]))
        want.append(v in hex_ok)
    p = parse_block(("\n".join(lines) + "\n").encode(), ParseOptions("skip"))
    assert [b.line for b in p.bad] == [i + 1 for i, ok in enumerate(want) if not ok]
    assert {b.field for b in p.bad} == {"I5", "C7"}
    n = len(dense_ok)
    expect = [np.float32(math.log1p(max(int(v or 0), 0))) for v in dense_ok]
    assert p.dense[:n, 4].tolist() == pytest.approx(expect, rel=1e-6)
    assert p.sparse[n:, 6].tolist() == [int(v or "0", 16) for v in hex_ok]


def test_deterministic_shuffle(tmp_path):
    ref = tmp_path / "ref"
    preprocess([str(SAMPLE)], str(ref), MODULO)
    opts = ParseOptions("fail", "modulo", tuple(KAGGLE_TABLE_SIZES), shuffle_seed=5)
    m1 = preprocess([str(SAMPLE)], str(tmp_path / "s1"), opts)
    m2 = preprocess([str(SAMPLE)], str(tmp_path / "s2"), opts)
    assert m1["days"][0]["files"] == m2["days"][0]["files"], "same seed, same bytes"
    a, r = load(tmp_path / "s1"), load(ref)
    perm = np.random.default_rng([5, 0]).permutation(100)
    for k in a:
        assert np.array_equal(a[k], r[k][perm]), k
    assert not np.array_equal(a["sparse"], r["sparse"])
    for f in m1["days"][0]["files"].values():
        assert hashlib.sha256((tmp_path / "s1" / f["name"]).read_bytes()).hexdigest() == f["sha256"]


@pytest.mark.parametrize("min_count", [1, 2])
def test_contiguous_ids_with_frequency_threshold(tmp_path, min_count):
    a = write_lines(tmp_path / "a.tsv", good_lines())
    files = [str(SAMPLE), a]
    m = preprocess(files, str(tmp_path / "out"), ParseOptions(), contiguous_min_count=min_count)
    rows = [line.split("\t") for f in files for line in Path(f).read_text().strip("\n").split("\n")]
    got = np.concatenate([load(tmp_path / "out", d)["sparse"] for d in (0, 1)])
    assert got.dtype == np.int32 and m["id_map"]["kind"] == "contiguous" and m["sparse_dtype"] == "int32"
    for c in range(26):
        raw = [int(r[14 + c] or "0", 16) for r in rows]
        counts = {v: raw.count(v) for v in raw}
        vocab = sorted(v for v, n in counts.items() if n >= min_count)
        assert m["table_sizes"][c] == len(vocab) + 1
        want = [vocab.index(v) + 1 if v in vocab else 0 for v in raw]
        assert got[:, c].tolist() == want, c
        assert np.load(tmp_path / "out" / f"vocab_C{c + 1}.npy").tolist() == vocab
    for d, meta in enumerate(m["days"]):
        f = meta["files"]["sparse"]
        assert hashlib.sha256((tmp_path / "out" / f["name"]).read_bytes()).hexdigest() == f["sha256"]
        assert meta["max_ids"] == load(tmp_path / "out", d)["sparse"].max(0).tolist()
    again = preprocess(files, str(tmp_path / "out"), ParseOptions(), contiguous_min_count=min_count)
    assert again == m, "a finished contiguous run is reused"


def test_streamed_npy_files_are_numpys_own(tmp_path):
    """NpyWriter's header is numpy's (its length fixed whatever the row count, so it is rewritten in
    place); concat_parts joins parts into one file numpy reads back, with the sha256 of its bytes."""
    import hashlib

    import numpy as np

    from dlrm.data.criteo.npy import NpyWriter, concat_parts, npy_header

    assert {len(npy_header(np.dtype("<i4"), (n, 26))) for n in (0, 7, 10**15)} == {128}
    blocks = [np.arange(i * 6, i * 6 + 6, dtype=np.int32).reshape(2, 3) for i in range(3)]
    parts = []
    for i, block in enumerate(blocks):
        w = NpyWriter(str(tmp_path / f"part{i}.npy"), np.int32, 3)
        w.append(block[:1])
        w.append(block[1:])
        w.close()
        np.testing.assert_array_equal(np.load(tmp_path / f"part{i}.npy"), block)
        parts.append(str(tmp_path / f"part{i}.npy"))
    rows, digest = concat_parts(parts, str(tmp_path / "all.npy"), np.int32, 3)
    assert rows == 6 and digest == hashlib.sha256((tmp_path / "all.npy").read_bytes()).hexdigest()
    np.testing.assert_array_equal(np.load(tmp_path / "all.npy"), np.concatenate(blocks))
