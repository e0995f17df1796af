"""The options a GPU run needs, checked in one process: table weights in fp16/bf16
(model.embedding_precision), quantized embedding comms (sharding.qcomms_*), dense allreduce
compression (trainer.dense_allreduce_precision), the exact AUC, and table initialisation."""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc
from torchrec.distributed.types import CommOp

from dlrm.config import ConfigError, ShardingConfig, validate
from dlrm.config.choices import Precision
from dlrm.data.source import make_source
from dlrm.distributed.capacity import PlanError
from dlrm.distributed.sharding import plan_sharding, qcomms_registry, sharders
from dlrm.distributed.topology import planner_topology
from dlrm.models.dlrm import build_model, embedding_configs, initialize, table_rows_init
from dlrm.trainer.metrics import auc_and_logloss, exact_auc
from tests.helpers.cli import assert_one_error, main_in_process
from tests.helpers.scoring import numpy_auc

TABLE = "model.sparse_arch.embedding_bag_collection.embedding_bags.{}.weight"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# --- configuration: every documented value, and the refused combinations --------------------------


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cpu_accepts_fp32_and_fp16_everywhere(make_config, precision):
    validate(
        make_config(
            f"model.embedding_precision={precision}",
            f"sharding.qcomms_forward={precision}",
            f"sharding.qcomms_backward={precision}",
            f"trainer.dense_allreduce_precision={precision}",
        )
    )


@pytest.mark.parametrize("key", ["sharding.qcomms_forward", "sharding.qcomms_backward"])
def test_bf16_qcomms_are_cuda_only(make_config, key):
    with pytest.raises(ConfigError, match=rf"'{key}' = 'bf16' is invalid: .*on CPU use fp16"):
        validate(make_config(f"{key}=bf16"))
    validate(make_config(f"{key}=bf16", "topology=dgx_h100"))


@pytest.mark.parametrize("topology", ["cpu", "dgx_h100", "zion"])
def test_bf16_tables_are_refused_on_every_device(make_config, topology):
    """On a GPU they would pass the config and fail at sharding (below), and past that at the first
    lookup: fbgemm 1.8's CUDA training kernels take fp32, fp16 and fp8 weights only."""
    with pytest.raises(ConfigError, match=r"'model.embedding_precision' = 'bf16' is invalid: .*no bf16 .*use fp16"):
        validate(make_config("model.embedding_precision=bf16", f"topology={topology}"))
    validate(make_config("model.embedding_precision=fp16", f"topology={topology}"))


