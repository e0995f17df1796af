"""Collective benchmark: latency, algbw and busbw of allreduce, alltoall, reduce-scatter and allgather.

Run under torchrun (Gloo on CPU, NCCL on GPU); rank 0 prints a table and writes bench.json, bench.csv
and bench.png into --out, atomically::

    torchrun --nproc_per_node=2 -m dlrm.comms.measure --min-bytes 1K --max-bytes 64M --out outputs/comms

Message size n follows nccl-tests. Per size: median and p95 latency over --iters timed iterations, each
the slowest rank's time after a barrier; algbw = n / median; busbw = algbw x 2(p-1)/p for allreduce,
x (p-1)/p for the others. `alltoall_uneven` sends a table-wise sharded embedding's uneven splits
(rank i of p owns 2(i+1)/(p+1) of the columns). With --topology and --scopes intra,inter the
collectives also run inside each node's group and across nodes, all groups at once.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dlrm.common.errors import ArgumentParser, run_rank_command
from dlrm.common.io import figure_png, output_dir_problem, write_atomic
from dlrm.comms.costmodel import CommsError, busbw_factor
from dlrm.config import TopologyConfig

COLLECTIVES = ("allreduce", "alltoall", "alltoall_uneven", "reduce_scatter", "allgather")
SCOPES = ("world", "intra", "inter")
SCHEMA = "dlrm.comms.measure/1"
FIELDS = (
    "collective",
    "scope",
    "group_size",
    "bytes",
    "median_us",
    "p95_us",
    "algbw_GBps",
    "busbw_GBps",
    "busbw_factor",
)
ELEMENT_BYTES = 4  # float32
_UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes from '4096', '1K', '64M', '1GiB' (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise CommsError(f"message size {text!r} is not understood; write e.g. 4096, 1K, 64M or 1GiB")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes min_bytes, 2 min_bytes, 4 min_bytes, ... <= max_bytes."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise CommsError(
            f"empty sweep: --min-bytes={min_bytes} --max-bytes={max_bytes}; pass 0 < min-bytes <= max-bytes"
        )
    sizes = []
    while min_bytes <= max_bytes:
        sizes.append(min_bytes)
        min_bytes *= 2
    return sizes


def base_collective(collective: str) -> str:
    """The collective whose busbw factor and cost formula apply ('alltoall_uneven' -> 'alltoall')."""
    return "alltoall" if collective == "alltoall_uneven" else collective


def check_request(collectives: Sequence[str], sizes: Sequence[int], group_sizes: dict[str, int]) -> None:
    """Raise CommsError, naming the value and the fix, for an unknown collective or an unusable size."""
    if not collectives:
        raise CommsError(f"no collective selected; pass --collectives with some of {','.join(COLLECTIVES)}")
    for c in collectives:
        if c not in COLLECTIVES:
            raise CommsError(f"unknown collective {c!r}: choose from {','.join(COLLECTIVES)}")
    if not sizes:
        raise CommsError("empty sweep: no message size; pass --min-bytes <= --max-bytes")
    for scope, p in group_sizes.items():
        for c in collectives:
            unit = ELEMENT_BYTES * (1 if c == "allreduce" else p)
            for n in sizes:
                if n % unit:
                    raise CommsError(
                        f"message size {n} bytes cannot be split for {c} over the {p} ranks of scope '{scope}': "
                        f"it must be a multiple of {unit} ({p} ranks x {ELEMENT_BYTES}-byte elements); "
                        f"choose --min-bytes as a multiple of {unit} (e.g. a power of two with a power-of-two group)"
                    )


def group_layout(world_size: int, nodes: int, ranks_per_node: int) -> dict[str, list[list[int]]]:
    """Rank lists per scope: world, intra (one per node), inter (one per local rank index)."""
    return {
        "world": [list(range(world_size))],
        "intra": [[n * ranks_per_node + i for i in range(ranks_per_node)] for n in range(nodes)],
        "inter": [[n * ranks_per_node + i for n in range(nodes)] for i in range(ranks_per_node)],
    }


def uneven_splits(nelems: int, p: int, i: int) -> tuple:
    """(input_splits, output_splits) in elements for rank i of p, rank j sending c_j to everyone."""
    base = nelems // p
    counts = [max(1, round(base * 2 * (j + 1) / (p + 1))) for j in range(p)]
    return [counts[i]] * p, counts


def make_op(collective: str, nbytes: int, group, ranks: list[int], rank: int, device) -> Callable[[], object]:
    """A closure that runs one `collective` of `nbytes` (nccl-tests' size) on `group` (its global `ranks`)
    from this process's global `rank`, float32 buffers on `device`."""
    import torch
    import torch.distributed as dist

    p, n = len(ranks), nbytes // ELEMENT_BYTES

    def buffers(n_in: int, n_out: int):
        """An input of ones and an output, float32, of n_in and n_out elements."""
        f32 = torch.float32
        return torch.ones(n_in, dtype=f32, device=device), torch.empty(n_out, dtype=f32, device=device)

    if collective == "allreduce":
        x, _ = buffers(n, 0)
        return lambda: dist.all_reduce(x, group=group)
    if collective == "alltoall":
        x, y = buffers(n, n)
        return lambda: dist.all_to_all_single(y, x, group=group)
    if collective == "alltoall_uneven":
        ins, outs = uneven_splits(n, p, ranks.index(rank))
        x, y = buffers(sum(ins), sum(outs))
        return lambda: dist.all_to_all_single(y, x, outs, ins, group=group)
    # torch 2.13 names the single-tensor reduce-scatter and allgather reduce_scatter_single and
    # all_gather_single (the old names warn, deprecated); torch 2.11 (the GPU image's) has only the old ones.
    if collective == "reduce_scatter":
        x, y = buffers(n, n // p)
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: reduce_scatter(y, x, group=group)
    if collective == "allgather":
        x, y = buffers(n // p, n)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: all_gather(y, x, group=group)
    raise CommsError(f"unknown collective {collective!r}: choose from {','.join(COLLECTIVES)}")


def time_op(op: Callable[[], object], group, warmup: int, iters: int, device) -> list[float]:
    """Seconds of each timed iteration on this rank (barrier, then op, synchronising CUDA)."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        op()
    sync()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def summarize(collective: str, scope: str, p: int, nbytes: int, times_s: Sequence[float]) -> dict:
    """One result row: the inputs, median and p95 latency (us), algbw and busbw (GB/s = 1e9 bytes/s)."""
    import numpy as np

    median = float(statistics.median(times_s))
    factor = busbw_factor(base_collective(collective), p)
    algbw = nbytes / median / 1e9
    return {
        "collective": collective,
        "scope": scope,
        "group_size": p,
        "bytes": nbytes,
        "median_us": median * 1e6,
        "p95_us": float(np.percentile(times_s, 95)) * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * factor,
        "busbw_factor": factor,
    }


def write_outputs(out_dir: Path, meta: dict, rows: list[dict]) -> list[Path]:
    """Write bench.json, bench.csv and bench.png (busbw vs size, one line per collective and scope)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "bench.json", out_dir / "bench.csv", out_dir / "bench.png"]
    write_atomic(paths[0], json.dumps({**meta, "results": rows}, indent=1).encode())
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(paths[1], buf.getvalue().encode())
    write_atomic(paths[2], plot_png(rows, f"{meta['backend']}, {meta['world_size']} ranks"))
    return paths


def plot_png(rows: list[dict], title: str) -> bytes:
    """PNG bytes: busbw (GB/s) vs message size, one line per (collective, scope)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in dict.fromkeys((r["collective"], r["scope"]) for r in rows):
        sel = [r for r in rows if (r["collective"], r["scope"]) == key]
        ax.plot(
            [r["bytes"] for r in sel],
            [r["busbw_GBps"] for r in sel],
            marker="o",
            ms=3,
            label=f"{key[0]} ({key[1]}, p={sel[0]['group_size']})",
        )
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return figure_png(fig)


def format_table(rows: list[dict]) -> str:
    """The result rows as a fixed-width text table."""
    lines = [
        f"{'collective':16} {'scope':6} {'p':>2} {'bytes':>10} {'median_us':>10} {'p95_us':>10} "
        f"{'algbw_GB/s':>10} {'busbw_GB/s':>10}"
    ]
    for r in rows:
        lines.append(
            f"{r['collective']:16} {r['scope']:6} {r['group_size']:>2} {r['bytes']:>10} "
            f"{r['median_us']:>10.1f} {r['p95_us']:>10.1f} {r['algbw_GBps']:>10.3f} {r['busbw_GBps']:>10.3f}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m dlrm.comms.measure", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--collectives", default=",".join(COLLECTIVES), help=f"comma list of {','.join(COLLECTIVES)}")
    ap.add_argument("--min-bytes", default="1K", help="smallest message size, e.g. 1K")
    ap.add_argument("--max-bytes", default="64M", help="largest message size, e.g. 64M (doubling from min)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--topology", default=None, help="name in conf/topology/ or YAML path (nodes, ranks per node)")
    ap.add_argument("--scopes", default="world", help="comma list of world,intra,inter")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--out", default="outputs/comms_bench", help="directory for bench.json/csv/png (rank 0)")
    return ap.parse_args(argv)


@dataclass(frozen=True)
class Request:
    """What to measure, checked against the launcher: collectives x scopes x message sizes."""

    collectives: list[str]
    scopes: list[str]
    sizes: list[int]
    nodes: int
    ranks_per_node: int
    topology: TopologyConfig | None


def check_args(args: argparse.Namespace, world_size: int, local_world_size: int) -> Request:
    """The request these arguments make on this launcher's world; CommsError names a bad value and the fix."""
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    for s in scopes:
        if s not in SCOPES:
            raise CommsError(f"unknown scope {s!r} in --scopes; choose from {','.join(SCOPES)}")
    if args.warmup < 0 or args.iters < 1:
        raise CommsError(f"--warmup={args.warmup} --iters={args.iters}: pass warmup >= 0 and iters >= 1")
    sizes = sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes))
    topo = None
    if args.topology:
        from dlrm.comms import load_topology

        topo = load_topology(args.topology)
    rpn = (topo.ranks_per_node if topo else None) or local_world_size
    nodes = topo.nodes if topo else world_size // rpn
    if rpn != local_world_size or nodes * rpn != world_size:
        raise CommsError(
            f"topology {topo.name if topo else '(none)'} says {nodes} node(s) x {rpn} ranks but torchrun started "
            f"WORLD_SIZE={world_size}, LOCAL_WORLD_SIZE={local_world_size}; launch with --nnodes={nodes} "
            f"--nproc_per_node={rpn} or pick a matching --topology"
        )
    layout = group_layout(world_size, nodes, rpn)
    group_sizes = {s: len(layout[s][0]) for s in scopes}
    for s, p in group_sizes.items():
        if p < 2:
            raise CommsError(f"scope '{s}' has groups of {p} rank on {nodes} node(s) x {rpn}; drop it from --scopes")
    check_request(collectives, sizes, group_sizes)
    return Request(collectives, scopes, sizes, nodes, rpn, topo)


