"""Several labels as several tasks (model.tasks), the per-task metrics, per-table pooling types and
DCN over tables of different dims: each against its definition, and one task as before."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRMTrain

from dlrm.config.compose import compose
from dlrm.data.source import make_source
from dlrm.models.dlrm import build_model, initialize
from dlrm.predict.score import score
from dlrm.trainer import console
from dlrm.trainer.metrics import auc_and_logloss, evaluation_record, exact_auc, score_on_rank0, task_metrics
from tests.helpers.reference import train_unsharded
from tests.helpers.scoring import torchrec_ne_and_calibration

TWO_TASKS = ("model.tasks=[{name:click,weight:1.0},{name:like,weight:0.25}]", "model.top_mlp=[16,2]")
DCN_DIMS = ("model.interaction=dcn", "model.dcn_num_layers=2", "model.dcn_low_rank_dim=4", "model.tables.1.dim=4")


def _config(*overrides: str, batch: int = 64):
    cfg = compose(["model=tiny", "optim=sgd", f"data.global_batch_size={batch}", *overrides])
    cfg.check()
    return cfg


def _model_and_batch(cfg):
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, cfg.seed)
    return model, next(make_source(cfg).batches("train", rank=0, world_size=1))


def _bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy from its definition, in float64: -mean(y log s(x) + (1 - y) log(1 - s(x)))."""
    x, y = logits.double(), labels.double()
    return -(y * torch.nn.functional.logsigmoid(x) + (1 - y) * torch.nn.functional.logsigmoid(-x)).mean()


def test_multitask_loss_is_the_weighted_sum_of_the_tasks_bce():
    cfg = _config(*TWO_TASKS)
    model, batch = _model_and_batch(cfg)
    assert batch.labels.shape == (64, 2) and batch.labels.dtype == torch.float32
    loss, (detached, logits, labels) = model(batch)
    assert logits.shape == (64, 2) and torch.equal(labels, batch.labels)
    direct = 1.0 * _bce(logits[:, 0], labels[:, 0]) + 0.25 * _bce(logits[:, 1], labels[:, 1])
    assert loss.item() == pytest.approx(direct.item(), rel=1e-6)  # fp32 sums of 64 terms vs fp64
    assert detached.item() == loss.item()
    loss.backward()  # one backward through the shared top MLP's two logits
    last = model.model.over_arch.model[-1]
    assert last.weight.grad is not None and last.weight.grad.shape[0] == 2


def test_one_task_is_torchrec_dlrmtrain_exactly():
    """The default (one task 'label', weight 1): TorchRec's DLRMTrain's loss, logits [B] and labels [B], bit for bit."""
    cfg = _config()
    assert [(t.name, t.weight) for t in cfg.model.tasks] == [("label", 1.0)]
    model, batch = _model_and_batch(cfg)
    assert batch.labels.shape == (64,)
    loss, (_, logits, labels) = model(batch)
    plain_loss, (_, plain_logits, plain_labels) = DLRMTrain(model.model)(batch)
    assert logits.shape == labels.shape == (64,)
    assert torch.equal(loss, plain_loss) and torch.equal(logits, plain_logits) and torch.equal(labels, plain_labels)


def test_synthetic_tasks_have_their_own_labels_and_keep_the_first():
    one = make_source(_config(batch=96))
    two = make_source(_config(*TWO_TASKS, batch=96))
    whole = next(two.batches("train", rank=0, world_size=1))
    assert whole.labels.shape == (96, 2)
    assert torch.equal(whole.labels[:, 0], next(one.batches("train", rank=0, world_size=1)).labels)
    assert not torch.equal(whole.labels[:, 0], whole.labels[:, 1])  # another hidden model
    assert 0 < whole.labels[:, 1].mean() < 1
    halves = [next(two.batches("train", rank=r, world_size=2)).labels for r in range(2)]
    assert torch.equal(torch.cat(halves), whole.labels)  # the same global batch at any world size


def _small_example():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.5, 0.0, -0.5, 3.0, -2.0, 0.25])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    return logits, labels


def test_metrics_equal_their_definitions_by_hand():
    logits, labels = _small_example()
    figures = task_metrics(logits, labels)
    x, y = logits.numpy().astype(np.float64), labels.numpy().astype(np.float64)
    p = 1 / (1 + np.exp(-x))
    logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    base = y.mean()
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    assert figures["logloss"] == pytest.approx(logloss, rel=1e-6)  # fp32 BCE
    assert figures["ne"] == pytest.approx(logloss / entropy, rel=1e-12)
    assert figures["calibration"] == pytest.approx(p.mean() / base, rel=1e-12)
    assert figures["auc"] == exact_auc(logits, labels).item()
    # the AUC by its definition: P(score of a positive > score of a negative), ties half
    pos, neg = x[y == 1], x[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert figures["auc"] == pair_auc(pairs, len(pos), len(neg))


def pair_auc(pairs: float, positives: int, negatives: int) -> float:
    return float(pairs) / (positives * negatives)


def test_metrics_equal_torchrec_and_torchmetrics():
    """NE and calibration as TorchRec's NEMetric and CalibrationMetric compute them; AUC as torchmetrics'."""
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(5000, generator=gen) < 0.2).float()
    logits = torch.randn(5000, generator=gen) + 1.5 * labels - 1.0
    figures = task_metrics(logits, labels)
    ne, calibration = torchrec_ne_and_calibration(logits, labels, torch.ones(5000))
    assert figures["ne"] == pytest.approx(ne, rel=1e-10)
    assert figures["calibration"] == pytest.approx(calibration, rel=1e-12)
    assert figures["auc"] == pytest.approx(binary_auroc(logits, labels.long()).item(), abs=1e-6)