@pytest.fixture
def gpu_cache_path(monkeypatch):
    """fbgemm's TBE sets up its cache as on a GPU (`use_cpu` false in `_apply_cache_state`), on the CPU:
    with no cached table it then only checks the cache precision and registers empty buffers.
    Returns the cache precisions it was given."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen as TBE

    original, seen = TBE._apply_cache_state, []

    def as_on_a_gpu(self, cache_state, algorithm, load_factor, sets, reserved, precision):
        seen.append(precision)
        use_cpu, self.use_cpu = self.use_cpu, False
        try:
            return original(self, cache_state, algorithm, load_factor, sets, reserved, precision)
        finally:
            self.use_cpu = use_cpu

    monkeypatch.setattr(TBE, "_apply_cache_state", as_on_a_gpu)
    return seen


@pytest.fixture
def one_rank_group():
    """A 1-rank Gloo group for this test only (with a group up, the command-line tests' user errors would
    end the process: dlrm.common.errors.exit_on_user_error)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_tables_shard_for_a_gpu_in_fp16_and_not_in_bf16(make_config, one_rank_group, gpu_cache_path, precision):
    """Why bf16 tables are refused on GPUs too (the CUDA kernels' weight types cannot be seen from a CPU
    build; fbgemm v1.8.0's dispatch_macros.h lists fp32, fp16 and fp8): TorchRec 1.8 gives fbgemm the
    tables' precision as the cache precision, cached or not, and fbgemm's GPU path refuses a bf16 cache
    for every table. fp16 tables pass. If bf16 starts passing, TorchRec or fbgemm changed: run the GPU
    check's bf16 probe (dev/gpu_check) before lifting the refusal."""
    from dlrm.distributed.sharding import shard_model
    from dlrm.optim.optimizers import fuse_embedding_optimizer

    cfg = make_config("model=tiny", f"model.embedding_precision={precision}")  # not validated: bf16 is refused
    model = build_model(cfg.model)
    fuse_embedding_optimizer(model, cfg.optim.embedding)
    plan = plan_sharding(cfg, model, planner_topology(cfg.topology, 1, 1), pg=None)
    if precision == "bf16":
        with pytest.raises(AssertionError, match="cache_precision bf16 not supported"):
            shard_model(cfg, model, plan, one_rank_group, torch.device("cpu"))
    else:
        shard_model(cfg, model, plan, one_rank_group, torch.device("cpu"))
    assert {str(p.value) for p in gpu_cache_path} == {precision}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_dense_allreduce_precision_composes_with_hierarchical(make_config, precision):
    validate(make_config(f"trainer.dense_allreduce_precision={precision}", "trainer.dense_allreduce=hierarchical"))


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["trainer.dense_allreduce_precision=bf16", "trainer.dense_sync=local_sgd"],
            ["trainer.dense_allreduce_precision", "'bf16'", "nothing to compress", "dense_sync=allreduce"],
        ),
        (
            ["model.embedding_precision=fp16", "sharding=data_parallel"],
            ["model.embedding_precision", "'fp16'", "data_parallel", "t_C1", "sharding=auto"],
        ),
        (
            ["model.embedding_precision=fp16", "+sharding.per_table.t_C3=data_parallel"],
            ["model.embedding_precision", "t_C3", "data_parallel"],
        ),
        (["model.embedding_precision=bf16"], ["model.embedding_precision", "'bf16'", "no bf16", "fp16"]),
        (["sharding.qcomms_backward=bf16"], ["sharding.qcomms_backward", "'bf16'", "fp16"]),
        (["sharding.qcomms_forward=fp8"], ["sharding.qcomms_forward", "fp8", "fp32, fp16, bf16"]),
        (["trainer.dense_allreduce_precision=int8"], ["trainer.dense_allreduce_precision", "int8"]),
        (["model.embedding_precision=fp64"], ["model.embedding_precision", "fp64"]),
    ],
)
def test_bad_precision_config_is_one_error_line(monkeypatch, capsys, overrides, words):
    assert_one_error(*main_in_process(monkeypatch, capsys, *overrides), *words)


# --- table weights precision ------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_tables_are_built_in_the_configured_dtype(make_config, precision):
    """On meta (what the planner sizes) and on the CPU (export, predict, the unsharded reference);
    TorchRec's own unsharded bags would be fp16 for bf16."""
    cfg = make_config("model=tiny", f"model.embedding_precision={precision}")
    assert {str(c.data_type.value).lower() for c in embedding_configs(cfg.model)} == {precision}
    for device in ("meta", "cpu"):
        state = build_model(cfg.model, torch.device(device)).state_dict()
        assert state[TABLE.format("t_C1")].dtype == DTYPES[precision]
        assert state["model.dense_arch.model._mlp.0._linear.weight"].dtype == torch.float32


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_tables_start_from_the_rounded_fp32_values_and_run(make_config, precision):
    cfg = make_config("model=tiny", "data.global_batch_size=8")
    full = build_model(cfg.model, torch.device("cpu"))
    initialize(full, cfg.model, seed=0)
    cfg_half = make_config("model=tiny", "data.global_batch_size=8", f"model.embedding_precision={precision}")
    half = build_model(cfg_half.model, torch.device("cpu"))
    initialize(half, cfg_half.model, seed=0)
    name = TABLE.format("t_C2")
    assert torch.equal(half.state_dict()[name], full.state_dict()[name].to(DTYPES[precision]))
    loss, (_, logits, _) = half(make_source(cfg).samples("train", 0, 8))  # the exported model's forward
    assert torch.isfinite(loss) and logits.dtype == torch.float32