def measure(req: Request, rank: int, world_size: int, device, warmup: int, iters: int, rounds: int = 1) -> list[dict]:
    """Time every collective of `req` in every scope; all ranks call it.

    With rounds > 1 the sweep runs `rounds` times, each in another order (the same on every rank), so a
    burst of load spreads over the sizes instead of bending the curve where it hit.

    Returns:
        One summary row per (collective, scope, size), each over its iterations of all rounds.
    """
    import random

    import torch
    import torch.distributed as dist

    layout = group_layout(world_size, req.nodes, req.ranks_per_node)
    groups = {}
    for s in req.scopes:
        for ranks in layout[s]:  # every rank creates every group, in the same order
            g = None if s == "world" else dist.new_group(ranks)
            if rank in ranks:
                groups[s] = (g, ranks)
    cases = [(s, c, n) for s in req.scopes for c in req.collectives for n in req.sizes]
    times: dict[tuple, list[float]] = {case: [] for case in cases}
    order = list(cases)
    for r in range(rounds):
        if r:
            random.Random(r).shuffle(order)  # seeded: the same order on every rank
        for case in order:
            s, c, n = case
            group, ranks = groups[s]
            op = make_op(c, n, group, ranks, rank, device)
            got = torch.tensor(time_op(op, group, warmup if r == 0 else 1, iters, device), dtype=torch.float64)
            got = got.to(device)
            dist.all_reduce(got, op=dist.ReduceOp.MAX)  # the slowest rank sets each iteration
            times[case] += got.cpu().tolist()
    return [summarize(c, s, len(groups[s][1]), n, times[(s, c, n)]) for s, c, n in cases]