def test_undefined_metrics_are_none():
    no_positive = task_metrics(torch.tensor([0.5, -1.0]), torch.zeros(2))
    assert no_positive["auc"] is None and no_positive["ne"] is None and no_positive["calibration"] is None
    all_positive = task_metrics(torch.tensor([0.5, -1.0]), torch.ones(2))
    assert all_positive["ne"] is None and all_positive["calibration"] == pytest.approx(
        (1 / (1 + math.exp(-0.5)) + 1 / (1 + math.exp(1.0))) / 2
    )


def test_evaluation_keys():
    logits, labels = _small_example()
    figures = task_metrics(logits, labels)
    one = evaluation_record({"label": figures})
    assert set(one) == {"auc", "logloss", "ne", "calibration"}  # today's auc and logloss, then ne, calibration
    other = task_metrics(-logits, labels)
    two = evaluation_record({"click": figures, "like": other})
    assert {k: two[k] for k in ("auc", "logloss", "ne", "calibration")} == figures  # the first task's
    assert two["auc/click"] == figures["auc"] and two["ne/like"] == other["ne"]
    assert set(two) == set(one) | {f"{k}/{t}" for k in one for t in ("click", "like")}
    text = console.eval_text(two)
    assert text.startswith("click: auc ") and "; like: auc " in text and "calibration" in text
    assert console.eval_text(one).startswith("auc ") and " ne " in console.eval_text(one)


def test_one_task_evaluation_keeps_its_figures_exactly(group):
    """One task: the evaluation's auc and logloss are `auc_and_logloss`'s, to the bit (float64 all the way)."""
    gen = torch.Generator().manual_seed(1)
    labels = (torch.rand(300, generator=gen) < 0.3).float()
    logits = torch.randn(300, generator=gen) + labels
    evaluation = score_on_rank0(torch.stack((logits, labels)), group)
    assert set(evaluation) == {"auc", "logloss", "ne", "calibration", "samples"}
    assert (evaluation["auc"], evaluation["logloss"]) == auc_and_logloss(logits, labels)
    assert evaluation["samples"] == 300
    local = torch.stack((torch.stack((logits, -logits)), torch.stack((labels, labels))))  # [2, T, N]
    two = score_on_rank0(local, group, ["a", "b"])
    assert two["auc/a"] == evaluation["auc"] and two["auc/b"] == pytest.approx(1 - evaluation["auc"])
    assert two["ne/b"] == task_metrics(-logits, labels)["ne"]


def test_predict_scores_one_column_per_task():
    cfg = _config(*TWO_TASKS, batch=16)
    model, batch = _model_and_batch(cfg)
    with torch.no_grad():
        expected = model.eval()(batch)[1][1]
    one_label = Batch(batch.dense_features, batch.sparse_features, batch.labels[:, 0])  # a Criteo row's label
    logits, labels = score(model, iter([one_label, one_label]), tasks=2)
    assert logits.shape == (32, 2) and labels.shape == (32,)
    torch.testing.assert_close(logits[16:], expected)


def test_mean_pooling_divides_by_the_bag_size():
    """model.tables[*].pooling_type=mean: a multi-hot feature's vector is the mean of its rows (t_C4: 3 ids)."""
    cfg = _config("model.tables.3.pooling_type=mean", batch=4)
    model, batch = _model_and_batch(cfg)
    ebc = model.model.sparse_arch.embedding_bag_collection
    pooled = ebc(batch.sparse_features).to_dict()["C4"]
    ids = batch.sparse_features["C4"]
    weight = ebc.embedding_bags["t_C4"].weight
    rows = weight[ids.values().long()].view(4, 3, -1)
    torch.testing.assert_close(pooled, rows.mean(1))
    summed = build_model(_config(batch=4).model, torch.device("cpu"))
    initialize(summed, cfg.model, cfg.seed)
    summed_pooled = summed.model.sparse_arch.embedding_bag_collection(batch.sparse_features).to_dict()["C4"]
    torch.testing.assert_close(summed_pooled, rows.sum(1))


def test_dcn_over_tables_of_different_dims_trains():
    """DCN's cross net takes the concatenation [bottom MLP 8, C1 8, C2 4, C3 8, C5 8, C4 8]: the reference learns."""
    cfg = _config(*DCN_DIMS, "trainer.max_steps=12", batch=96)
    model, batch = _model_and_batch(cfg)
    assert model.model.inter_arch.crossnet.W_kernels[0].shape[0] == 8 + 8 + 4 + 8 + 8 + 8
    losses, _ = train_unsharded(cfg)
    assert all(math.isfinite(v) for v in losses) and np.mean(losses[-4:]) < np.mean(losses[:4])


def test_the_planner_never_splits_a_mean_pooled_table_by_rows():
    """TorchRec's row-split mean divides the other tables' features too: the planner is kept off those types."""
    from dlrm.distributed.sharding import constraints

    for topology in ("cpu", "dgx_h100"):
        c = constraints(_config("model.tables.3.pooling_type=mean", "sharding=auto", f"topology={topology}"), 2)
        allowed = c["t_C4"].sharding_types
        assert allowed is not None and "table_wise" in allowed and "column_wise" in allowed
        assert not {"row_wise", "table_row_wise", "grid_shard"} & set(allowed)
    assert c["t_C1"].sharding_types is None  # sum-pooled, on GPUs: the planner chooses freely
