"""TorchRec's own DLRM example, rebuilt at the bench_cpu shape and timed as `dlrm.bench` times ours.

The baseline of issue #12: TorchRec's example trainer, `examples/dlrm/dlrm_main.py` in
https://github.com/pytorch/torchrec (the "torchrec_dlrm" example; read at commit
4bfbe7603f2ebac31c2c14db56e8d415cfe7b951 and 2180f6dd0d9f34a77efe044b6c1f20be24083fa5, BSD licence).
It is not shipped in the torchrec wheel. This script does not vendor it: it builds the same
training job from the installed torchrec 1.8 with the example's construction, step for step:

- one `EmbeddingBagConfig` per Criteo categorical feature (`t_<feature>`, DEFAULT_CAT_NAMES), an
  `EmbeddingBagCollection` on the meta device, `DLRMTrain(DLRM(...))` from `torchrec.models.dlrm`
  (the example's dense and over arch, the dot interaction, BCE-with-logits loss);
- SGD on the tables by `apply_optimizer_in_backward` (fused into fbgemm's embedding backward); the
  planner (`EmbeddingShardingPlanner` over the launcher's topology, per-rank batch, 5% heuristic
  storage reservation, `collective_plan` with the default sharders) and `DistributedModelParallel`
  with that plan;
- the other parameters (`in_backward_optimizer_filter`) in `KeyedOptimizerWrapper(..., torch.optim.SGD)`,
  combined with DMP's fused optimizer in a `CombinedOptimizer`;
- `TrainPipelineSparseDist(model, optimizer, device)`, fed by a `DataLoader` over torchrec's
  `RandomRecDataset` (one id per feature, uniform over the table, 13 dense features), per-rank
  batch = global batch / world size, `num_workers` as the example's flag (its default is 2).

The example's own loop runs `train_pipeline.progress(it)` until the iterator ends; here the same
call is made for `--warmup` untimed steps, then `--windows` timed windows of `--window` steps
(median window reported, like `dlrm.bench`), then the example's evaluation (`--eval-batches`
batches through the pipeline in eval mode into torchmetrics' AUROC). CPU time counts this process and its DataLoader
workers (from /proc). Where there is a GPU (or with `--device cuda`) each rank trains on its own GPU
over NCCL (the example's `--pin_memory` is `--pin-memory` here) and the peak CUDA memory is reported.
Run under torchrun (see README.md here):

    .venv/bin/python -m dlrm.torchrun --nproc_per_node=2 benchmarks/torchrec_example/run_example.py --out F
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torchmetrics as metrics
from torch.utils.data import DataLoader
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm.io import write_json_atomic

TICKS = os.sysconf("SC_CLK_TCK")


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (this one by default) and all its descendants."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        children: list[int] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # the process ended meanwhile
    return total + sum(tree_cpu_seconds(c) for c in children)


def build(args: argparse.Namespace, device: torch.device, world_size: int):
    """The example's model, optimizers and pipeline, and its train iterator."""
    tables = [
        EmbeddingBagConfig(
            name=f"t_{feature}",
            embedding_dim=args.embedding_dim,
            num_embeddings=args.num_embeddings,
            feature_names=[feature],
        )
        for feature in DEFAULT_CAT_NAMES
    ]
    train_model = DLRMTrain(
        DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
            dense_in_features=len(DEFAULT_INT_NAMES),
            dense_arch_layer_sizes=_sizes(args.dense_arch_layer_sizes),
            over_arch_layer_sizes=_sizes(args.over_arch_layer_sizes),
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(torch.optim.SGD, train_model.model.sparse_arch.parameters(), {"lr": args.learning_rate})
    planner = EmbeddingShardingPlanner(
        topology=Topology(local_world_size=get_local_size(), world_size=world_size, compute_device=device.type),
        batch_size=args.global_batch_size // world_size,
        storage_reservation=HeuristicalStorageReservation(percentage=0.05),
    )
    plan = planner.collective_plan(train_model, get_default_sharders(), dist.GroupMember.WORLD)
    model = DistributedModelParallel(module=train_model, device=device, plan=plan)
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.SGD(params, lr=args.learning_rate),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    loader = DataLoader(
        RandomRecDataset(
            keys=DEFAULT_CAT_NAMES,
            batch_size=args.global_batch_size // world_size,
            hash_size=args.num_embeddings,
            ids_per_feature=1,
            num_dense=len(DEFAULT_INT_NAMES),
        ),
        batch_size=None,
        batch_sampler=None,
        pin_memory=args.pin_memory,
        num_workers=args.num_workers,
    )
    return model, pipeline, iter(loader)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--global-batch-size", type=int, default=2048)
    p.add_argument("--num-embeddings", type=int, default=100_000)
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--dense-arch-layer-sizes", default="512,256,64,16")
    p.add_argument("--over-arch-layer-sizes", default="512,256,1")
    p.add_argument("--learning-rate", type=float, default=0.1, help="bench_cpu's SGD lr (the example's default: 15)")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank (the example's default)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--windows", type=int, default=9)
    p.add_argument("--eval-batches", type=int, default=10, help="the example's default limit_val_batches")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if there is one (NCCL)")
    p.add_argument("--pin-memory", action="store_true", help="the example's --pin_memory (pinned batches)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, pipeline, it = build(args, device, world_size)
    model.train()
    for _ in range(args.warmup):
        pipeline.progress(it)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # as dlrm.bench: the peak of the timed steps
    rates = []
    cpu_start = tree_cpu_seconds()
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.window):
            pipeline.progress(it)
        sync()
        rates.append(args.window * args.global_batch_size / (time.perf_counter() - start))
    cpu_seconds = tree_cpu_seconds() - cpu_start
    # The example's evaluation: the pipeline in eval mode (forward only), AUROC from torchmetrics
    # (on random labels it is ~0.5; run for the example's code path and memory, not the value).
    model.eval()
    auroc = metrics.AUROC(task="binary").to(device)
    for _ in range(args.eval_batches):
        _, logits, labels = pipeline.progress(it)  # DLRMTrain: (loss, (loss, logits, labels)); the 2nd
        auroc(logits, labels.int())
    eval_auroc = auroc.compute().item()

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    mine = torch.tensor([peak_rss_mb, cpu_seconds], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    result = {
        "program": "torchrec example (examples/dlrm/dlrm_main.py construction)",
        "world_size": world_size,
        "global_batch_size": args.global_batch_size,
        "num_workers": args.num_workers,
        "warmup_steps": args.warmup,
        "window_steps": args.window,
        "samples_per_s_median": statistics.median(rates),
        "samples_per_s_windows": rates,
        "samples_per_cpu_s": args.windows * args.window * args.global_batch_size / sum(float(t[1]) for t in gathered),
        "peak_rss_mb_per_rank": [float(t[0]) for t in gathered],
        "eval_auroc_random_labels": eval_auroc,
        "device": device.type,
    }
    if device.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        result["gpu"] = torch.cuda.get_device_name(device)
    if rank == 0:
        print(
            f"torchrec example: {world_size} rank(s): {result['samples_per_s_median']:.0f} samples/s median of "
            f"{len(rates)} windows (min {min(rates):.0f}, max {max(rates):.0f}), "
            f"{result['samples_per_cpu_s']:.0f} per CPU-second; peak RSS MiB per rank "
            f"{[round(m) for m in result['peak_rss_mb_per_rank']]}"
        )
        print("bench: " + json.dumps({k: v for k, v in result.items() if k != "samples_per_s_windows"}))
        if args.out is not None:
            write_json_atomic(args.out, result)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
