"""Every model kind the trainer builds exports: the serving module over plain tensors equals the
trainer's network (its logits over a KeyedJaggedTensor) and `torch.export` captures it with a dynamic
batch (no AOTInductor compile here: tests/export/test_bundle.py compiles two). Row-wise int8 tables,
and the one-line refusals of `python -m dlrm.export --format bundle`."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import ModelConfig
from dlrm.export import bundle as bundle_module
from dlrm.export.bundle import export_program, probe_inputs, serving_model
from dlrm.export.cli import main as export_main
from dlrm.export.serving import INT8_LEVELS, Int8RowwiseBag, feature_names
from dlrm.models.dlrm import build_model, initialize
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.checkpoints import saved_checkpoints

__all__ = ["saved_checkpoints"]  # fixture

TINY = OmegaConf.load(REPO / "conf" / "model" / "tiny.yaml")
KINDS = {
    "dot": {},
    "dcn": {"interaction": "dcn"},
    "dcn_of_several_widths": {"interaction": "dcn", "tables": [*TINY.tables[:3], {**TINY.tables[3], "dim": 4}]},
    "no_dense": {"dense_in_features": 0},
    "no_dense_dcn": {"dense_in_features": 0, "interaction": "dcn"},
    "multitask_weighted": {
        "weighted": True,
        "tasks": [{"name": "a"}, {"name": "b", "weight": 0.5}],
        "top_mlp": [16, 2],
    },
    "fp16_tables": {"embedding_precision": "fp16"},
    "mean_pooling": {"tables": [{**TINY.tables[0], "pooling_type": "mean"}, *TINY.tables[1:]]},
}


def test_a_managed_vocabulary_is_carried_in_the_program():
    """Raw ids (admitted ones, large 63-bit ones and ids never seen) map to rows inside the program as
    the trained network maps them at evaluation."""
    vocab = {**TINY.tables[1], "rows": 12, "vocabulary": {"policy": "lfu"}}
    cfg = config(tables=[TINY.tables[0], vocab, *TINY.tables[2:]])
    model = build_model(cfg, torch.device("cpu"))
    initialize(model, cfg, seed=3)
    seen = torch.tensor([5, 1 << 40, 77, 5, (1 << 62) + 9, 123456789])
    model.train()
    inputs = probe_inputs(cfg, 6, 1)
    admitting = list(inputs)
    t_of = [f for t in cfg.tables for f in t.features]
    at = 1 + 2 * t_of.index(vocab["features"][0])
    admitting[at], admitting[at + 1] = seen, torch.ones(6, dtype=torch.int64)
    with torch.no_grad():  # a training forward admits the ids
        values = torch.cat([admitting[1 + 2 * i] for i in range(len(t_of))])
        lengths = torch.cat([admitting[2 + 2 * i] for i in range(len(t_of))])
        model.model(admitting[0], KeyedJaggedTensor(keys=t_of, values=values, lengths=lengths))
    state = model.state_dict()
    program = export_program(serving_model(cfg, state), cfg, "vocabulary").module()
    probe = list(probe_inputs(cfg, 8, 2))
    probe[at], probe[at + 1] = torch.cat([seen, torch.tensor([1 << 50, 3])]), torch.ones(8, dtype=torch.int64)
    with torch.no_grad():
        got = program(*probe)
    torch.testing.assert_close(got, network_probabilities(cfg, state, tuple(probe)), rtol=0, atol=1e-6)


def config(**over) -> ModelConfig:
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), TINY, over)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


def trained_state(cfg: ModelConfig) -> dict:
    model = build_model(cfg, torch.device("cpu"))
    initialize(model, cfg, seed=3)
    return model.state_dict()


def network_probabilities(cfg: ModelConfig, state: dict, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The trainer's network (DLRMTrain.model) on the same rows as a KeyedJaggedTensor: sigmoid(logits)."""
    model = build_model(cfg)
    model.load_state_dict(state, assign=True)
    per = 3 if cfg.weighted else 2
    sparse = inputs[1:]
    values = torch.cat([sparse[per * i] for i in range(len(feature_names(cfg)))])
    lengths = torch.cat([sparse[per * i + 1] for i in range(len(feature_names(cfg)))])
    weights = torch.cat([sparse[per * i + 2] for i in range(len(feature_names(cfg)))]) if cfg.weighted else None
    kjt = KeyedJaggedTensor(keys=feature_names(cfg), values=values, lengths=lengths, weights=weights)
    with torch.no_grad():
        p = torch.sigmoid(model.eval().model(inputs[0], kjt).float())
    return p.squeeze(-1) if len(cfg.tasks) == 1 else p


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_model_kind_exports_and_equals_the_trainers_network(kind):
    cfg = config(**KINDS[kind])
    state = trained_state(cfg)
    module = serving_model(cfg, state)
    program = export_program(module, cfg, kind).module()
    for batch, seed in ((7, 1), (1, 2), (64, 3)):  # batch sizes other than the traced one
        inputs = probe_inputs(cfg, batch, seed)
        want = network_probabilities(cfg, state, inputs)
        with torch.no_grad():
            got = program(*inputs)
        assert got.shape == ((batch,) if len(cfg.tasks) == 1 else (batch, len(cfg.tasks)))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_int8_tables_are_fbgemms_rowwise_layout_and_export():
    """Each row is stored as codes in 0..255 with a per-row scale and bias: dequantized within half a
    step of the trained row; the int8 program equals the network run on the dequantized tables."""
    cfg = config(**KINDS["multitask_weighted"])
    state = trained_state(cfg)
    module = serving_model(cfg, state, int8=True)
    for name, bag in module.bags.items():
        assert isinstance(bag, Int8RowwiseBag) and bag.codes.dtype == torch.uint8
        trained = state[f"model.sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"]
        step = (trained.max(1).values - trained.min(1).values) / INT8_LEVELS
        assert ((bag.dequantized() - trained).abs() <= step[:, None] / 2 + 1e-7).all()
    dequantized = dict(state)
    for name, bag in module.bags.items():
        dequantized[f"model.sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"] = bag.dequantized()
    program = export_program(module, cfg, "int8").module()
    inputs = probe_inputs(cfg, 9, 4)
    with torch.no_grad():
        got = program(*inputs)
    torch.testing.assert_close(got, network_probabilities(cfg, dequantized, inputs), rtol=0, atol=1e-6)