def main(argv: Sequence[str] | None = None) -> list[dict] | None:
    """Run the benchmark in this torchrun worker; returns the result rows on rank 0, None elsewhere."""
    from dlrm.distributed.world import World

    args = parse_args(argv)  # the arguments are checked before torch is imported (seconds)
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise CommsError(
            "WORLD_SIZE/RANK are not set: run under torchrun, e.g. torchrun --nproc_per_node=2 -m dlrm.comms.measure"
        )
    world = World.from_env()
    req = check_args(args, world.world_size, world.local_world_size)
    problem = output_dir_problem(args.out, "--out")  # before the benchmark, not after it
    if problem:
        raise CommsError(problem)

    import torch
    import torch.distributed as dist

    from dlrm.distributed.topology import backend_for, device_for, init_distributed

    topo = req.topology
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available() and (topo is None or topo.device == "cuda")
    )
    # The trainer's device, backend and process group for this machine: NCCL on cuda, Gloo on cpu.
    machine = replace(topo or TopologyConfig(name="bench"), device="cuda" if use_cuda else "cpu", backend="auto")
    device = device_for(machine, world)
    ours = not dist.is_initialized()  # a caller's group (tests) is left to the caller
    init_distributed(machine, world)
    try:
        rows = measure(req, world.rank, world.world_size, device, args.warmup, args.iters)
        if not world.is_main:
            return None
        meta = {
            "schema": SCHEMA,
            "backend": backend_for(machine),
            "device": device.type,
            "world_size": world.world_size,
            "nodes": req.nodes,
            "ranks_per_node": req.ranks_per_node,
            "topology": topo.name if topo else None,
            "intra_fabric": topo.intra_node.fabric if topo else "switch",
            "inter_fabric": topo.inter_node.fabric if topo else "switch",
            "dtype": "float32",
            "warmup": args.warmup,
            "iters": args.iters,
        }
        paths = write_outputs(Path(args.out), meta, rows)
        print(format_table(rows))
        print("wrote " + ", ".join(str(p) for p in paths), flush=True)
        return rows
    finally:
        if ours:
            dist.destroy_process_group()


if __name__ == "__main__":
    run_rank_command(main, CommsError)
