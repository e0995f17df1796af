"""Measurements made inside one training process (a step of the check runs each as its own process):

    python dev/gpu_check/probes.py throughput --out FILE --warmup N --windows N --window N [overrides]
    python dev/gpu_check/probes.py uvm --out FILE --steps N [overrides]
    python dev/gpu_check/probes.py bf16 --out FILE

throughput: the Trainer's own steps (`step_once`, as dlrm.bench.training times them) after `--warmup`,
    `--windows` windows of `--window` steps: samples/s of the host clock (the device synchronised at each
    window's end) and, on CUDA, each step's device time from CUDA events recorded on the training stream
    before and after it (the GPU busy with the step, or waiting inside it for the host).
uvm: a training of `--steps` steps with an evaluation halfway and at the end, the tables in host memory
    behind the HBM cache (the overrides choose it): the cache's hit rate over each stretch of training
    (fbgemm's uvm cache stats: 1 - unique misses / unique ids) and the cache lines still locked after
    each evaluation (fbgemm's lxu_cache_locking_counter; dlrm.distributed.cache_locks).
bf16: fbgemm's table-batched embedding with bf16 weights on the GPU, a lookup and an update, with the
    cache precision TorchRec would give it (bf16) and with fp32: whether this fbgemm trains bf16 tables
    (dlrm.config refuses model.embedding_precision=bf16 because fbgemm 1.8 does not).
Each writes one JSON object to --out. fbgemm's cache statistics and lock counters are its internals,
read here only (a probe of a development tool).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # dlrm from this checkout (a bundle's source tree has no install)

import torch  # noqa: E402

from dlrm.common.io import write_atomic  # noqa: E402


def trainer_for(overrides: list[str], steps: int):
    """A validated 1-process Trainer of these overrides, for `steps` steps, writing no files."""
    from dlrm.config import validate, validate_world
    from dlrm.config.compose import compose
    from dlrm.distributed.world import World
    from dlrm.trainer.build import build

    cfg = compose(overrides)
    cfg.trainer.max_steps = steps
    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    return build(cfg, world, None)


def throughput(overrides: list[str], warmup: int, windows: int, window: int) -> dict:
    trainer = trainer_for(overrides, warmup + windows * window)
    device, batch = trainer.device, trainer.cfg.data.global_batch_size
    cuda = device.type == "cuda"
    batches = trainer.batches("train", 0, None)
    trainer.model.train()
    loss = None

    def step() -> None:
        nonlocal loss
        loss = trainer.step_once(batches)
        trainer.step += 1

    for _ in range(warmup):
        step()
    trainer.sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    host_s, device_ms = [], []
    for _ in range(windows):
        events, start = [], time.perf_counter()
        for _ in range(window):
            begin = torch.cuda.Event(enable_timing=True) if cuda else None
            if begin is not None:
                begin.record()
            step()
            if begin is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                events.append((begin, end))
        trainer.sync()
        host_s.append((time.perf_counter() - start) / window)
        device_ms += [b.elapsed_time(e) for b, e in events]
    host = statistics.median(host_s)
    dev = statistics.median(device_ms) if device_ms else None
    return {
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "global_batch_size": batch,
        "steps_timed": windows * window,
        "samples_per_s": batch / host,
        "samples_per_s_windows": [batch / h for h in host_s],
        "host_ms_per_step": 1e3 * host,
        "device_ms_per_step": dev,
        "device_busy": dev / (1e3 * host) if dev is not None else None,
        "peak_gpu_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "final_loss": float(loss) if loss is not None else None,
        "plan_kernels": sorted({str(p["compute_kernel"]) for p in _plan(trainer)}),
    }


def _plan(trainer) -> list[dict]:
    from dlrm.distributed.sharding import describe_plan

    return describe_plan(trainer.plan)


def uvm(overrides: list[str], steps: int) -> dict:
    from dlrm.distributed.cache_locks import embedding_kernels
    from dlrm.trainer.loop import train

    trainer = trainer_for([*overrides, f"trainer.eval_every_steps={max(1, steps // 2)}"], steps)
    cached = [t for t in embedding_kernels(trainer.model) if t.lxu_cache_weights.numel()]
    for t in cached:  # fbgemm's stats, off by default: on, with buffers of their size
        t.gather_uvm_cache_stats = True
        t._init_uvm_cache_stats()
    evaluations: list[dict] = []

    def stretch() -> dict:
        stats = sum((t.get_uvm_cache_stats().double().cpu() for t in cached), torch.zeros(6, dtype=torch.float64))
        for t in cached:
            t.reset_uvm_cache_stats()
        unique, misses = float(stats[2]), float(stats[3])  # fbgemm's UVMCacheStatsIndex
        return {"unique_ids": unique, "unique_misses": misses, "hit_rate": 1 - misses / unique if unique else None}

    evaluate = trainer.evaluate

    def evaluate_and_look() -> dict:
        training = stretch()
        figures = evaluate()
        locked = sum(int((t.lxu_cache_locking_counter > 0).sum()) for t in cached)
        stretch()  # the evaluation's own lookups: not the training's hit rate
        evaluations.append({"step": trainer.step, "training_before": training, "locked_lines_after": locked})
        return figures

    trainer.evaluate = evaluate_and_look
    summary = train(trainer)
    return {
        "cached_tables_kernels": len(cached),
        "cache_lines": sum(int(t.lxu_cache_weights.shape[0]) for t in cached),
        "plan_kernels": sorted({str(p["compute_kernel"]) for p in _plan(trainer)}),
        "steps": summary.get("steps"),
        "eval_auc": summary.get("eval_auc"),
        "train_samples_per_s": summary.get("train_samples_per_s"),
        "evaluations": evaluations,
    }


def bf16() -> dict:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    out = {}
    for cache in ("bf16", "fp32"):
        try:
            tbe = SplitTableBatchedEmbeddingBagsCodegen(
                [(1000, 128, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)],
                optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                weights_precision=SparseType.BF16,
                cache_precision=SparseType(cache),
                device=torch.device("cuda"),
            )
            indices = torch.randint(0, 1000, (64,), device="cuda", dtype=torch.int32)
            offsets = torch.arange(0, 65, 4, device="cuda", dtype=torch.int32)
            tbe(indices, offsets).float().sum().backward()
            torch.cuda.synchronize()
            out[f"cache_{cache}"] = {"trains": True, "weights_dtype": str(tbe.weights_dev.dtype)}
        except Exception as e:  # what fbgemm says is the finding
            out[f"cache_{cache}"] = {"trains": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("probe", choices=("throughput", "uvm", "bf16"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--steps", type=int, default=60)
    args, overrides = p.parse_known_args(argv)
    if args.probe == "throughput":
        result = throughput(overrides, args.warmup, args.windows, args.window)
    elif args.probe == "uvm":
        result = uvm(overrides, args.steps)
    else:
        result = bf16()
    write_atomic(args.out, (json.dumps(result, indent=2, default=str) + "\n").encode())
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, default=str), flush=True)
    loss = result.get("final_loss")
    return 1 if isinstance(loss, float) and not math.isfinite(loss) else 0


if __name__ == "__main__":
    sys.exit(main())
