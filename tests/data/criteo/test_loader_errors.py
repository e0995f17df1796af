"""Hostile preprocessed Criteo: the loader refuses every damaged or wrong file before training.

Each case damages a copy of a small preprocessed directory and asserts one CriteoDataError (a
UserError: exit 2 in the entry points) that names the file and the fix; `dlrm.train` itself is run
for a representative case (exit 2, one `error:` line, no traceback).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dlrm.common.errors import UserError
from dlrm.config import CriteoConfig
from dlrm.data.criteo.loader import CriteoDataError, CriteoSource
from tests.helpers.cli import train_in_process
from tests.helpers.criteo import ROOT, SAMPLE
from tests.helpers.criteo_data import (
    GBS,
    NAMES,
    TABLE_ROWS,
    copy,
    edit_manifest,
    load,
    make_dataset,
    rewrite,
    set_file_in_manifest,
    snapshot,
)

pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("criteo") / "out")


@pytest.fixture
def data(base, tmp_path):
    return copy(base, tmp_path / "data")


def open_source(directory, checksums=True, rows=TABLE_ROWS, gbs=GBS, **kw):
    cfg = CriteoConfig(dir=str(directory), train_days=kw.pop("train_days", [0]), verify_checksums=checksums, **kw)
    return CriteoSource(cfg, NAMES, list(rows), gbs, seed=0)


def refused(directory, *words, **kw) -> str:
    """Assert the loader refuses `directory` with a message holding every word, a fix, and no change to it."""
    before = snapshot(directory)
    with pytest.raises(CriteoDataError) as e:
        open_source(directory, **kw)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)
    assert any(fix in msg for fix in ("re-run", "Fix:", "give", "lower", "preprocess")), msg
    assert snapshot(directory) == before, "verification never changes the data"
    return msg


def test_the_undamaged_copy_loads(data):
    src = open_source(data, train_days=[0, 1])
    assert src.num_batches("train") == 14


# ------------------------------------------------------------------ contents
def test_id_beyond_the_table(data):
    s = load(data, 0, "sparse")
    s[37, 4] = 2000
    p = rewrite(data, 0, "sparse", s)
    refused(data, str(p), "row 37", "C5", "id 2000", "only 2000 rows", "--table-sizes")


def test_negative_id(data):
    s = load(data, 0, "sparse")
    s[99, 25] = -3
    p = rewrite(data, 0, "sparse", s)
    refused(data, str(p), "row 99", "C26", "id -3", ">= 0")


def test_label_of_7(data):
    lab = load(data, 0, "labels")
    lab[12, 0] = 7
    p = rewrite(data, 0, "labels", lab)
    refused(data, str(p), "row 12", "label 7", "0 or 1")


def test_negative_label(data):
    lab = load(data, 1, "labels")
    lab[3, 0] = -1
    p = rewrite(data, 1, "labels", lab)
    refused(data, str(p), "row 3", "label -1", train_days=[0], eval_days=[1])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_dense(data, value):
    d = load(data, 0, "dense")
    d[55, 2] = value
    p = rewrite(data, 0, "dense", d)
    refused(data, str(p), "row 55", "column I3", "finite")


# ------------------------------------------------------------------ dtypes and layout
@pytest.mark.parametrize(
    "kind,dtype",
    [
        ("sparse", np.float32),
        ("sparse", np.float64),
        ("labels", np.float32),
        ("labels", np.int64),
        ("dense", np.float64),
        ("dense", np.float16),
        ("sparse", ">i4"),
    ],
)
def test_wrong_dtype_is_not_cast(data, kind, dtype):
    p = rewrite(data, 0, kind, load(data, 0, kind).astype(dtype))
    refused(data, str(p), "dtype", "re-run")


def test_reshaped_file(data):
    s = load(data, 0, "sparse")
    p = rewrite(data, 0, "sparse", s.reshape(50, 52))
    refused(data, str(p), "shape [50, 52]", "[rows, 26]")


def test_fortran_order(data):
    p = rewrite(data, 0, "dense", np.asfortranarray(load(data, 0, "dense")))
    refused(data, str(p), "Fortran")


def test_three_dimensional(data):
    p = rewrite(data, 0, "labels", load(data, 0, "labels").reshape(100, 1, 1))
    refused(data, str(p), "shape [100, 1, 1]")


def test_row_counts_disagree(data):
    p = rewrite(data, 0, "labels", load(data, 0, "labels")[:90])
    refused(data, str(p), "90 rows", "says day 0 has 100")


@pytest.mark.parametrize("cut", [1, 7, 200, 4000])
def test_truncated_file(data, cut):
    p = data / "day_0_sparse.npy"
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) - cut])
    msg = refused(data, str(p))
    assert ("truncated" in msg) or ("not a valid .npy" in msg)


def test_padded_file(data):
    p = data / "day_0_dense.npy"
    p.write_bytes(p.read_bytes() + b"\0" * 52)
    refused(data, str(p), "longer than its header")


@pytest.mark.parametrize(
    "content",
    [b"", b"NOTNUMPY" + b"\0" * 200, b"\x93NUMPY\x03\x00" + b"\0" * 200, b"\x93NUMPY\x01\x00\xff\xff{"],
    ids=["empty", "bad-magic", "version-3", "header-longer-than-file"],
)
def test_not_an_npy_file(data, content):
    p = data / "day_0_labels.npy"
    p.write_bytes(content)
    refused(data, str(p))


def test_pickled_object_array_never_runs(data, tmp_path):
    """An object array's pickle would call os.system on load; the header is refused, nothing runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    arr = np.empty((100, 1), dtype=object)
    arr[0, 0] = Payload()
    p = data / "day_0_labels.npy"
    with open(p, "wb") as f:
        np.lib.format.write_array(f, arr, allow_pickle=True)
    assert b"system" in p.read_bytes(), "the payload is in the file"
    set_file_in_manifest(data, 0, "labels")
    refused(data, str(p), "'|O'")
    assert not marker.exists()


