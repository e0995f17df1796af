"""Bundles (`python -m dlrm.export CKPT OUT --format bundle`) scored where the package is not: the
reference reader (examples/serving/score_parquet.py) in a process where `import dlrm` fails reads
Parquet rows from the spec alone, and its probabilities equal `dlrm.predict`'s (of the file and of
the bundle) and the trainer's evaluation, for the README's main job's model and a two-task Parquet
model (fp32: within 1e-5; AOTInductor fuses the MLPs in another order than eager)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dlrm.trainer.metrics import auc_and_logloss
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.bundles import CRITEO_GBS, EVAL_FRACTION, TASKS, Job
from tests.helpers.cli import predict_in_process as predict
from tests.helpers.criteo import SAMPLE

READER = REPO / "examples" / "serving" / "score_parquet.py"
FP32 = 1e-5  # probabilities of the compiled program vs eager PyTorch

WITHOUT_DLRM = """
import runpy, sys
sys.modules["dlrm"] = None  # `import dlrm` raises ImportError from here on
try:
    import dlrm
except ImportError:
    pass
else:
    raise SystemExit("dlrm is importable")
sys.argv = ["score_parquet.py", *sys.argv[1:]]
try:
    runpy.run_path({reader!r}, run_name="__main__")
finally:
    assert sys.modules["dlrm"] is None and not [m for m in sys.modules if m.startswith("dlrm.")]