def assert_one_line(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


def test_refusals_are_one_line(saved_checkpoints, tmp_path, capsys, monkeypatch):
    ckpt = saved_checkpoints / "step_00000004"
    taken = tmp_path / "taken"
    taken.mkdir()
    rc = export_main([str(ckpt), str(taken), "--format", "bundle"])
    assert_one_line(rc, capsys.readouterr().err, str(taken), "already exists", "choose a new path")
    rc = export_main([str(ckpt), str(tmp_path / "m.pt"), "--int8"])
    assert_one_line(rc, capsys.readouterr().err, "--int8", "--format bundle")

    monkeypatch.setattr(torch, "__version__", "2.5.1")
    rc = export_main([str(ckpt), str(tmp_path / "old"), "--format", "bundle"])
    assert_one_line(rc, capsys.readouterr().err, "torch 2.5.1 is too old", "launch/setup.sh")
    monkeypatch.undo()

    class DataDependent(torch.nn.Module):  # a hook that branches on values: torch.export cannot capture it
        def forward(self, dense: torch.Tensor) -> torch.Tensor:
            return dense * 2 if bool(dense.sum() > 0) else dense

    real = bundle_module.serving_model

    def with_hook(cfg, state, int8=False, parquet=None):
        module = real(cfg, state, int8, parquet)
        module.dense_transform = DataDependent()
        return module

    monkeypatch.setattr(bundle_module, "serving_model", with_hook)
    out = tmp_path / "never"
    rc = export_main([str(ckpt), str(out), "--format", "bundle"])
    assert_one_line(rc, capsys.readouterr().err, "cannot bundle", "torch.export", "--format file")
    assert not out.exists() and not list(tmp_path.glob(".never*"))
