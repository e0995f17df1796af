"""Training-speed benchmark: median samples/s over timed windows, samples per CPU-second, peak memory.

    python -m dlrm.bench.training [options] [hydra overrides]            # 1 process
    torchrun --nproc_per_node=2 -m dlrm.bench.training [options] [overrides]
    python -m dlrm.bench.training --source-only --ranks 2 experiment=bench_cpu   # the data source alone

Trains `--warmup` untimed steps, then `--windows` timed windows of `--window` steps; reports the
median window's samples/s, samples per CPU-second of all ranks, eval AUC, peak RSS per rank (and
peak CUDA memory) and the source's own speed; `--profile K` adds a profiler table and ms per phase
of K further steps. `--source-only` times rank 0's slice of the data source without a model or
process group, against the samples/s one GPU consumes. Rank 0 prints a summary and writes the JSON
to `--out`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from dlrm.common.errors import ArgumentParser, UserError, exit_on_user_error
from dlrm.common.io import write_json_atomic
from dlrm.config import Config, to_config, validate, validate_world
from dlrm.config.compose import compose_job, hydra_session
from dlrm.distributed.world import World
from dlrm.trainer.malloc import keep_freed_memory
from dlrm.trainer.metrics import peak_rss_mb
from dlrm.trainer.phases import PHASES, device_breakdown, spans_of, step_breakdown

GPU_BUDGET_SAMPLES_PER_S = 1.7e6  # per GPU: MLPerf DLRM-DCNv2 trains ~13.8M samples/s on 8 H100


class CachedSource:
    """The first `count` train batches of a source, materialised per rank and repeated forever.

    Eval batches come from the wrapped source unchanged.
    """

    def __init__(self, source, count: int) -> None:
        self.source = source
        self.count = count
        self.device = getattr(source, "device", None)  # where the wrapped source makes its batches
        self._cache: dict = {}

    def num_batches(self, split: str) -> int | None:
        return self.source.num_batches(split)

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> Iterator:
        if split != "train":
            return self.source.batches(split, rank, world_size, start_step)
        key = (rank, world_size)
        if key not in self._cache:
            first = itertools.islice(self.source.batches("train", rank, world_size), self.count)
            # host batches page-locked once: host-to-device copies run asynchronously
            pin = torch.cuda.is_available() and (self.device is None or torch.device(self.device).type == "cpu")
            self._cache[key] = [batch.pin_memory() if pin else batch for batch in first]
        cached = self._cache[key]
        return (cached[step % len(cached)] for step in itertools.count(start_step))


def compose_config(overrides: list[str], max_table_rows: int = 0, config_dir: str | None = None) -> Config:
    """Compose and validate the training config for `overrides` (`experiment=bench_cpu` unless one is given).

    Args:
        overrides: Hydra overrides, as on the training command line.
        max_table_rows: cap on every table's rows; 0 keeps the configured sizes.
        config_dir: an extra directory of config groups (the training command's `-cd`).
    """
    if not any(o.startswith(("experiment=", "+experiment=")) for o in overrides):
        overrides = ["experiment=bench_cpu", *overrides]
    with hydra_session():
        cfg = to_config(compose_job(overrides, with_hydra=False, config_dir=config_dir))
    if max_table_rows > 0:
        for table in cfg.model.tables:
            table.rows = min(table.rows, max_table_rows)
    validate(cfg)
    return cfg


def source_speed(source, rank: int, world_size: int, batches: int = 3) -> float:
    """Samples/s of the source alone on this rank (after one untimed batch)."""
    it = source.batches("train", rank, world_size)
    first = next(it)
    device = first.labels.device  # a source that makes batches on the GPU: time the kernels too

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    sync()
    return batches * first.labels.shape[0] / (time.perf_counter() - start)


def source_only(args: argparse.Namespace, cfg: Config) -> dict:
    """Time rank 0's slice of the data source alone, without a model or process group.

    Returns:
        The figures as a dict: median and per-window samples/s per rank, samples per CPU-second,
        ids per sample, and the median's fraction of `GPU_BUDGET_SAMPLES_PER_S`.

    Raises:
        UserError: the global batch does not divide by the number of ranks.
    """
    from dlrm.data.source import make_source

    tp = cfg.topology
    ranks = args.ranks or tp.nodes * (tp.ranks_per_node or 1)
    if cfg.data.global_batch_size % ranks:
        raise UserError(f"--ranks {ranks}: data.global_batch_size={cfg.data.global_batch_size} must be divisible by it")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)  # as a rank gets: torchrun gives cores / ranks per node
    keep_freed_memory()  # malloc as in a training process (the trainer sets it): no page faults per batch
    source = make_source(cfg, device)
    per_rank = cfg.data.global_batch_size // ranks
    made_on = getattr(source, "device", None)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    batches = source.batches("train", 0, ranks)
    ids = next(batches).sparse_features.values().numel()  # untimed, as the warm-up
    for _ in range(args.warmup):
        next(batches)
    sync()
    rates = []
    cpu_start = time.process_time()
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.window):
            next(batches)
        sync()
        rates.append(args.window * per_rank / (time.perf_counter() - start))
    cpu_seconds = time.process_time() - cpu_start  # all this process's threads (a loader's too)
    median = statistics.median(rates)
    return {
        "source": str(cfg.data.source),
        "device": str(made_on if made_on is not None else "cpu"),
        "ranks": ranks,
        "samples_per_rank": per_rank,
        "features": sum(len(t.features) for t in cfg.model.tables),
        "ids_per_sample": ids // per_rank,
        "torch_threads": torch.get_num_threads(),
        "source_samples_per_s_per_rank": median,
        "source_samples_per_s_windows": rates,
        "source_samples_per_cpu_s": args.windows * args.window * per_rank / cpu_seconds,
        "gpu_budget_samples_per_s": GPU_BUDGET_SAMPLES_PER_S,
        "fraction_of_gpu_budget": median / GPU_BUDGET_SAMPLES_PER_S,
    }


def _measure(trainer, args: argparse.Namespace, steps: int) -> tuple[list[float], float, dict | None]:
    """Train `steps` steps: warm-up, timed windows, then `--profile` profiled steps.

    Returns:
        Samples/s per window, this process's CPU seconds over the windows, and with `--profile` a dict
        of the profile table and mean ms per step of each phase (training thread; device time on CUDA),
        else None.
    """
    device, batch = trainer.device, trainer.settings.global_batch_size
    batches = trainer.batches("train", 0, steps)
    trainer.model.train()

    def step() -> None:
        trainer.step_once(batches)  # the trainer's step: lr schedule, pipeline or not
        trainer.step += 1

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    window_rates = []
    cpu_start = time.process_time()
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.window):
            step()
        sync()
        window_rates.append(args.window * batch / (time.perf_counter() - start))
    cpu_seconds = time.process_time() - cpu_start  # this process, all its threads, over the windows
    if not args.profile:
        return window_rates, cpu_seconds, None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.profile):
            step()
        sync()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    spans = spans_of(prof)

    def mean_ms(per_step: list[dict[str, float]]) -> dict[str, float]:
        return {k: 1e3 * sum(p[k] for p in per_step) / max(1, len(per_step)) for k in PHASES}

    profile = {
        "profile": prof.key_averages().table(sort_by=sort, row_limit=args.profile_rows),
        "phase_ms": mean_ms([phases for phases, _ in step_breakdown(spans)]),
    }
    if device.type == "cuda":
        profile["device_phase_ms"] = mean_ms(device_breakdown(spans))
    return window_rates, cpu_seconds, profile


def run(args: argparse.Namespace, cfg: Config) -> dict:
    """Build the trainer on this process group, measure it, evaluate it; returns the figures as a dict."""
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    from dlrm.trainer.build import build  # imports TorchRec (seconds): only once the config is valid

    steps = args.warmup + args.windows * args.window + args.profile
    cfg.trainer.max_steps = steps
    trainer = build(cfg, world, None)
    device = trainer.device
    loader_speed = source_speed(trainer.source, world.rank, world.world_size)
    if args.cache_batches:
        trainer.source = CachedSource(trainer.source, args.cache_batches)
    window_rates, cpu_seconds, profile = _measure(trainer, args, steps)
    evaluation = trainer.evaluate()

    mine = torch.tensor([peak_rss_mb(), cpu_seconds], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world.world_size)]
    dist.all_gather(gathered, mine, group=trainer.pg)
    timed_samples = args.windows * args.window * cfg.data.global_batch_size
    result = {
        "world_size": world.world_size,
        "device": device.type,
        "global_batch_size": cfg.data.global_batch_size,
        "dense_precision": cfg.trainer.dense_precision,
        "warmup_steps": args.warmup,
        "window_steps": args.window,
        "samples_per_s_median": statistics.median(window_rates),
        "samples_per_s_windows": window_rates,
        "eval_auc": evaluation.get("auc"),
        "eval_logloss": evaluation.get("logloss"),
        "samples_per_cpu_s": timed_samples / sum(float(t[1]) for t in gathered),
        "peak_rss_mb_per_rank": [float(t[0]) for t in gathered],
        "source_samples_per_s_per_rank": loader_speed,
        "cached_batches": args.cache_batches,
    }
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        result["gpu"] = torch.cuda.get_device_name(device)
    if profile is not None:
        result["profile_steps"] = args.profile
        result.update(profile)
    del trainer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m dlrm.bench.training", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--window", type=int, default=20, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=9, help="timed windows")
    parser.add_argument("--profile", type=int, default=0, help="profile this many steps after the windows")
    parser.add_argument("--profile-rows", type=int, default=25, help="rows of the profile table")
    parser.add_argument("--cache-batches", type=int, default=0, help="train on N materialised batches in a loop")
    parser.add_argument("--max-table-rows", type=int, default=0, help="cap every table at N rows (0: as configured)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here (rank 0)")
    parser.add_argument("--source-only", action="store_true", help="time the data source alone (batches, not steps)")
    parser.add_argument("--ranks", type=int, default=0, help="--source-only: world size (0: the topology's)")
    parser.add_argument("--device", default=None, help="--source-only: where synthetic batches are made (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=0, help="--source-only: intra-op threads (0: torch's default)")
    parser.add_argument("-cd", "--config-dir", default=None, help="a directory of config groups, as dlrm.train -cd")
    try:  # a bad option or config is met by every rank alike: rank 0 prints it once, exit 2
        args, overrides = parser.parse_known_args(argv)
        if (
            min(args.warmup, args.profile, args.cache_batches, args.max_table_rows) < 0
            or min(args.window, args.windows) < 1
        ):
            parser.error(
                "--window and --windows must be >= 1; --warmup, --profile, --cache-batches, --max-table-rows >= 0"
            )
        if min(args.ranks, args.threads) < 0:
            parser.error("--ranks and --threads must be >= 0 (0: the topology's ranks; torch's threads)")
        cfg = compose_config(overrides, args.max_table_rows, args.config_dir)
        if args.source_only:
            _report_source(args, source_only(args, cfg))
            return
        result = run(args, cfg)
    except Exception as e:
        exit_on_user_error(e, World.from_env().rank)
        raise
    if World.from_env().is_main:
        if "profile" in result:
            print(f"profile of {result['profile_steps']} steps:\n{result['profile']}")
            for key, what in (("phase_ms", "training thread"), ("device_phase_ms", "device time")):
                if key in result:
                    ms = ", ".join(f"{k} {v:.2f}" for k, v in result[key].items() if v > 0)
                    print(f"phases, ms per step ({what}): {ms}")
        brief = {k: v for k, v in result.items() if k not in ("profile", "samples_per_s_windows")}
        rates = result["samples_per_s_windows"]
        print(
            f"bench: {result['world_size']} rank(s), {result['dense_precision']}: "
            f"{result['samples_per_s_median']:.0f} samples/s median of {len(rates)} windows "
            f"(min {min(rates):.0f}, max {max(rates):.0f}), {result['samples_per_cpu_s']:.0f} per CPU-second; "
            f"peak RSS MiB per rank "
            f"{[round(m) for m in result['peak_rss_mb_per_rank']]}; eval AUC {result['eval_auc']}"
        )
        print("bench: " + json.dumps(brief, sort_keys=True))
        if args.out is not None:
            write_json_atomic(args.out, result)


def _report_source(args: argparse.Namespace, result: dict) -> None:
    rates = result["source_samples_per_s_windows"]
    print(
        f"source: {result['source']} on {result['device']}, {result['samples_per_rank']:,} samples per rank "
        f"({result['ranks']} ranks, {result['ids_per_sample']} ids per sample), {result['torch_threads']} thread(s): "
        f"{result['source_samples_per_s_per_rank']:,.0f} samples/s per rank, median of {len(rates)} windows "
        f"(min {min(rates):,.0f}, max {max(rates):,.0f}), {result['source_samples_per_cpu_s']:,.0f} per CPU-second; "
        f"{result['fraction_of_gpu_budget']:.1%} of the "
        f"{GPU_BUDGET_SAMPLES_PER_S / 1e6:.1f}M samples/s per GPU that MLPerf DLRM-DCNv2 trains at on H100"
    )
    print("source: " + json.dumps({k: v for k, v in result.items() if k != "source_samples_per_s_windows"}))
    if args.out is not None:
        write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
