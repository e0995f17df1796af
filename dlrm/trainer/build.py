"""Build one rank's trainer: topology -> data source -> process group -> model -> sharding -> optimizers
-> the periodic components, then resume from a checkpoint (trainer.resume)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer

from dlrm.checkpoint import Checkpointer, CheckpointError, latest_checkpoint
from dlrm.common.cadence import Every
from dlrm.config import CheckpointConfig, Config, DeltasConfig, ModelConfig
from dlrm.data.source import PositionedSource, make_source
from dlrm.deltas.publish import Publisher
from dlrm.distributed.capacity import dense_param_count
from dlrm.distributed.dense_sync import use_compressed_allreduce, use_hierarchical_allreduce
from dlrm.distributed.local_sgd import LocalSGD
from dlrm.distributed.sharding import plan_sharding, shard_model
from dlrm.distributed.topology import (
    build_process_groups,
    device_for,
    init_distributed,
    planner_topology,
    synchronizer,
)
from dlrm.distributed.world import World
from dlrm.models.dlrm import DLRMTrain, build_model, compile_dense, initialize
from dlrm.models.mlp import use_onednn
from dlrm.models.onednn import choose_for_this_cpu
from dlrm.optim.optimizers import build_optimizer, fuse_embedding_optimizer, lr_schedule
from dlrm.run.records import recorded_config_sha256
from dlrm.trainer.evaluator import Evaluator
from dlrm.trainer.malloc import keep_freed_memory
from dlrm.trainer.profiler import StepProfiler
from dlrm.trainer.reporter import Reporter
from dlrm.trainer.stop import StopRequest
from dlrm.trainer.threads import apply_intra_op_threads
from dlrm.trainer.train_state import RecordedConfig, TrainState
from dlrm.trainer.trainer import Trainer, TrainerSettings, forward

log = logging.getLogger(__name__)


class Sharded(NamedTuple):
    """The model as sharded, with what trains it."""

    plan: ShardingPlan
    model: DistributedModelParallel
    dense_params: int
    optimizer: CombinedOptimizer
    local_sgd: LocalSGD | None
    pipeline: TrainPipelineSparseDist | None


def build(cfg: Config, world: World, run_dir: Path | None = None, model: DLRMTrain | None = None) -> Trainer:
    """One rank's trainer, resumed if trainer.resume says so.

    Args:
        cfg: a validated config (`validate`, `validate_world`); each component gets its section.
        world: this process's rank and the launcher's sizes.
        run_dir: the run directory (the same on every rank): rank 0 writes metrics.jsonl and
            summary.json there, and checkpoints go to run_dir/checkpoints unless checkpoint.dir is
            set. None: no files, and no checkpoints unless checkpoint.dir is set.
        model: the unsharded model (`build_model(cfg.model)`, on the meta device) if the caller built
            it already; None: built here.

    Returns:
        The trainer, at step 0 or the resumed checkpoint's step.
    """
    keep_freed_memory()  # the host blocks a step frees stay for the next: no page faults each step
    apply_intra_op_threads(cfg.trainer.intra_op_threads, world.local_world_size)  # no oversubscribed cores
    device = device_for(cfg.topology, world, tf32=cfg.trainer.tf32)
    sync = synchronizer(device)  # the clocks' wait for the device: at log windows, not per step
    source = make_source(cfg, device)  # data errors before any process group or table exists
    pg = init_distributed(cfg.topology, world, device, cfg.trainer.collective_timeout_s)
    sharded = shard(cfg, world, device, pg, model if model is not None else build_model(cfg.model))
    main_dir = run_dir if world.is_main else None
    reporter = Reporter(cfg, world, device, pg, main_dir, sync)
    state = TrainState(
        RecordedConfig(cfg.model, cfg.data, cfg.optim, cfg.sha256()),
        sharded.model,
        sharded.optimizer,
        world.world_size,
        sharded.plan,
        recorded_config_sha256(main_dir),
        reporter.run_time,
        source if isinstance(source, PositionedSource) else None,  # a Parquet source records the rows read
    )
    trace_dir = main_dir / "profile" if main_dir is not None else None  # rank 0 traces
    tasks = [task.name for task in cfg.model.tasks]
    settings = TrainerSettings(
        cfg.trainer, cfg.optim, cfg.data.global_batch_size, cfg.data.eval_batches, cfg.checkpoint, cfg.run.name
    )
    trainer = Trainer(
        settings=settings,
        world=world,
        run_dir=main_dir,
        device=device,
        sync=sync,
        pg=pg,
        source=source,
        state=state,
        reporter=reporter,
        evaluator=Evaluator(cfg.trainer, tasks, cfg.data.global_batch_size, device, pg),
        profiler=StepProfiler(cfg.trainer, device, pg, world.world_size, trace_dir, sync),
        checkpointer=_checkpointer(cfg.checkpoint, run_dir, pg, world.is_main),
        deltas=_publisher(cfg.deltas, cfg.model, run_dir, pg, world.is_main),
        stop=StopRequest(world.is_main),  # SIGINT/SIGTERM/SIGHUP: a clean stop at the next log step
        **sharded._asdict(),
    )
    if cfg.trainer.resume:
        resume(trainer, cfg.trainer.resume)
    trainer.schedule = lr_schedule(trainer.optimizer, cfg.optim.schedule, trainer.step, trainer.schedule_origin)
    return trainer


def shard(cfg: Config, world: World, device: torch.device, pg: dist.ProcessGroup, model: DLRMTrain) -> Sharded:
    """Shard `model` by the plan, hook the dense synchronisation, initialise, make the optimizers and
    the pipeline. Takes the whole Config: the plan is composed from the model, sharding and topology."""
    tr = cfg.trainer
    if device.type == "cpu":
        onednn, why = choose_for_this_cpu(tr.cpu_gemm)
        if onednn:
            use_onednn(model)
        kernels = "oneDNN" if onednn else "torch's (MKL on x86)"
        log.info(f"MLP fp32 products: {kernels} ({why})")
    if tr.compile_dense:
        compile_dense(model)
    dense_params = dense_param_count(model)
    fuse_embedding_optimizer(model, cfg.optim.embedding)
    topology = planner_topology(cfg.topology, world.world_size, world.local_world_size)
    plan = plan_sharding(cfg, model, topology, pg)
    sharded = shard_model(cfg, model, plan, pg, device)
    precision = tr.dense_allreduce_precision
    if tr.dense_allreduce == "hierarchical":  # the node x local groups exist only for it
        groups = build_process_groups(device, world.world_size // world.local_world_size, world.local_world_size)
        if not use_hierarchical_allreduce(sharded, groups, precision):
            raise RuntimeError("trainer.dense_allreduce=hierarchical, but the model has no DDP module to hook")
    elif precision != "fp32" and not use_compressed_allreduce(sharded, precision, pg):
        raise RuntimeError(f"trainer.dense_allreduce_precision={precision}, but the model has no DDP module")
    local_sgd = LocalSGD(tr.sync_period, tr.local_sgd_warmup_steps, pg) if tr.dense_sync == "local_sgd" else None
    if local_sgd is not None:
        local_sgd.hook(sharded)
    initialize(sharded, cfg.model, cfg.seed)
    optimizer = build_optimizer(sharded, sharded.fused_optimizer, cfg.optim, local_sgd)
    if local_sgd is not None:
        local_sgd.check_covered(sharded)
    pipeline_type = PrefetchTrainPipelineSparseDist if cfg.sharding.prefetch_pipeline else TrainPipelineSparseDist
    bf16 = tr.dense_precision == "bf16"
    pipeline = (
        pipeline_type(sharded, optimizer, device, custom_model_fwd=lambda batch: forward(sharded, device, bf16, batch))
        if tr.pipeline
        else None
    )
    return Sharded(plan, sharded, dense_params, optimizer, local_sgd, pipeline)


def _checkpointer(ck: CheckpointConfig, run_dir: Path | None, pg: dist.ProcessGroup, is_main: bool):
    """The checkpointer of checkpoint.dir, or of run_dir/checkpoints; None without either."""
    root = ck.dir or (run_dir / "checkpoints" if run_dir is not None else None)
    if root is None:
        return None
    every = Every(ck.every_steps, ck.at_end)
    background = ck.async_save and ck.every_steps > 0  # periodic saves only: the last waits anyway
    return Checkpointer(Path(root), ck.keep, pg, is_main, every=every, background=background)


def _publisher(
    deltas: DeltasConfig, model: ModelConfig, run_dir: Path | None, pg: dist.ProcessGroup, is_main: bool
) -> Publisher | None:
    """The embedding-delta publisher of deltas.dir, or of run_dir/deltas; None without either or a cadence."""
    root = deltas.dir or (run_dir / "deltas" if run_dir is not None else None)
    if not deltas.every_steps or root is None:
        return None
    return Publisher(model, Path(root), deltas.every_steps, deltas.at_end, pg, is_main)


def resume(trainer: Trainer, where: str) -> None:
    """Load model, optimizer state and step from `where`: "auto" (the newest complete checkpoint
    in the checkpoint directory; nothing if there is none) or a checkpoint directory. With
    trainer.eval_only the weights only, whatever the optimizers."""
    t = trainer
    if where == "auto":
        path = latest_checkpoint(t.checkpointer.root) if t.checkpointer is not None else None
        if path is None:
            log.info("resume=auto: no checkpoint yet, starting from step 0")
            return
    else:
        path = Path(where)
    loader = t.checkpointer or Checkpointer(path.parent, t.settings.checkpoint.keep, t.pg, t.world.is_main)
    t.optimizer.init_state()  # lazily created state (Adam's) must exist to be loaded into
    weights_only = t.settings.trainer.eval_only
    state = t.state.state_dict(weights_only)
    manifest = loader.load(path, state, t.state.expected(weights_only), verify=t.settings.checkpoint.verify)
    t.state.load_state_dict(state)
    t.reporter.run_time.carry(manifest.get("run_time"), t.step)
    if isinstance(t.source, PositionedSource) and not weights_only:
        continuation = t.source.resume_position(manifest.get("data_position"), t.step, str(path))
        if continuation is not None:
            log.info(continuation)
    if t.step > t.total_steps and not weights_only:
        raise CheckpointError(
            f"checkpoint {path} is at step {t.step}, past trainer.max_steps={t.total_steps}: raise "
            "trainer.max_steps to train on from it, or evaluate it with trainer.eval_only=true"
        )
    if t.local_sgd is not None:
        t.local_sgd.at(t.step)
    log.info(f"resumed from {path} at step {t.step}")