def _planner_needs_ddr(make_config, precision, ddr_GB):
    cfg = make_config("model=bench_cpu", f"model.embedding_precision={precision}", f"topology.ddr_GB={ddr_GB}")
    return plan_sharding(cfg, build_model(cfg.model), planner_topology(cfg.topology, 1, 1), pg=None)


def test_torchrec_planner_sizes_tables_by_their_precision(make_config):
    """bench_cpu: 26 x 100k x 16 weights = 166 MB in fp32, 83 MB in fp16 (+ 10 MB of row-wise
    Adagrad state): 0.15 GB per rank holds the fp16 tables only. The planner reads the precision
    from the tables' dtype (EmbeddingBagConfig.data_type) on the meta model."""
    with pytest.raises(PlanError, match="found no plan"):
        _planner_needs_ddr(make_config, "fp32", 0.15)
    plan = _planner_needs_ddr(make_config, "fp16", 0.15)
    assert len(plan.plan) == 1


def test_memory_report_counts_two_bytes_per_half_precision_weight(make_config):
    from dlrm.plan import make_plan

    def weights(*overrides):
        return make_plan(make_config("model=bench_cpu", "sharding=table_wise", *overrides), 2)["memory"]

    fp32, fp16 = weights(), weights("model.embedding_precision=fp16")
    assert fp32["sharded_weights_total"] == 26 * 100_000 * 16 * 4
    assert fp16["sharded_weights_total"] == 26 * 100_000 * 16 * 2
    assert fp16["embedding_precision"] == "fp16"


def test_precheck_counts_half_precision_tables(make_config):
    """The lower bound refused before planning halves too (weights; the optimizer state stays fp32)."""
    from dlrm.distributed.capacity import check_memory

    with pytest.raises(PlanError, match="needs at least"):
        check_memory(make_config("model=bench_cpu", "topology.ddr_GB=0.12"), 1)
    check_memory(make_config("model=bench_cpu", "topology.ddr_GB=0.12", "model.embedding_precision=fp16"), 1)


# --- quantized comms ----------------------------------------------------------------------------


COMM_OPS = {
    CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name,
    CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name,
    CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL.name,
}


def test_fp32_comms_need_no_codecs(make_config):
    assert qcomms_registry(ShardingConfig(), "cpu") is None
    assert sharders(make_config())[0].qcomm_codecs_registry is None


HALF_PAIRS = [("fp16", "fp32"), ("fp32", "fp16"), ("fp16", "fp16")]
BF16_PAIRS = [("bf16", "fp32"), ("fp32", "bf16"), ("bf16", "bf16"), ("bf16", "fp16")]


@pytest.mark.parametrize(  # bf16 is refused on CPU by the config (TorchRec would send fp16)
    "device, forward, backward", [("cpu", *p) for p in HALF_PAIRS] + [("cuda", *p) for p in HALF_PAIRS + BF16_PAIRS]
)
def test_qcomms_registry_has_the_configured_precisions(device, forward, backward):
    registry = qcomms_registry(ShardingConfig(qcomms_forward=forward, qcomms_backward=backward), device)
    assert registry is not None and set(registry) == COMM_OPS
    for codecs in registry.values():
        assert codecs.forward.quantized_dtype == DTYPES[forward]
        assert codecs.backward.quantized_dtype == DTYPES[backward]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_qcomms_codec_rounds_to_its_precision(precision):
    """The codec's encode/decode on the CPU is the plain cast to its dtype and back."""
    registry = qcomms_registry(ShardingConfig(qcomms_forward=precision), "cuda")
    assert registry is not None
    codec = registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name].forward
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    encoded = codec.encode(x)
    assert encoded.dtype == DTYPES[precision]
    torch.testing.assert_close(codec.decode(encoded), x.to(DTYPES[precision]).float(), rtol=0, atol=0)


def backward_codec(**sharding):
    registry = qcomms_registry(ShardingConfig(**sharding), "cuda")
    assert registry is not None
    return registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name].backward


