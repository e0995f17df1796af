"""Benchmark of the checkpointer's save and load against plain `dcp.save` / `dcp.load`.

    python -m dlrm.bench.checkpoint_save                  # 2 ranks, 2 GB of tables in all, 2 rounds
    python -m dlrm.bench.checkpoint_save --gb 0.2 --rounds 1   # a quick run

Each rank holds `--gb`/`--ranks` GB of float32 rows as `--tables` tables that are views of one buffer
(as fused tables are), under names of its own. Each round runs every variant in fresh Gloo processes,
the order reversed in even rounds:
- `dcp`: `dcp.save` with torch's default writer, then `dcp.load` into zeroed tables;
- `ours`: `Checkpointer.save`, then `Checkpointer.load`;
- `ours_async`: `Checkpointer.save(..., background=True)`, `wait`, then the same load.
Loads are checked to give back the saved rows exactly. Ranks set malloc as the trainer does and use
one intra-op thread. Prints per round and variant the save's and load's wall time, the training
stall, and the busiest rank's peak RSS during the save; then medians, `ours`' ratios to `dcp`, and
`ours_async`'s stall against `ours`' save. `--threads N` sets the checkpointer's writer threads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

VARIANTS = ("dcp", "ours", "ours_async")


def rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_state(rank: int, gb: float, ranks: int, tables: int) -> dict:
    """Rank `rank`'s share of `gb` GB of float32 rows over `ranks` ranks, as `tables` views of one buffer.

    Returns:
        {"model": {name: rows [R, 64] float32}}, names unique to this rank.
    """
    dim = 64
    rows = max(tables, int(gb * 2**30 / ranks / 4 / dim)) // tables * tables
    buffer = torch.rand(rows, dim)  # one buffer, each table a view of it, as fused tables are: DCP clones views
    per = rows // tables
    return {"model": {f"rank{rank}.table{t}.weight": buffer[t * per : (t + 1) * per] for t in range(tables)}}


def rank_main(rank: int, args: argparse.Namespace, variant: str, port: int, where: str) -> None:
    """One rank of one run: save and load with `variant`, check the rows, write where/rank{rank}.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    from dlrm.checkpoint import Checkpointer, checkpointer
    from dlrm.trainer.malloc import keep_freed_memory

    keep_freed_memory()  # malloc as in a training process (the trainer sets it), for both variants
    torch.set_num_threads(1)  # as torchrun sets for several ranks per machine (OMP_NUM_THREADS=1)

    if args.threads and hasattr(checkpointer, "WRITER_THREADS"):
        checkpointer.WRITER_THREADS = args.threads
    state = make_state(rank, args.gb, args.ranks, args.tables)
    pg = dist.group.WORLD
    ours = Checkpointer(Path(where), 2, pg, rank == 0, background=variant == "ours_async")  # type: ignore[arg-type]
    before = rss_mib()
    dist.barrier()
    start = time.perf_counter()
    if variant == "dcp":
        dcp.save(state, checkpoint_id=Path(where) / "plain", process_group=pg)
    else:
        saved = ours.save(1, state, {}, background=variant == "ours_async")
    stall = time.perf_counter() - start  # what training waits for
    ours.wait()
    dist.barrier()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    expected = {name: t.clone() for name, t in state["model"].items()}
    for t in state["model"].values():
        t.zero_()
    dist.barrier()
    start = time.perf_counter()
    if variant == "dcp":
        dcp.load(state, checkpoint_id=Path(where) / "plain", process_group=pg)
    else:
        ours.load(saved, state, {"model": {}})
    dist.barrier()
    load_s = time.perf_counter() - start
    assert all(torch.equal(state["model"][name], t) for name, t in expected.items()), "the load lost rows"
    result = {"s": seconds, "stall_s": stall, "load_s": load_s, "peak": peak, "before": before}
    Path(where, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def one_run(args: argparse.Namespace, variant: str) -> dict:
    """Run `variant` once on fresh ranks; rank 0's times with the busiest rank's peak RSS and the files written."""
    where = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, args=(args, variant, port, where), nprocs=args.ranks)  # type: ignore[arg-type]
        ranks = [json.loads(Path(where, f"rank{r}.json").read_text()) for r in range(args.ranks)]
        files = sum(1 for p in Path(where).rglob("*") if p.is_file()) - args.ranks
        busiest = max(ranks, key=lambda r: r["peak"])
        return {**ranks[0], "peak": busiest["peak"], "before": busiest["before"], "files": files}
    finally:
        shutil.rmtree(where, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0, help="GB of tables over all ranks (default 2)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tables", type=int, default=64, help="tables (DCP items, files of ours) per rank")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="the checkpointer's writer threads (default: its own)")
    ap.add_argument("--dir", default=None, help="where to write (default: the system's temporary directory)")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for n in range(args.rounds):
        for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:
            run = one_run(args, variant)
            runs[variant].append(run)
            print(
                f"round {n + 1} {variant:10}: save {run['s']:6.2f} s (stall {run['stall_s']:6.2f} s), "
                f"load {run['load_s']:6.2f} s, "
                f"peak RSS {run['peak']:7.0f} MiB "
                f"(before the save {run['before']:.0f}), {run['files']} files",
                flush=True,
            )
    print(f"medians over {args.rounds} rounds ({args.gb} GB, {args.ranks} ranks, {args.tables} tables per rank):")
    for variant in VARIANTS:
        rs = runs[variant]
        print(
            f"  {variant:10}: save {statistics.median(r['s'] for r in rs):6.2f} s, "
            f"stall {statistics.median(r['stall_s'] for r in rs):6.2f} s, "
            f"load {statistics.median(r['load_s'] for r in rs):6.2f} s, "
            f"peak RSS {statistics.median(r['peak'] for r in rs):7.0f} MiB"
        )
    time_ratio = [o["s"] / d["s"] for o, d in zip(runs["ours"], runs["dcp"], strict=True)]
    load_ratio = [o["load_s"] / d["load_s"] for o, d in zip(runs["ours"], runs["dcp"], strict=True)]
    rss_ratio = [o["peak"] / d["peak"] for o, d in zip(runs["ours"], runs["dcp"], strict=True)]
    print(
        f"  ours / dcp: save {statistics.median(time_ratio):.2f}x ({min(time_ratio):.2f}-{max(time_ratio):.2f}), "
        f"load {statistics.median(load_ratio):.2f}x ({min(load_ratio):.2f}-{max(load_ratio):.2f}), "
        f"peak RSS {statistics.median(rss_ratio):.2f}x ({min(rss_ratio):.2f}-{max(rss_ratio):.2f})"
    )
    stall = [a["stall_s"] / o["stall_s"] for a, o in zip(runs["ours_async"], runs["ours"], strict=True)]
    rss = [a["peak"] / o["peak"] for a, o in zip(runs["ours_async"], runs["ours"], strict=True)]
    print(
        f"  ours_async / ours: training stall {statistics.median(stall):.2f}x ({min(stall):.2f}-{max(stall):.2f}), "
        f"peak RSS {statistics.median(rss):.2f}x ({min(rss):.2f}-{max(rss):.2f})"
    )


if __name__ == "__main__":
    main()
