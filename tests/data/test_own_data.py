"""A team's own columns: dense transforms (one definition, numpy and torch), inspect's decision per
column kind, convert's whole-or-nothing output and exact types, and each bad input as one line."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dlrm.config import ConfigError, DenseTransformConfig, ParquetConfig, SparseColumnConfig
from dlrm.config.choices import IdPolicy, NonFinitePolicy
from dlrm.data import convert, inspect
from dlrm.data.parquet.files import ParquetDataError, ParquetValueError
from dlrm.data.parquet.hashing import hash_strings
from dlrm.data.parquet.source import ParquetSource
from dlrm.data.parquet.transform_module import DenseTransformModule
from dlrm.data.parquet.transforms import DenseTransform
from tests.helpers.cli import assert_one_error

TRANSFORMS = {
    "count": DenseTransformConfig(log1p=True, mean=1.5, std=0.8, clip=[0.0, 1000.0], missing_flag=True),
    "price": DenseTransformConfig(mean=1e6, std=2e5),
}


def _raw(n: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = np.stack([rng.pareto(1.5, n) * 10, rng.normal(1e6, 2e5, n), rng.normal(size=n)], 1).astype(np.float32)
    raw[::7, 0] = np.nan  # missing counts
    raw[3, 0] = 1e9  # beyond the clip
    return raw


def test_dense_transform_numpy_and_torch_agree():
    t = DenseTransform(["count", "price", "x"], TRANSFORMS)
    raw = _raw()
    out = t.apply(raw.copy())
    assert out.shape == (64, 4) and out.dtype == np.float32 and np.isfinite(out).all()
    expected_count = (np.log1p(np.clip(np.nan_to_num(raw[:, 0]), 0, 1000)) - 1.5) / 0.8
    missing = np.isnan(raw[:, 0])
    np.testing.assert_allclose(out[~missing, 0], expected_count[~missing], rtol=1e-5)
    assert (out[missing, 0] == 0).all() and (out[:, 3] == missing).all()  # missing: 0 and its flag
    np.testing.assert_allclose(out[:, 1], (raw[:, 1] - 1e6) / 2e5, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out[:, 2], raw[:, 2])  # no entry: as it is
    module = DenseTransformModule(t)
    torch.testing.assert_close(module(torch.from_numpy(raw)), torch.from_numpy(out), rtol=1e-5, atol=1e-6)


def test_dense_transform_config_is_checked():
    cfg = ParquetConfig(path="x", dense=["a"], sparse=[SparseColumnConfig(name="u")], labels=["y"])
    for bad, key in [
        ({"b": DenseTransformConfig()}, "dense_transforms.b"),
        ({"a": DenseTransformConfig(std=0.0)}, "dense_transforms.a.std"),
        ({"a": DenseTransformConfig(clip=[2.0, 1.0])}, "dense_transforms.a.clip"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            dataclasses.replace(cfg, dense_transforms=bad).check("data.parquet")
    assert dataclasses.replace(cfg, dense_transforms={"a": DenseTransformConfig(missing_flag=True)}).dense_width() == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"labels": ["y", "y"]}, ["labels[1]", "once"]),
        ({"labels": ["a"]}, ["labels[0]", "also an input", "data.parquet.dense"]),
        ({"labels": ["u"]}, ["labels[0]", "data.parquet.sparse[0]"]),
    ],
)
def test_label_leaks_are_refused(change, words):
    cfg = ParquetConfig(path="x", dense=["a"], sparse=[SparseColumnConfig(name="u")], labels=["y"])
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(cfg, **change).check("data.parquet")
    for w in words:
        assert w in str(e.value), e.value


def _dataset(tmp_path: Path, dense: dict, n: int = 64) -> Path:
    rng = np.random.default_rng(0)
    t = pa.table({**dense, "u": rng.integers(0, 10, n), "y": rng.integers(0, 2, n)})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=16)
    return tmp_path


def _source(path: Path, **kw) -> ParquetSource:
    cfg = ParquetConfig(
        path=str(path), dense=["count", "price", "x"], sparse=[SparseColumnConfig(name="u")], labels=["y"], **kw
    )
    return ParquetSource(cfg, ["u"], [10], 16, 0)


def test_batches_carry_the_transform_training_and_predict_alike(tmp_path):
    """Training's batches (`batches`) and the scorer's (`rows_in_order`) hold the transformed values."""
    raw = _raw()
    columns = {"count": pa.array(raw[:, 0], from_pandas=True), "price": raw[:, 1], "x": raw[:, 2]}
    src = _source(_dataset(tmp_path, columns), dense_transforms=TRANSFORMS, shuffle=False)
    expected = DenseTransform(["count", "price", "x"], TRANSFORMS).apply(raw.copy())
    batches = src.batches("train", 0, 1)
    first = next(batches)
    batches.close()
    torch.testing.assert_close(first.dense_features, torch.from_numpy(expected[:16]))
    scored = torch.cat([b.dense_features for b in src.rows_in_order(10)])
    torch.testing.assert_close(scored, torch.from_numpy(expected))


def test_nonfinite_dense_values_are_named_or_replaced_and_counted(tmp_path):
    raw = _raw()
    raw[:, 0] = np.nan_to_num(raw[:, 0])
    raw[20, 2] = np.inf
    columns = {"count": raw[:, 0], "price": raw[:, 1], "x": raw[:, 2]}
    path = _dataset(tmp_path, columns)
    with pytest.raises(
        ParquetValueError, match=r"dense column 'x' holds inf at .*a\.parquet, row 20.*nonfinite=replace"
    ):
        list(_source(path).rows_in_order(64))
    src = _source(path, nonfinite=NonFinitePolicy.replace)
    (batch,) = list(src.rows_in_order(64))
    assert batch.dense_features[20, 2] == 0 and src.data_counts() == {"folded_ids": 0, "nonfinite_values": 1}


def test_a_dense_input_of_absurd_magnitude_is_named_once(tmp_path, caplog):
    raw = _raw()
    columns = {"count": np.minimum(np.nan_to_num(raw[:, 0]), 100), "price": raw[:, 1], "x": raw[:, 2]}
    src = _source(_dataset(tmp_path, columns))
    with caplog.at_level("WARNING"):
        list(src.rows_in_order(16))
    lines = [r.getMessage() for r in caplog.records if "dense column" in r.getMessage()]
    assert len(lines) == 1 and "'price'" in lines[0] and "dense_transforms.price" in lines[0]


def test_uint64_ids_stay_exact_and_are_printed_right(tmp_path):
    big = np.array([2**64 - 1, 2**63 + 5, 3, 2**63 + 5] * 4, np.uint64)
    pq.write_table(pa.table({"u": big, "y": np.zeros(16, np.int64)}), tmp_path / "a.parquet")
    cfg = ParquetConfig(path=str(tmp_path), sparse=[SparseColumnConfig(name="u")], labels=["y"])
    with pytest.raises(ParquetValueError, match=f"holds id {2**64 - 1} at"):
        list(ParquetSource(cfg, ["u"], [1000], 16, 0).rows_in_order(16))
    src = ParquetSource(dataclasses.replace(cfg, id_policy=IdPolicy.modulo), ["u"], [1000], 16, 0)
    (batch,) = list(src.rows_in_order(16))
    assert batch.sparse_features.values()[:4].tolist() == [
        (2**64 - 1) % 1000,
        (2**63 + 5) % 1000,
        3,
        (2**63 + 5) % 1000,
    ]
    assert src.data_counts()["folded_ids"] == 12


def test_a_megabyte_string_hashes_fast_and_short_ones_as_before():
    short = hash_strings(pa.array(["abc", "x" * 1000]))
    t0 = time.perf_counter()
    hashes = hash_strings(pa.array(["x" * 1_000_000, "abc", "x" * 1000, "y" * 1_000_000]))
    assert time.perf_counter() - t0 < 2.0  # one pass per byte position took seconds
    assert hashes[1:3].tolist() == short.tolist() and len(set(hashes.tolist())) == 4


# -- convert -------------------------------------------------------------------------------------------


def _convert(tmp_path, capsys, text: bytes | str, *args: str) -> tuple[int, str]:
    path = tmp_path / "in.csv"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    code = convert.main([str(path), "--out", str(tmp_path / "out"), *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "args", "words"),
    [
        ("a,b,a\n1,2,3\n", [], ["line 1", "['a']", "repeated"]),
        ("0\t5\t\t1382\tab12\n1\t2\t3\t4\tcd\n", ["--delimiter", "tab"], ["line 1 holds values", "headerless"]),
        (b"a,caf\xe9\n1,2\n", [], ["line 1", "not UTF-8", "iconv"]),
        (b"a,b\n1,caf\xe9\n", [], ["column 'b'", "not UTF-8", "iconv"]),
        ("a\tb\tc\n1\t2\t3\n", [], ["TSV", "--delimiter tab"]),
    ],
)
def test_convert_refuses_bad_headers_and_cells_in_one_line(tmp_path, capsys, text, args, words):
    code, err = _convert(tmp_path, capsys, text, *args)
    assert_one_error(code, "", err, *words)
    assert not (tmp_path / "out").exists()


def test_a_failed_convert_leaves_nothing_that_looks_complete(tmp_path, capsys):
    """A string after many integer rows: one line naming the line and column, no --out at all."""
    text = "a,b\n" + "".join(f"{i},{i}\n" for i in range(30_000)) + "1,oops\n"
    code, err = _convert(tmp_path, capsys, text, "--rows-per-file", "1000", "--block-mb", "0.05")
    assert_one_error(code, "", err, "line 30002", "column 'b'", "'oops'")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_full_disk_is_one_line_with_the_space_needed(tmp_path, capsys, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    code, err = _convert(tmp_path, capsys, "a,b\n1,2\n")
    assert_one_error(code, "", err, "no space left", "MB may be needed")
    assert not (tmp_path / "out").exists()


def test_twenty_digit_ids_stay_exact_and_files_take_the_umask(tmp_path, capsys):
    ids = [18446744073709551615, 10000000000000000001, 10000000000000000002]
    text = "id,neg,y\n" + "".join(f"{v},-{v},{k % 2}\n" for k, v in enumerate(ids))
    old = os.umask(0o022)
    try:
        code, err = _convert(tmp_path, capsys, text)
    finally:
        os.umask(old)
    assert code == 0, err
    (part,) = (tmp_path / "out").glob("*.parquet")
    t = pq.read_table(part)
    assert t.schema.field("id").type == pa.uint64() and t["id"].to_pylist() == ids
    assert t["neg"].to_pylist() == [f"-{v}" for v in ids]  # beyond every integer type: kept as text, hashed
    assert stat.S_IMODE(part.stat().st_mode) == 0o644 and stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


# -- inspect -------------------------------------------------------------------------------------------


def _team(n: int = 1400, files: int = 7) -> list[pa.Table]:
    """Days of a small team log: one file per day."""
    rng = np.random.default_rng(0)
    users = rng.integers(2**40, 2**63 + 2**62, 500, dtype=np.uint64)
    out = []
    for d in range(files):
        out.append(
            pa.table(
                {
                    "row_id": np.arange(d * n, (d + 1) * n),
                    "day": np.full(n, d, np.int64),
                    "site": np.full(n, 3, np.int64),
                    "user": pa.array(users[rng.integers(0, 500, n)]),
                    "n_views": rng.pareto(1.2, n).astype(np.int64) * 3,
                    "price": rng.normal(1e6, 1e5, n),
                    "hour": 14102100 + rng.integers(0, 4, n),
                    "genres": pa.array(["Comedy|Drama" if k % 2 else "Action" for k in range(n)]),
                    "item": pa.array([f"{k:08x}" for k in rng.integers(0, 300, n)]),
                    "click": rng.integers(0, 2, n),
                }
            )
        )
    return out


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("team")
    for d, t in enumerate(_team()):
        pq.write_table(t, path / f"day-{d}.parquet", row_group_size=200)
    return path


def test_inspect_decides_each_column_kind(team, tmp_path, capsys):
    assert inspect.main([str(team), "--out", str(tmp_path / "conf"), "--label", "click", "--sample-rows", "2000"]) == 0
    out = capsys.readouterr().out
    table, total, groups = inspect.sample(str(team), 2000)
    assert table.num_rows <= 2400 and set(table["day"].to_pylist()) == set(range(7))  # spread over every file
    cols = {c.name: c for c in inspect.describe(table, total, ["click"])}
    assert cols["row_id"].role == "ignore" and "row id" in cols["row_id"].reason
    assert cols["day"].role == "ignore" and "--keep day" in cols["day"].reason
    assert cols["site"].role == "ignore" and "constant" in cols["site"].reason
    assert cols["user"].role == "id" and cols["user"].collisions > 0  # beyond int64: an id, folded
    assert cols["n_views"].role == "dense" and cols["n_views"].transform["log1p"]
    price = cols["price"].transform
    assert cols["price"].role == "dense" and not price["log1p"] and abs(price["mean"] - 1e6) < 2e4
    assert cols["hour"].role == "ignore" and "YYMMDDHH" in cols["hour"].reason and "--keep hour" in cols["hour"].reason
    assert cols["item"].role == "string" and 600 <= cols["item"].rows <= 3000  # from the distinct count
    assert "--multi genres:string" in out and "left out 'row_id'" in out and "left out 'day'" in out
    data = (tmp_path / "conf" / "data" / "mydata.yaml").read_text()
    assert "# n_views: non-negative, heavy-tailed" in data and "id_policy: modulo" in data


def test_inspect_configs_train_and_transform(team, tmp_path, capsys):
    assert inspect.main([str(team), "--out", str(tmp_path / "conf"), "--label", "click", "--batch-size", "256"]) == 0
    from dlrm.config import to_config, validate
    from dlrm.config.compose import compose_job, hydra_session
    from dlrm.data.source import make_source
    from dlrm.models.dlrm import build_model, initialize

    with hydra_session():
        cfg = to_config(
            compose_job(["model=mydata", "data=mydata"], with_hydra=False, config_dir=str(tmp_path / "conf"))
        )
    validate(cfg)
    assert set(cfg.data.parquet.dense_transforms) == {"n_views", "price"}
    src = make_source(cfg)
    assert src.num_batches("eval") >= 1 and cfg.data.eval_batches >= 1  # an eval split of at least one batch
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, seed=0)
    batches = src.batches("train", 0, 1)
    batch = next(batches)
    batches.close()
    assert batch.dense_features.abs().max() < 10  # transformed: standardised
    loss, _ = model(batch)
    assert 0.5 < float(loss.detach()) < 0.9  # near log 2: a sane first loss


def test_inspect_vocabulary_manages_strings_and_sparse_ids_and_trains(team, tmp_path, capsys):
    """--vocabulary lfu: the 63-bit user ids and the item strings get managed vocabularies sized from
    their distinct counts (not folded); the config trains."""
    out = tmp_path / "conf"
    args = [str(team), "--out", str(out), "--label", "click", "--batch-size", "256", "--vocabulary", "lfu"]
    assert inspect.main(args) == 0
    assert "a managed vocabulary of" in capsys.readouterr().out
    from dlrm.config import to_config, validate
    from dlrm.config.compose import compose_job, hydra_session
    from dlrm.data.source import make_source
    from dlrm.models.dlrm import build_model, initialize
    from dlrm.models.vocabulary import vocabulary_metrics

    with hydra_session():
        cfg = to_config(compose_job(["model=mydata", "data=mydata"], with_hydra=False, config_dir=str(out)))
    validate(cfg)
    tables = {t.features[0]: t for t in cfg.model.tables}
    assert str(tables["user"].vocabulary.policy) == "lfu" and str(tables["item"].vocabulary.policy) == "lfu"
    assert tables["item"].rows < 3000 and "hour" not in tables  # YYMMDDHH: left out
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, seed=0)
    batches = make_source(cfg).batches("train", 0, 1)
    loss, _ = model(next(batches))
    batches.close()
    assert 0.5 < float(loss.detach()) < 0.9
    assert vocabulary_metrics(model)["vocab_t_user_new_ids"] > 0  # raw 63-bit ids admitted, not folded


def test_inspect_refuses_to_overwrite_edits_unless_forced(team, tmp_path, capsys):
    args = [str(team), "--out", str(tmp_path / "conf"), "--label", "click"]
    assert inspect.main(args) == 0
    data = tmp_path / "conf" / "data" / "mydata.yaml"
    data.write_text(data.read_text() + "# my edit\n")
    assert inspect.main(args) == 2
    assert_one_error(2, "", capsys.readouterr().err, "mydata.yaml exists", "--force")
    assert inspect.main([*args, "--force"]) == 0
    assert "# my edit" in (tmp_path / "conf" / "data" / "mydata.yaml.bak").read_text()
    assert "# my edit" not in data.read_text()


@pytest.mark.parametrize(
    ("table", "args", "words"),
    [
        (pa.table({"a\tb\tc": ["1\t2\t3"] * 4}), ["--label", "a\tb\tc"], ["one column", "--delimiter tab"]),
        (pa.table({"y": [0, 1, 7, 3], "u": [1, 2, 3, 4]}), ["--label", "y"], ["--label y", "looks like a feature"]),
        (
            pa.table({"y": [0, 1, 1, 0], "u": pa.array(["a", "b", "a", "b"]).dictionary_encode()}),
            ["--label", "y"],
            ["'u'", "dictionary", "astype(str)"],
        ),
        (
            pa.table({"y": [0, 1, 1, 0], "u": [1, 2, 3, 4]}),
            ["--label", "y", "--dense", "y"],
            ["label", "never an input"],
        ),
    ],
)
def test_inspect_refusals_are_one_line(tmp_path, capsys, table, args, words):
    pq.write_table(table, tmp_path / "a.parquet")
    code = inspect.main([str(tmp_path / "a.parquet"), "--out", str(tmp_path / "conf"), *args])
    assert_one_error(code, "", capsys.readouterr().err, *words)


def test_inspect_makes_column_names_safe(tmp_path, capsys):
    rng = np.random.default_rng(0)
    t = pa.table(
        {"user.id": rng.integers(0, 50, 400), "2nd col": rng.integers(0, 9, 400), "y": rng.integers(0, 2, 400)}
    )
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=50)
    assert inspect.main([str(tmp_path / "a.parquet"), "--out", str(tmp_path / "conf"), "--label", "y"]) == 0
    from dlrm.config import to_config, validate
    from dlrm.config.compose import compose_job, hydra_session
    from dlrm.data.source import make_source

    with hydra_session():
        cfg = to_config(
            compose_job(["model=mydata", "data=mydata"], with_hydra=False, config_dir=str(tmp_path / "conf"))
        )
    validate(cfg)
    assert [(s.name, s.column) for s in cfg.data.parquet.sparse] == [("user_id", "user.id"), ("c_2nd_col", "2nd col")]
    batches = make_source(cfg).batches("train", 0, 1)
    assert next(batches).sparse_features.keys() == ["user_id", "c_2nd_col"]
    batches.close()


def test_an_eval_split_that_would_never_be_read_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"u": rng.integers(0, 10, 100), "y": rng.integers(0, 2, 100)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"u": rng.integers(0, 10, 8), "y": rng.integers(0, 2, 8)}), tmp_path / "e.parquet")
    cfg = ParquetConfig(
        path=str(tmp_path / "a.parquet"), eval_path=str(tmp_path / "e.parquet"), sparse=[SparseColumnConfig(name="u")]
    )
    cfg = dataclasses.replace(cfg, labels=["y"])
    with pytest.raises(ParquetDataError, match="eval split has 8 rows, less than one global batch of 16"):
        ParquetSource(cfg, ["u"], [10], 16, 0)
    from dlrm.config import DataConfig
    from dlrm.config.choices import DataSource

    with pytest.raises(ConfigError, match=r"data\.eval_batches.*never read"):
        DataConfig(source=DataSource.parquet, eval_batches=0, parquet=cfg).check()


def test_predict_words_the_readers_fixes_for_the_scorer():
    from dlrm.common.errors import UserError
    from dlrm.predict.parquet import _for_scoring

    e = UserError(
        "column 'u' holds id 12 at f, row 3, outside [0, 10); enlarge the table, or set data.parquet.id_policy=modulo"
    )
    assert "set data.parquet" not in _for_scoring(e) and "exported with data.parquet.id_policy" in _for_scoring(e)
    e = UserError(
        "dense column 'x' holds inf at f, row 2: not a finite float32; fix the value, or set "
        "data.parquet.nonfinite=replace to read it as missing (counted)"
    )
    assert "set data.parquet" not in _for_scoring(e) and "fix the rows" in _for_scoring(e)


TRAIN = ["trainer.max_steps=12", "trainer.progress=none", "trainer.tensorboard=false", "run.name=r"]


@pytest.mark.parametrize("name", ["avazu", "movielens", "census"])
def test_public_shaped_samples_train_and_score_with_defaults(tmp_path, capsys, monkeypatch, name):
    """convert -> inspect -> train -> export -> predict with the documented defaults: a sane loss."""
    import json

    from dlrm import export, train
    from tests.helpers.cli import predict_in_process
    from tests.helpers.public_samples import SAMPLES

    convert_flags, inspect_flags = SAMPLES[name](tmp_path / "in.csv")
    assert (
        convert.main(
            [str(tmp_path / "in.csv"), "--out", str(tmp_path / "pq"), "--row-group-size", "64", *convert_flags]
        )
        == 0
    )
    conf = tmp_path / "conf"
    assert inspect.main([str(tmp_path / "pq"), "--out", str(conf), "--name", name, *inspect_flags]) == 0
    printed = capsys.readouterr().out
    if name == "avazu":
        assert "left out 'id'" in printed and "YYMMDDHH" in printed
    if name == "census":
        assert "'instance_weight' is a sample weight" in printed
        assert "capital_gains" in (conf / "data" / "census.yaml").read_text().split("dense_transforms")[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["dlrm.train", "-cd", str(conf), f"model={name}", f"data={name}", *TRAIN])
    try:
        train.main()
    except SystemExit as e:
        assert not e.code, capsys.readouterr()
    summary = json.loads((tmp_path / "outputs" / "r" / "summary.json").read_text())
    assert 0.2 < summary["final_loss"] < 1.5 * len(inspect_flags[1::2]), summary  # near log 2 per task
    assert export.main([str(tmp_path / "outputs" / "r" / "checkpoints" / "step_00000012"), str(tmp_path / "m.pt")]) == 0
    rc, out, err = predict_in_process(capsys, tmp_path / "m.pt", "--data", tmp_path / "pq", "--out", tmp_path / "s.npy")
    assert rc == 0, out + err
    assert out.count("weighted auc") == (2 if name == "census" else 0), out  # census: data.parquet.weight
    scores = np.load(tmp_path / "s.npy")
    assert len(scores) == 600 and np.isfinite(scores).all() and ((scores > 0) & (scores < 1)).all()


def test_a_nonfinite_id_weight_is_named(tmp_path):
    w = np.ones(16, np.float32)
    w[5] = np.nan
    pq.write_table(pa.table({"u": np.arange(16) % 4, "w": w, "y": np.zeros(16, np.int64)}), tmp_path / "a.parquet")
    cfg = ParquetConfig(path=str(tmp_path), sparse=[SparseColumnConfig(name="u", weights="w")], labels=["y"])
    with pytest.raises(ParquetValueError, match=r"weights column 'w'.*holds nan at .*a\.parquet, row 5"):
        list(ParquetSource(cfg, ["u"], [4], 16, 0).rows_in_order(16))


def test_long_data_work_prints_progress_with_rate_and_eta(capsys):
    from dlrm.data.progress import Progress

    p = Progress("convert", total=100, every=0.0)
    time.sleep(0.01)
    p.update(25, 1000)
    line = capsys.readouterr().err.strip()
    assert line.startswith("convert: 25% (1,000 rows, ") and "rows/s, ETA " in line