def test_fp16_gradients_are_loss_scaled_on_the_wire():
    """Pooled-embedding gradients of a mean loss (1e-7..1e-5 here) lie under fp16's smallest normal
    (6.1e-5): cast as they are, they keep a few bits (1e-7: one in 2^-24 steps, 50% error) or none. With
    the default scale (sharding.qcomms_backward_loss_scale=1024) they cross the wire as x * 1024 in fp16
    and come back within fp16's rounding, 2^-11 relative; without it, far off."""
    g = torch.Generator().manual_seed(0)
    grad = torch.exp(torch.empty(4096).uniform_(np.log(1e-7), np.log(1e-5), generator=g)) * torch.sign(
        torch.randn(4096, generator=g)
    )
    scaled = backward_codec(qcomms_backward="fp16")
    encoded = scaled.encode(grad)
    assert encoded.dtype == torch.float16
    torch.testing.assert_close(encoded.float(), (grad * 1024).half().float(), rtol=0, atol=0)  # the scale was applied
    rel = ((scaled.decode(encoded) - grad).abs() / grad.abs()).max().item()
    assert rel <= 2**-11, rel
    plain = backward_codec(qcomms_backward="fp16", qcomms_backward_loss_scale=None)
    rel_plain = ((plain.decode(plain.encode(grad)) - grad).abs() / grad.abs()).max().item()
    assert rel_plain > 0.05, rel_plain  # what the scale is for
    assert backward_codec(qcomms_forward="fp16").encode(grad).dtype == torch.float32  # fp32 backward: no codec work


def test_fbgemms_own_loss_scale_divides_the_fp16_payload():
    """Why the scale is applied around the codec (dlrm.distributed.sharding.LossScaledCodec), not given as
    TorchRec's QCommsConfig.backward_loss_scale: fbgemm 1.8's decode divides the fp16 payload by the scale
    before the cast back, so the small gradients land on fp16's subnormal grid after all. If this fails,
    fbgemm divides after the cast: pass the scale in QCommsConfig and drop LossScaledCodec."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

    config = QCommsConfig(backward_precision=CommType.FP16, backward_loss_scale=1024.0)
    registry = get_qcomm_codecs_registry(config, device=torch.device("cuda"))
    assert registry is not None
    codec = registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name].backward
    assert codec.quantized_dtype == torch.float16 and SparseType.FP16.as_dtype() == torch.float16
    grad = torch.tensor([1.0e-7, 1.3e-7, 3.1e-7])
    rel = ((codec.decode(codec.encode(grad)) - grad).abs() / grad).max().item()
    assert rel > 0.05, rel


@pytest.mark.parametrize("value", [0, -1024, float("nan"), float("inf")])
def test_the_loss_scale_is_a_positive_number(make_config, value):
    with pytest.raises(ConfigError, match="sharding.qcomms_backward_loss_scale"):
        validate(make_config(f"sharding.qcomms_backward_loss_scale={value}"))
    validate(make_config("sharding.qcomms_backward=fp16", "sharding.qcomms_backward_loss_scale=null"))


def test_sharders_carry_the_registry_to_planner_and_dmp(make_config):
    (sharder,) = sharders(make_config("sharding.qcomms_forward=fp16", "sharding.qcomms_backward=fp16"))
    assert sharder.qcomm_codecs_registry is not None and set(sharder.qcomm_codecs_registry) == COMM_OPS
    assert "data_parallel" in sharder.sharding_types("cpu")
    (half,) = sharders(make_config("model.embedding_precision=fp16"))
    assert "data_parallel" not in half.sharding_types("cpu") and "table_wise" in half.sharding_types("cpu")


# --- exact AUC on the device ---------------------------------------------------------------------


@pytest.mark.parametrize("distinct", [3, 50, 100_000])  # heavy ties ... almost none
def test_exact_auc_equals_the_numpy_reference_with_ties(distinct):
    g = np.random.default_rng(distinct)
    n = 20_000
    labels = (g.random(n) < 0.3).astype(np.int64)
    scores = (g.integers(0, distinct, n) + labels * g.integers(0, 2, n)).astype(np.float32)  # informative, tied
    expected = numpy_auc(scores, labels)
    got = exact_auc(torch.from_numpy(scores), torch.from_numpy(labels)).item()
    assert got == pytest.approx(expected, abs=1e-12)


def test_exact_auc_equals_the_previous_implementation():
    """torchmetrics' binary_auroc on the sigmoid (what evaluation used before), on untied logits."""
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(50_000, generator=g) < 0.25).long()
    logits = torch.randn(50_000, generator=g) + labels
    before = binary_auroc(torch.sigmoid(logits), labels).item()
    assert exact_auc(logits, labels).item() == pytest.approx(before, abs=1e-6)