def test_huge_header(data):
    p = data / "day_0_labels.npy"
    header = "{'descr': '<i4', 'fortran_order': False, 'shape': (100, 1), }" + " " * 200_000 + "\n"
    p.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header.encode() + b"\0" * 400)
    refused(data, str(p), "not a valid .npy")


def test_missing_file(data):
    (data / "day_0_dense.npy").unlink()
    refused(data, "day_0_dense.npy", "missing")


# ------------------------------------------------------------------ checksums
def test_flip_that_stays_valid_is_caught_by_the_checksum(data):
    p = data / "day_0_dense.npy"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0x01  # the lowest mantissa bit of the last value: still finite
    p.write_bytes(bytes(raw))
    refused(data, str(p), "sha256", "verify_checksums=false")
    src = open_source(data, checksums=False)  # the switch skips only the checksum
    assert src.num_batches("train") == 10


def test_sparse_dtype_differs_from_manifest(data):
    rewrite(data, 0, "sparse", load(data, 0, "sparse").astype(np.int64))
    refused(data, "day_0_sparse.npy", "int64", "manifest.json says int32")


def test_size_differs_from_manifest(data):
    edit_manifest(data, lambda m: m["days"][0]["files"]["dense"].update(bytes=123))
    refused(data, "day_0_dense.npy", "manifest.json says 123")


# ------------------------------------------------------------------ manifest.json
@pytest.mark.parametrize(
    "damage,words",
    [
        (lambda m: m.update(days={}), ["no list 'days'"]),
        (lambda m: m["days"][1].update(day=0), ["day 0 is listed twice"]),
        (lambda m: m["days"][0].update(rows=-5), ["rows = -5"]),
        (lambda m: m["days"][0].update(rows="100"), ["rows = '100'"]),
        (lambda m: m["days"][0].update(rows=150), ["says day 0 has 150"]),
        (lambda m: m["days"][0]["files"].pop("labels"), ["files lacks"]),
        (lambda m: m["days"][0]["files"]["sparse"].update(sha256="zz"), ["sha256 = 'zz'"]),
        (lambda m: m.update(sparse_dtype="float32"), ["sparse_dtype 'float32'"]),
    ],
    ids=[
        "days-not-list",
        "duplicate-day",
        "negative-rows",
        "string-rows",
        "wrong-rows",
        "no-labels-file",
        "bad-digest",
        "bad-sparse-dtype",
    ],
)
def test_damaged_manifest(data, damage, words):
    edit_manifest(data, damage)
    refused(data, "manifest.json", *words)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[]", b"null", b'{"days": [1]}'])
def test_manifest_not_a_manifest(data, content):
    (data / "manifest.json").write_bytes(content)
    refused(data, "manifest.json")


# ------------------------------------------------------------------ too little data, and the entry point
def test_too_few_rows_for_one_global_batch_is_refused_when_built(data):
    refused(data, "40 rows", "less than one global batch of 64", "data.global_batch_size", train_days=[1], gbs=64)


def train_config(directory, *extra):
    from dlrm.config.compose import compose

    return compose(
        [
            "data=criteo_kaggle",
            f"data.criteo.dir={directory}",
            "data.criteo.eval_fraction=0",
            "data.global_batch_size=8",
            "optim=sgd",
            "trainer.max_steps=2",
            "trainer.progress=none",
            *extra,
        ]
    )


def test_train_refuses_before_building_tables(data, monkeypatch):
    """Too few rows (and any data error) stops dlrm.train before a process group or a table exists."""
    import dlrm.trainer.build
    from dlrm.train import run

    def never(*a, **k):
        raise AssertionError("built before the data were checked")

    monkeypatch.setattr(dlrm.trainer.build, "build_model", never)
    monkeypatch.setattr(dlrm.trainer.build, "init_distributed", never)
    for k, v in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(CriteoDataError, match="less than one global batch of 512"):
        run(train_config(data, "data.global_batch_size=512"))
    lab = load(data, 0, "labels")
    lab[5, 0] = 7
    rewrite(data, 0, "labels", lab)
    with pytest.raises(CriteoDataError, match="label 7"):
        run(train_config(data))


def test_train_cli_exits_2_with_one_line(capfd, data, tmp_path):
    """`python -m dlrm.train` (in the test process) over an id out of its table: one error line naming the file."""
    s = load(data, 0, "sparse")
    s[10, 0] = 5000
    p = rewrite(data, 0, "sparse", s)
    code, out, err = train_in_process(
        capfd,
        "data=criteo_kaggle",
        f"data.criteo.dir={data}",
        "data.criteo.eval_fraction=0",
        "data.global_batch_size=8",
        "trainer.max_steps=2",
        "trainer.progress=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=ROOT,
    )
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(p) in errors[0] and "id 5000" in errors[0] and "Fix:" in errors[0], err
    assert "Traceback" not in err
    assert json.loads((data / "manifest.json").read_text())["days"][0]["rows"] == 100