"""


def score_without_dlrm(bundle: Path, data: Path, out: Path, cwd: Path) -> np.ndarray:
    code = WITHOUT_DLRM.format(reader=str(READER))
    r = subprocess.run(
        [sys.executable, "-c", code, str(bundle), str(data), "--out", str(out), "--batch-size", "7"],
        cwd=cwd,  # not the repository: nothing of it on sys.path
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(out, allow_pickle=False)


def criteo_rows_as_parquet(first: int, count: int, out: Path) -> Path:
    """Raw Criteo sample rows [first, first + count) as Parquet: label, I1..I13 (int64, null where the
    TSV is empty), C1..C26 (the hexadecimal strings, "" where empty)."""
    lines = SAMPLE.read_text().splitlines()[first : first + count]
    fields = [line.split("\t") for line in lines]
    columns: dict[str, pa.Array] = {"label": pa.array([int(f[0]) for f in fields])}
    for k in range(13):
        columns[f"I{k + 1}"] = pa.array([int(f[1 + k]) if f[1 + k] else None for f in fields], pa.int64())
    for k in range(26):
        columns[f"C{k + 1}"] = pa.array([f[14 + k] for f in fields], pa.string())
    pq.write_table(pa.table(columns), out)
    return out


def test_main_job_bundle_scored_without_the_package_equals_predict_and_the_trainers_eval(
    criteo_job: Job, capsys, tmp_path
):
    eval_rows = (20 // CRITEO_GBS) * CRITEO_GBS  # the trainer's eval: the held-out 20 rows' full batches
    rows = criteo_rows_as_parquet(80, eval_rows, tmp_path / "heldout.parquet")
    reader = score_without_dlrm(criteo_job.bundle, rows, tmp_path / "reader.npy", tmp_path)
    scored = {}
    for name, model in (("file", criteo_job.file), ("bundle", criteo_job.bundle)):
        out = tmp_path / f"{name}.npy"
        rc, _, err = predict(
            capsys, model, "--data", criteo_job.data, "--eval-fraction", EVAL_FRACTION, "--max-rows", eval_rows,
            "--out", out,
        )  # fmt: skip
        assert rc == 0, err
        scored[name] = np.load(out)
    assert reader.shape == (eval_rows,) and reader.dtype == np.float32
    np.testing.assert_allclose(reader, scored["file"], rtol=0, atol=FP32)
    np.testing.assert_allclose(scored["bundle"], scored["file"], rtol=0, atol=FP32)
    summary = json.loads((criteo_job.run / "summary.json").read_text())
    labels = torch.from_numpy(pq.read_table(rows).column("label").to_numpy().astype(np.float32))
    auc, logloss = auc_and_logloss(torch.logit(torch.from_numpy(reader).double()), labels)
    assert auc == pytest.approx(summary["eval_auc"], abs=1e-6)
    assert logloss == pytest.approx(summary["eval_logloss"], rel=1e-4)


def test_multitask_parquet_bundle_scored_without_the_package_equals_predict_and_the_trainers_eval(
    parquet_job: Job, capsys, tmp_path
):
    reader = score_without_dlrm(parquet_job.bundle, parquet_job.data, tmp_path / "reader.npy", tmp_path)
    scored = {}
    for name, model in (("file", parquet_job.file), ("bundle", parquet_job.bundle)):
        out = tmp_path / f"{name}.npy"
        rc, _, err = predict(capsys, model, "--data", parquet_job.data, "--out", out)
        assert rc == 0, err
        scored[name] = np.load(out)
    assert reader.shape == scored["file"].shape == (192, 2)
    np.testing.assert_allclose(reader, scored["file"], rtol=0, atol=FP32)
    np.testing.assert_allclose(scored["bundle"], scored["file"], rtol=0, atol=FP32)
    records = [json.loads(line) for line in (parquet_job.run / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in records if "eval_samples" in r][-1]
    rows = pq.read_table(parquet_job.data)
    for t, (task, column) in enumerate(zip(TASKS, ("label", "label2"), strict=True)):
        labels = torch.from_numpy(rows.column(column).to_numpy().astype(np.float32))
        auc, logloss = auc_and_logloss(torch.logit(torch.from_numpy(reader[:, t]).double()), labels)
        assert auc == pytest.approx(final[f"eval_auc/{task}"], abs=2e-6)
        assert logloss == pytest.approx(final[f"eval_logloss/{task}"], rel=1e-4)


def test_the_spec_describes_the_columns_the_hash_and_the_versions(parquet_job: Job, criteo_job: Job):
    spec = json.loads((parquet_job.bundle / "spec.json").read_text())
    assert sorted(p.name for p in parquet_job.bundle.iterdir()) == ["model.pt2", "spec.json"]
    assert [e["column"] for e in spec["dense"]] == ["pos", "x"]
    assert [(e["feature"], e["kind"], e["weights"]) for e in spec["sparse"]] == [
        ("user", "id", None),
        ("items", "ids", "items_w"),
        ("city", "string", None),
    ]
    assert spec["sparse"][2]["id_map"] == {"kind": "hash_modulo", "modulus": 64}
    assert spec["tasks"] == [{"name": "click", "label": "label"}, {"name": "convert", "label": "label2"}]
    assert spec["program"]["output"]["shape"] == ["B", 2] and spec["model"]["weighted"]
    names = [i["name"] for i in spec["program"]["inputs"]]
    assert names[:4] == ["dense", "user.values", "user.lengths", "user.weights"] and len(names) == 1 + 3 * 3
    assert spec["versions"]["torch"] == torch.__version__ and spec["model"]["step"] == 20
    criteo = json.loads((criteo_job.bundle / "spec.json").read_text())
    assert criteo["dense"][0] == {"column": "I1", "null": 0.0, "transform": "log1p_max0"}
    assert criteo["sparse"][0]["kind"] == "hex" and criteo["sparse"][0]["id_map"]["modulus"] == 2000
    assert criteo["program"]["output"]["shape"] == ["B"]


def test_the_readers_hash_is_the_trainers(parquet_job: Job):
    """The reference reader's hash, written from the spec, reproduces the trainer's on strings of every
    length class (and the spec's test vectors, checked by the reader at start-up)."""
    from dlrm.data.parquet.hashing import hash_strings

    namespace: dict = {}
    exec(compile(READER.read_text(), str(READER), "exec"), namespace)  # the example is not a package module
    constants = json.loads((parquet_job.bundle / "spec.json").read_text())["hashing"]["constants"]
    rng = np.random.default_rng(0)
    strings = ["".join(chr(c) for c in rng.integers(32, 0x3000, n)) for n in range(0, 40)]
    want = hash_strings(pa.array(strings, pa.string()))
    assert [namespace["string_hash"](s, constants) for s in strings] == want.tolist()
    assert all(0 <= h < 2**63 for h in want.tolist()) and not math.isnan(float(want[0]))


def test_predict_refuses_quantize_for_a_bundle(parquet_job: Job, capsys):
    rc, _, err = predict(capsys, parquet_job.bundle, "--data", parquet_job.data, "--quantize", "int8")
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "--int8" in err