def test_exact_auc_edge_cases():
    assert exact_auc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 0, 1])).item() == 1.0
    assert exact_auc(torch.tensor([0.3, 0.2, 0.1]), torch.tensor([0, 0, 1])).item() == 0.0
    assert exact_auc(torch.tensor([0.5, 0.5, 0.5, 0.5]), torch.tensor([0, 1, 0, 1])).item() == 0.5
    auc, logloss = auc_and_logloss(torch.tensor([0.1, 2.0]), torch.tensor([1.0, 1.0]))
    assert auc is None and logloss > 0  # one class: undefined AUC, the log loss still counts


# --- initialisation where the tables live ------------------------------------------------------------


def test_table_init_keeps_its_cpu_values():
    """Generating on the shard's device changed nothing on the CPU (the values every CPU test and
    checkpoint relies on): a fixed sample of seed 0."""
    rows = table_rows_init(0, "t", rows=10_000, dim=4, start=4095, stop=4097, device=torch.device("cpu"))
    assert torch.equal(rows, table_rows_init(0, "t", 10_000, 4, 4095, 4097))
    assert rows.device.type == "cpu" and rows.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_table_init_on_cuda_is_generated_there_and_independent_of_the_row_range():
    cuda = torch.device("cuda")
    full = table_rows_init(0, "t", rows=10_000, dim=4, start=0, stop=10_000, device=cuda)
    assert full.device.type == "cuda" and full.abs().max() <= (1 / 10_000) ** 0.5
    assert torch.equal(table_rows_init(0, "t", 10_000, 4, 4000, 9000, device=cuda), full[4000:9000])
    assert torch.equal(table_rows_init(0, "t", 10_000, 4, 4095, 4097, device=cuda), full[4095:4097])


def test_traffic_model_counts_the_wire_precisions(make_config):
    """dlrm.plan's communication estimate: half the bytes for each half-precision collective."""
    from dlrm.plan import make_plan

    def comms(*overrides):
        return make_plan(make_config("model=bench_cpu", "sharding=table_wise", *overrides), 2)["comms"]

    fp32 = comms()
    half = comms(
        "sharding.qcomms_forward=fp16", "sharding.qcomms_backward=fp16", "trainer.dense_allreduce_precision=bf16"
    )
    assert half["allreduce_bytes"] == fp32["allreduce_bytes"] / 2
    by_kind, by_kind32 = half["alltoall_bytes_by_kind_mean"], fp32["alltoall_bytes_by_kind_mean"]
    for kind in ("pooled_fwd", "pooled_bwd"):
        assert by_kind[kind]["intra"] == by_kind32[kind]["intra"] / 2 > 0
    assert by_kind["ids"] == by_kind32["ids"]


def test_each_precision_knows_its_size():
    """The byte sizes the memory and traffic models use are those of torch's dtypes."""
    dtypes = {Precision.fp32: torch.float32, Precision.fp16: torch.float16, Precision.bf16: torch.bfloat16}
    assert set(dtypes) == set(Precision)
    for precision, dtype in dtypes.items():
        assert precision.itemsize == dtype.itemsize, precision
        assert Precision(str(precision)).itemsize == dtype.itemsize  # from a config's plain string too
