"""Every config composes and validates; each kind of bad config fails early with its message."""

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from dlrm.config import Config, ConfigError, validate, validate_world
from dlrm.config.compose import CONF_DIR, group_options
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import assert_one_error, main_in_process

GROUPS = ["model", "data", "topology", "sharding", "optim", "trainer", "experiment"]


# Options that validate only together with others (see test_adam_runs_on_cpu_only_for_replicated_tables).
NEEDS = {("optim", "adam"): ["sharding=data_parallel"]}


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in group_options(g)])
def test_every_group_option_composes_and_validates(make_config, group, option):
    cfg = make_config(f"{group}={option}", *NEEDS.get((group, option), []))
    validate(cfg)


def test_adam_runs_on_cpu_only_for_replicated_tables(make_config):
    """fbgemm's CPU kernels (sharded tables) have no Adam; data-parallel tables and CUDA do."""
    with pytest.raises(ConfigError, match="optim.embedding.name.*sharding=data_parallel"):
        validate(make_config("optim=adam"))
    with pytest.raises(ConfigError, match="t_C1"):
        validate(make_config("optim=adam", "sharding=data_parallel", "+sharding.per_table.t_C1=table_wise"))
    validate(make_config("optim=adam", "sharding=data_parallel"))
    validate(make_config("optim=adam", "topology=dgx_h100"))


def test_defaults_are_the_small_cpu_job(make_config):
    cfg = make_config()
    assert cfg.topology.device == "cpu" and cfg.data.source == "synthetic"
    assert len(cfg.model.tables) == 26 and cfg.model.dense_in_features == 13


def test_misspelt_key_is_rejected(make_config):
    with pytest.raises(ConfigError, match="max_stepz"):
        make_config("trainer.max_stepz=3")


def test_wrong_type_is_rejected(make_config):
    with pytest.raises(ConfigError, match="max_steps"):
        make_config("trainer.max_steps=many")


def _mutated(make_config, mutate, *overrides):
    cfg = make_config(*overrides)
    mutate(cfg)
    return cfg


BAD = {
    "zero rows": (lambda c: setattr(c.model.tables[0], "rows", 0), "model.tables[0].rows"),
    "negative dim": (lambda c: setattr(c.model.tables[1], "dim", -16), "model.tables[1].dim"),
    "zero layer": (lambda c: setattr(c.model, "bottom_mlp", [0, 16]), "model.bottom_mlp[0]"),
    "zero batch": (lambda c: setattr(c.data, "global_batch_size", 0), "data.global_batch_size"),
    "dot dims differ": (lambda c: setattr(c.model, "bottom_mlp", [64, 32]), "must equal the embedding dim 16"),
    "top not one logit": (lambda c: setattr(c.model, "top_mlp", [64, 2]), "model.top_mlp"),
    "fractional pooling on synthetic data": (
        lambda c: setattr(c.model.tables[2], "pooling", 2.5),
        "model.tables[2].pooling' = 2.5 is invalid: synthetic data draws a whole number",
    ),
    "negative dense": (lambda c: setattr(c.model, "dense_in_features", -1), "use 0 \\(no dense features\\)"),
    "bottom mlp without dense": (lambda c: setattr(c.model, "dense_in_features", 0), "set model.bottom_mlp=[]"),
    "dense without bottom mlp": (lambda c: setattr(c.model, "bottom_mlp", []), "or set model.dense_in_features=0"),
    "no dense on criteo": (
        lambda c: (setattr(c.model, "dense_in_features", 0), setattr(c.model, "bottom_mlp", []), _criteo(c)),
        "Criteo data has 13 dense features",
    ),
    "no dense, one feature, dot": (
        lambda c: (setattr(c.model, "dense_in_features", 0), setattr(c.model, "bottom_mlp", []), _one_table(c)),
        "needs at least two sparse features",
    ),
    "per_table unknown table": (lambda c: c.sharding.per_table.update(nope="row_wise"), "sharding.per_table.nope"),
    "nccl on cpu": (lambda c: setattr(c.topology, "backend", "nccl"), "NCCL needs topology.device=cuda"),
    "zero bandwidth": (lambda c: setattr(c.topology.inter_node, "bandwidth_GBps", 0.0), "inter_node.bandwidth_GBps"),
    "duplicate feature": (lambda c: setattr(c.model.tables[1], "features", ["C1"]), "one table only"),
    "skip under the pipeline": (lambda c: setattr(c.trainer, "on_nonfinite", "skip"), "set trainer.pipeline=false"),
    "eval_only without resume": (lambda c: setattr(c.trainer, "eval_only", True), "trainer.resume=PATH"),
    "target auc of one": (lambda c: _target(c, 1.0, 10), "'trainer.target_auc' = 1.0 is invalid: give an AUC in"),
    "target auc at chance": (lambda c: _target(c, 0.5, 10), "'trainer.target_auc' = 0.5"),
    "target auc nan": (lambda c: _target(c, float("nan"), 10), "'trainer.target_auc' = nan"),
    "target auc without evaluations": (lambda c: _target(c, 0.8, 0), "trainer.target_auc stops at an evaluation"),
    "target auc without eval data": (
        lambda c: (_target(c, 0.8, 10), setattr(c.data, "eval_batches", 0)),
        "'data.eval_batches' = 0 is invalid: trainer.target_auc needs an eval set",
    ),
}


def _criteo(cfg) -> None:
    cfg.data.source = "criteo"


def _one_table(cfg) -> None:
    del cfg.model.tables[1:]


def _target(cfg, auc: float, eval_every: int) -> None:
    cfg.trainer.target_auc, cfg.trainer.eval_every_steps = auc, eval_every


