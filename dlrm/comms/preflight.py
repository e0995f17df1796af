"""Preflight: do this cluster's collectives reach the bandwidth its topology config promises?

Run it under torchrun on every node before the first training (NCCL on GPUs, Gloo on CPUs)::

    torchrun --nnodes=2 --nproc_per_node=8 ... -m dlrm.comms.preflight --topology dgx_h100_multinode

It times allreduce and alltoall at one large size (--bytes) in each scope the topology has and compares
each busbw with the cost model's prediction from the same topology. Rank 0 prints the facts that decide
collective speed, one line per (collective, scope) and a verdict: PASS when each reaches --min-fraction
of its expectation. It writes preflight.json into --out. Exit status: 0 PASS, 3 FAIL, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from dlrm.common.errors import ArgumentParser, run_rank_command
from dlrm.common.io import output_dir_problem, write_json_atomic
from dlrm.comms.costmodel import CommsError, Link, backend_of, busbw_factor, level_time, world_time
from dlrm.comms.measure import Request, group_layout, measure, parse_size
from dlrm.config import TopologyConfig

COLLECTIVES = ("allreduce", "alltoall")  # the dense gradients' and the embeddings' collectives
FABRIC_VARS = (  # what launch/env/*.sh sets and a cluster team checks first
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_P2P_DISABLE",
    "NCCL_ALGO",
    "GLOO_SOCKET_IFNAME",
)
ADVICE = {
    "intra": "the node's GPU links (nvidia-smi topo -m: NVLink/NVSwitch, not PCIe) or, on CPU, the host",
    "inter": "the RDMA devices and GPUDirect (NCCL_IB_HCA, NCCL_NET_GDR_LEVEL, ibstat), the NIC-to-GPU "
    "mapping, and the fabric env file (launch/env/nccl_ib.sh)",
    "world": "the slower of the two levels above",
}


def expected_busbw_GBps(topo: TopologyConfig, ranks_per_node: int, collective: str, scope: str, nbytes: int) -> float:
    """busbw (GB/s) the cost model predicts for one scope's groups.

    Args:
        topo: the topology config.
        ranks_per_node: ranks per node of this launch.
        collective: 'allreduce' or 'alltoall'.
        scope: 'world', 'intra' or 'inter'.
        nbytes: the message size.
    """
    intra, inter = Link.from_config(topo.intra_node, collective), Link.from_config(topo.inter_node, collective)
    g, n, backend = ranks_per_node, topo.nodes, backend_of(topo)
    if scope == "intra":
        p, seconds = g, level_time(collective, intra, g, nbytes, backend)
    elif scope == "inter":
        p, seconds = n, level_time(collective, inter, n, nbytes, backend)
    else:
        p = n * g
        seconds = (
            level_time(collective, intra, g, nbytes, backend)
            if n == 1
            else world_time(collective, intra, inter, n, g, nbytes, backend)
        )
    return nbytes / seconds * busbw_factor(collective, p) / 1e9


def verdict(rows: list[dict], min_fraction: float) -> tuple[bool, list[str]]:
    """(passed, lines): one line per row (measured vs expected), then the verdict and, on FAIL, what to check."""
    lines, slow = [], []
    for r in rows:
        ok = r["fraction"] >= min_fraction
        lines.append(
            f"  {r['collective']:<9} {r['scope']:<5} {r['group_size']:>3} ranks: {r['busbw_GBps']:8.2f} GB/s busbw, "
            f"expected {r['expected_busbw_GBps']:8.2f} ({100 * r['fraction']:5.1f}%) {'ok' if ok else 'SLOW'}"
        )
        if not ok:
            slow.append(r)
    if not slow:
        lines.append(f"PASS: every collective reached at least {min_fraction:.0%} of the topology's bandwidth")
        return True, lines
    for scope in dict.fromkeys(r["scope"] for r in slow):
        worst = min((r for r in slow if r["scope"] == scope), key=lambda r: r["fraction"])
        lines.append(
            f"FAIL: {scope} {worst['collective']} reached {100 * worst['fraction']:.0f}% of the "
            f"{worst['expected_busbw_GBps']:.2f} GB/s the topology says (needed {min_fraction:.0%}); check "
            f"{ADVICE[scope]}, or correct the topology config's figures"
        )
    return False, lines


def facts(backend: str, device: str) -> dict:
    """What decides collective speed here: backend, NCCL version, GPU count, the fabric variables."""
    import torch

    out = {"backend": backend, "device": device, "torch": torch.__version__}
    if device == "cuda":
        import torch.cuda.nccl as nccl

        out["nccl"] = ".".join(map(str, nccl.version()))
        out["gpus_on_this_node"] = torch.cuda.device_count()
    out["env"] = {v: os.environ[v] for v in FABRIC_VARS if v in os.environ}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m dlrm.comms.preflight", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--topology", required=True, help="name in conf/topology/ or a YAML path: what to expect")
    ap.add_argument("--bytes", default="64M", help="message size per collective (nccl-tests' size), e.g. 64M")
    ap.add_argument("--min-fraction", type=float, default=0.7, help="measured/expected busbw needed to pass")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="outputs/preflight", help="directory for preflight.json (rank 0)")
    args = ap.parse_args(argv)
    if not 0 < args.min_fraction <= 1:
        raise CommsError(f"--min-fraction={args.min_fraction}: give a fraction in (0, 1], e.g. 0.7")
    if args.warmup < 0 or args.iters < 1:
        raise CommsError(f"--warmup={args.warmup} --iters={args.iters}: pass warmup >= 0 and iters >= 1")
    problem = output_dir_problem(args.out, "--out")
    if problem:
        raise CommsError(problem)
    return args


def main(argv: Sequence[str] | None = None) -> bool | None:
    """Run the preflight in this torchrun worker; rank 0 returns whether it passed, the others None."""
    import torch.distributed as dist

    from dlrm.comms import load_topology
    from dlrm.distributed.topology import backend_for, device_for, init_distributed
    from dlrm.distributed.world import World

    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise CommsError("WORLD_SIZE/RANK are not set: run under torchrun on every node (see --help)")
    world = World.from_env()
    topo = load_topology(args.topology)
    rpn = topo.ranks_per_node or world.local_world_size
    if rpn != world.local_world_size or topo.nodes * rpn != world.world_size:
        raise CommsError(
            f"topology {topo.name} says {topo.nodes} node(s) x {rpn} ranks but torchrun started "
            f"WORLD_SIZE={world.world_size}, LOCAL_WORLD_SIZE={world.local_world_size}; launch with "
            f"--nnodes={topo.nodes} --nproc_per_node={rpn} or pick the topology of this cluster"
        )
    nbytes = parse_size(args.bytes)
    unit = 4 * world.world_size  # float32 elements, split evenly by the alltoall of every scope
    if nbytes % unit:
        raise CommsError(
            f"--bytes {args.bytes}: give a multiple of {unit} (4-byte elements x {world.world_size} ranks)"
        )
    device = device_for(topo, world)
    ours = not dist.is_initialized()  # a caller's group (tests) is left to the caller
    init_distributed(topo, world)
    layout = group_layout(world.world_size, topo.nodes, rpn)
    scopes = [s for s in ("intra", "inter", "world") if len(layout[s][0]) > 1]
    if topo.nodes == 1:
        scopes = [s for s in scopes if s != "world"]  # the node's group is the world
    try:
        request = Request(list(COLLECTIVES), scopes, [nbytes], topo.nodes, rpn, topo)
        rows = measure(request, world.rank, world.world_size, device, args.warmup, args.iters)  # as dlrm.comms.measure
        for row in rows:
            row["expected_busbw_GBps"] = expected_busbw_GBps(topo, rpn, row["collective"], row["scope"], nbytes)
            row["fraction"] = row["busbw_GBps"] / row["expected_busbw_GBps"]
        if not world.is_main:
            return None
        passed, lines = verdict(rows, args.min_fraction)
        about = facts(backend_for(topo), device.type)
        print(
            f"preflight: {topo.name}, {topo.nodes} node(s) x {rpn} ranks, {about['backend']} on {about['device']}"
            + (f", NCCL {about['nccl']}" if "nccl" in about else "")
            + f"; {args.bytes} messages; fabric env: {about['env'] or 'none set'}"
        )
        print("\n".join(lines), flush=True)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report = {"topology": topo.name, "bytes": nbytes, "min_fraction": args.min_fraction, **about}
        write_json_atomic(out / "preflight.json", {**report, "passed": passed, "results": rows})
        return passed
    finally:
        if ours:
            dist.destroy_process_group()


if __name__ == "__main__":
    ok = run_rank_command(main)
    raise SystemExit(0 if ok in (True, None) else 3)
