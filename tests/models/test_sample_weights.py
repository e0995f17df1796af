"""Sample weights (data.parquet.weight): the loss is sum_b w_b BCE_b / sum_b w_b, the metrics count each
row w times (integer weights equal the rows repeated), a batch without weights takes the old path
unchanged; the weight column is read with the rows, checked (one line naming file, column and row),
and written by inspect --weight. Sharded equals one process: tests/data/test_parquet_training.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dlrm.config import ConfigError, ParquetConfig, SparseColumnConfig
from dlrm.config.compose import compose
from dlrm.data import inspect
from dlrm.data.parquet.files import ParquetDataError, ParquetValueError
from dlrm.data.parquet.source import ParquetSource
from dlrm.data.source import make_source
from dlrm.data.weighted_batch import WeightedBatch, with_weights
from dlrm.models.dlrm import build_model, initialize
from dlrm.trainer.metrics import exact_auc, task_metrics, weighted_auc
from tests.helpers.scoring import torchrec_ne_and_calibration

TWO_TASKS = ("model.tasks=[{name:click,weight:1.0},{name:like,weight:0.25}]", "model.top_mlp=[16,2]")


def _model_and_batch(*overrides: str):
    cfg = compose(["model=tiny", "optim=sgd", "data.global_batch_size=64", *overrides])
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, cfg.seed)
    return model, next(make_source(cfg).batches("train", rank=0, world_size=1))


@pytest.mark.parametrize("overrides", [(), TWO_TASKS])
def test_the_weighted_loss_is_the_weighted_mean_of_the_rows_losses(overrides):
    model, batch = _model_and_batch(*overrides)
    w = (torch.arange(64) % 4).float()  # 0 to 3: some rows count 0 times
    loss, (_, logits, labels) = model(with_weights(batch, w))
    per_row = F.binary_cross_entropy_with_logits(logits.double(), labels.double(), reduction="none").reshape(64, -1)
    task_weights = torch.tensor([1.0, 0.25] if overrides else [1.0], dtype=torch.float64)
    by_hand = ((per_row * w.double()[:, None]).sum(0) / w.sum() * task_weights).sum()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)  # fp32 sums of 64 terms
    unweighted, _ = model(batch)
    ones, _ = model(with_weights(batch, torch.ones(64)))
    assert ones.item() == pytest.approx(unweighted.item(), rel=1e-6)
    assert abs(loss.item() - unweighted.item()) > 1e-4, "the weights must change the loss"
    zero, _ = model(with_weights(batch, torch.zeros(64)))
    assert zero.item() == 0.0  # an all-zero batch: no loss, not 0/0


def test_a_batch_without_weights_takes_the_unweighted_path_exactly():
    model, batch = _model_and_batch()
    loss, (_, logits, labels) = model(batch)
    assert torch.equal(loss, F.binary_cross_entropy_with_logits(logits, labels.float()))  # TorchRec's DLRMTrain's


def _tied_example(n: int = 400):
    gen = torch.Generator().manual_seed(1)
    labels = (torch.rand(n, generator=gen) < 0.3).float()
    logits = torch.round((torch.randn(n, generator=gen) + labels) * 4) / 4  # few levels: many ties
    counts = torch.randint(0, 5, (n,), generator=gen)  # 0 to 4 copies of each row
    return logits, labels, counts


def test_weighted_auc_by_hand():
    # positives 0.35 (w 3), 0.8 (w 1); negatives 0.1 (w 1), 0.4 (w 2): pairs ordered right weigh
    # 3 * 1 (0.35 > 0.1) + 1 * 1 + 1 * 2 (0.8 > both) = 6 of (3 + 1) * (1 + 2) = 12
    scores, labels = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert weighted_auc(scores, labels, torch.tensor([1.0, 2.0, 3.0, 1.0])).item() == 0.5
    # a tie between a positive and a negative counts half: 0.4 (w 2, positive) ties 0.4 (w 1)
    tied = torch.tensor([0.4, 0.4, 0.1])
    assert weighted_auc(tied, torch.tensor([1.0, 0.0, 0.0]), torch.tensor([2.0, 1.0, 3.0])).item() == (
        2 * 3 + 0.5 * 2 * 1
    ) / (2 * 4)


def test_integer_weights_equal_the_rows_repeated():
    logits, labels, counts = _tied_example()
    repeated = [torch.repeat_interleave(x, counts) for x in (logits, labels)]
    assert weighted_auc(logits, labels, counts.float()).item() == exact_auc(*repeated).item()  # exact: float64 halves
    weighted, plain = task_metrics(logits, labels, counts.float()), task_metrics(*repeated)
    assert weighted["auc"] == plain["auc"]
    for key in ("logloss", "ne", "calibration"):
        assert weighted[key] == pytest.approx(plain[key], rel=1e-6), key  # the plain log loss is fp32 BCE
    # NE and calibration as TorchRec's weighted NEMetric and CalibrationMetric compute them
    ne, calibration = torchrec_ne_and_calibration(logits, labels, counts)
    assert weighted["ne"] == pytest.approx(ne, rel=1e-10)
    assert weighted["calibration"] == pytest.approx(calibration, rel=1e-12)


def test_weights_of_one_give_the_unweighted_figures():
    logits, labels, _ = _tied_example()
    ones, plain = task_metrics(logits, labels, torch.ones(len(labels))), task_metrics(logits, labels)
    assert ones["auc"] == plain["auc"] and ones["ne"] == pytest.approx(plain["ne"], rel=1e-12)
    assert ones["logloss"] == pytest.approx(plain["logloss"], rel=1e-6)


def test_a_weighted_batch_moves_and_pins_with_its_weights(monkeypatch):
    model, batch = _model_and_batch()
    weighted = with_weights(batch, torch.arange(64).float())
    moved = weighted.to(torch.device("cpu"))
    assert isinstance(moved, WeightedBatch) and torch.equal(moved.weights, weighted.weights)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **k: t.clone())  # no accelerator here
    pinned = weighted.pin_memory()
    assert isinstance(pinned, WeightedBatch) and torch.equal(pinned.weights, weighted.weights)
    assert torch.equal(pinned.labels, weighted.labels)


def _write(tmp_path, w) -> ParquetConfig:
    n = len(w)
    table = pa.table({"u": np.arange(n) % 4, "w": pa.array(w, pa.float64()), "y": np.arange(n) % 2})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=8)
    return ParquetConfig(path=str(tmp_path), sparse=[SparseColumnConfig(name="u")], labels=["y"], weight="w")


def test_the_weight_column_travels_with_its_rows(tmp_path):
    cfg = _write(tmp_path, [float(k % 3) for k in range(16)])
    (batch,) = list(ParquetSource(cfg, ["u"], [4], 16, 0).rows_in_order(16))
    assert isinstance(batch, WeightedBatch) and batch.weights.tolist() == [float(k % 3) for k in range(16)]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), None, float("inf")])
def test_a_bad_weight_is_named_with_its_file_column_and_row(tmp_path, bad):
    w = [1.0] * 16
    w[11] = bad
    cfg = _write(tmp_path, w)
    with pytest.raises(ParquetValueError) as e:  # negative and null: at start-up, from the statistics
        list(ParquetSource(cfg, ["u"], [4], 16, 0).rows_in_order(16))
    message = str(e.value)
    assert "'w' (data.parquet.weight)" in message and "a.parquet, row 11" in message and "\n" not in message
    assert "finite number >= 0" in message and "data.parquet.weight=null" in message


def test_a_missing_weight_column_and_a_weight_that_is_a_label_or_input_are_refused(tmp_path):
    cfg = _write(tmp_path, [1.0] * 16)
    cfg.weight = "weight"
    with pytest.raises(ParquetDataError, match=r"has no column 'weight' \(data.parquet.weight\).*fix data.parquet"):
        ParquetSource(cfg, ["u"], [4], 16, 0)
    for weight, where in (("y", "also a label"), ("u", "also an input")):
        cfg.weight = weight
        with pytest.raises(ConfigError, match=f"data.parquet.weight.*{where}"):
            cfg.check("data.parquet")


def test_inspect_weight_writes_the_key(tmp_path, capsys):
    n = 64
    table = {"u": np.arange(n) % 7, "instance_weight": np.linspace(100, 3000, n), "label": np.arange(n) % 2}
    pq.write_table(pa.table(table), tmp_path / "a.parquet", row_group_size=16)
    argv = [str(tmp_path / "a.parquet"), "--out", str(tmp_path / "conf"), "--weight", "instance_weight"]
    assert inspect.main(argv) == 0
    assert "weights the loss and the evaluation's metrics" in capsys.readouterr().out
    data = OmegaConf.load(tmp_path / "conf" / "data" / "mydata.yaml")
    assert data.parquet.weight == "instance_weight" and "instance_weight" not in data.parquet.dense