# Choices are enums that OmegaConf enforces while composing: a value outside one is refused there.
NOT_A_CHOICE = {
    "sharding.strategy=diagonal": "sharding.strategy",
    "model.tables.0.sharding=rows": r"model.tables\[0\].sharding",
    "+sharding.per_table.t_C1=rows": "sharding.per_table.t_C1",
    "optim.dense.name=lamb": "optim.dense.name",
    "optim.embedding.name=lion": "optim.embedding.name",
    "topology.backend=mpi": "topology.backend",
    "topology.intra_node.fabric=mesh": "topology.intra_node.fabric",
    "model.interaction=cross": "model.interaction",
    "data.source=tfrecord": "data.source",
    "trainer.progress=fancy": "trainer.progress",
    "trainer.dense_precision=fp8": "trainer.dense_precision",
    "model.embedding_precision=int8": "model.embedding_precision",
    "sharding.qcomms_forward=fp8": "sharding.qcomms_forward",
    "sharding.qcomms_backward=mx4": "sharding.qcomms_backward",
    "trainer.dense_allreduce_precision=fp64": "trainer.dense_allreduce_precision",
}


@pytest.mark.parametrize("override", sorted(NOT_A_CHOICE))
def test_a_value_outside_its_choices_is_refused_when_composing(make_config, override):
    value = override.rpartition("=")[2]
    with pytest.raises(ConfigError, match=rf"'{NOT_A_CHOICE[override]}' = '{value}' is invalid: choose one of \w+, "):
        make_config(override)


def test_one_source_of_defaults(make_config):
    """The dataclasses of dlrm/config/ hold the defaults: the default job composed from conf/ equals
    them (model.tables aside), and the options the defaults list picks restate none of them."""
    composed, default = make_config(), Config()
    for section in ("data", "topology", "sharding", "optim", "trainer", "checkpoint"):
        assert asdict(getattr(composed, section)) == asdict(getattr(default, section)), section
    assert {**asdict(composed.model), "tables": []} == asdict(default.model)
    assert composed.seed == default.seed
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if isinstance(entry, DictConfig) and len(entry) == 1:
            ((group, option),) = entry.items()
            if option is not None and (CONF_DIR / group).is_dir():  # not Hydra's own groups
                keys = set(OmegaConf.load(CONF_DIR / group / f"{option}.yaml") or {})
                assert keys <= ({"tables"} if group == "model" else set()), (
                    f"conf/{group}/{option}.yaml restates {keys}"
                )


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_names_key_and_fix(make_config, case):
    mutate, expected = BAD[case]
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        validate(_mutated(make_config, mutate))


def test_batch_must_divide_among_ranks(make_config):
    cfg = make_config("data.global_batch_size=512")
    with pytest.raises(ConfigError, match="divisible by the world size 3"):
        validate_world(cfg, world_size=3, local_world_size=3)


def test_topology_must_match_launcher(make_config):
    cfg = make_config("topology=cpu_2x2")
    validate_world(cfg, world_size=4, local_world_size=2)
    with pytest.raises(ConfigError, match="WORLD_SIZE=2"):
        validate_world(cfg, world_size=2, local_world_size=2)
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE"):
        validate_world(cfg, world_size=4, local_world_size=4)


def _train(*args, launcher=(sys.executable, "-m")):
    return subprocess.run(
        [*launcher, "dlrm.train", *args, "hydra.run.dir=/tmp/dlrm-bad-config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_bad_config_exits_nonzero_before_training():
    result = _train("sharding.strategy=diagonal")
    assert result.returncode == 2
    assert "sharding.strategy" in result.stderr and "choose one of" in result.stderr
    assert "step " not in result.stdout


@pytest.mark.slow
def test_cli_topology_mismatch_with_torchrun_names_both():
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    result = _train("topology=cpu_2x2", launcher=(torchrun, "--standalone", "--nproc_per_node=2", "-m"))
    assert result.returncode != 0
    assert "WORLD_SIZE=2" in result.stderr and "topology.nodes" in result.stderr


def test_mlperf_recipe_is_the_reference_setup(make_config):
    """experiment=mlperf_dcnv2: MLPerf's reference DLRM-DCNv2 run (see the yaml for the sources)."""
    cfg = make_config("experiment=mlperf_dcnv2")
    validate(cfg)
    assert cfg.data.global_batch_size == 65536 and cfg.data.criteo.multi_hot_sizes[20] == 100
    assert cfg.model.interaction == "dcn" and {t.dim for t in cfg.model.tables} == {128}
    assert cfg.optim.embedding.name == cfg.optim.dense.name == "adagrad"
    assert cfg.optim.embedding.lr == cfg.optim.dense.lr == 0.005 and cfg.optim.dense.eps == 1e-10
    assert cfg.optim.schedule.warmup_steps == cfg.optim.schedule.decay_steps == 0
    assert cfg.trainer.target_auc == 0.80275 and cfg.trainer.eval_every_steps == 3200
    assert cfg.trainer.max_steps * 65536 >= 4_195_197_692 > (cfg.trainer.max_steps - 1) * 65536  # one epoch


def test_mlperf_recipe_on_cpu_is_refused_in_one_line(monkeypatch, capsys):
    """Here (no GPU, 2 GB per rank) the recipe ends with the memory refusal, before any process group."""
    code, out, err = main_in_process(monkeypatch, capsys, "experiment=mlperf_dcnv2", "topology=cpu")
    assert_one_error(code, out, err, "GB on every rank", "topology.ddr_GB")
