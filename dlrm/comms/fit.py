# long file: fitting is one concept: the least squares, each scope's link, and the topology file the command writes
"""Fit a topology's links to measured collectives and write it as a topology file.

Run under torchrun with the ranks of the topology to measure (Gloo on CPU, NCCL on GPU)::

    torchrun --standalone --nproc_per_node=2 -m dlrm.comms.fit --topology cpu --name cpu

It times --collectives over a doubling sweep of message sizes in each scope the topology has (one node:
the intra-node link; several: intra- and inter-node). Per scope one least-squares fit of alpha and B over
every collective's points gives the link's latency_us and bandwidth_GBps. Where one collective's own fit
misses by --material less than the joint fit, each collective's own figures are written under the
link's `collectives:`. Rank 0 writes conf/topology/NAME.yaml (or --out) atomically, the fits' errors,
date and command in comments. A fit needs at least MIN_SIZES message sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dlrm.common.errors import ArgumentParser, run_rank_command
from dlrm.common.io import write_atomic
from dlrm.comms.costmodel import CommsError, backend_of, check_backend, check_collective, coefficients
from dlrm.comms.measure import Request, check_request, format_table, group_layout, measure, parse_size, sweep_sizes
from dlrm.config import CollectiveLinkConfig, LinkConfig, TopologyConfig
from dlrm.config.topology import UPLINK_GBIT_ENV

MIN_SIZES = 4  # distinct message sizes per fit: two unknowns, and two more to see the misfit
COLLECTIVES = ("allreduce", "alltoall", "reduce_scatter", "allgather")
DEFAULT_COLLECTIVES = ("allreduce", "alltoall")  # what the trainer's default plans run
LINK_OF_SCOPE = {"world": "intra_node", "intra": "intra_node", "inter": "inter_node"}


@dataclass(frozen=True)
class Fit:
    """alpha (s) and B (bytes/s) fitted to measured times; rel_rms and max_rel: the relative misfit's
    root mean square and largest absolute value over the points.

    B is inf when the sizes were too small for the bandwidth term to show above rounding and noise
    (sweep larger sizes).
    """

    alpha_s: float
    bandwidth_Bps: float
    rel_rms: float
    max_rel: float = 0.0


def level_coefficients(collective: str, fabric: str, p: int, backend: str = "nccl") -> tuple[float, float]:
    """(steps, factor) of one collective among p ranks on one level as `backend` runs it (`level_time`)."""
    check_collective(collective)
    check_backend(backend)
    if backend == "gloo" and collective != "alltoall":
        return coefficients("allreduce" if collective == "reduce_scatter" else collective, "ring", p)
    return coefficients(collective, fabric, p)


def fit_alpha_beta(
    collective: str,
    fabric: str,
    p: int,
    sizes: Sequence[float],
    times_s: Sequence[float],
    backend: str = "nccl",
    min_sizes: int = 2,
) -> Fit:
    """Least-squares alpha and B of one collective from (size, time) pairs, in relative error.

    Solves t_i = steps * alpha + factor * n_i / B with the collective's (steps, factor) as `backend` runs
    it, each row divided by t_i so that small messages count as much as large ones.

    Args:
        collective, fabric, p, backend: the collective, how its level is wired, its ranks (p >= 2).
        sizes: message sizes in bytes (nccl-tests' definition).
        times_s: one measured time per size, in seconds.
        min_sizes: distinct sizes needed (at least two).

    Returns:
        The `Fit`.

    Raises:
        CommsError: p < 2, sizes and times of other lengths, too few sizes, or a time that is not positive.
    """
    steps, factor = level_coefficients(collective, fabric, p, backend)
    if steps == 0:
        raise CommsError(f"cannot fit alpha and beta at p={p}: a single rank sends nothing; run with >= 2 ranks")
    if len(sizes) != len(times_s):
        raise CommsError(f"{len(sizes)} sizes but {len(times_s)} times; pass one time per size")
    return fit_points([(steps, factor, float(n), float(t)) for n, t in zip(sizes, times_s, strict=True)], min_sizes)


def fit_points(points: Sequence[tuple[float, float, float, float]], min_sizes: int = 2) -> Fit:
    """Least-squares alpha and B over points of possibly different collectives, in relative error.

    Args:
        points: (steps, factor, size in bytes, time in s), each with its collective's coefficients, so
            t_i = steps_i alpha + factor_i n_i / B.
        min_sizes: distinct sizes needed (at least two).

    Returns:
        The `Fit`.

    Raises:
        CommsError: fewer than `min_sizes` distinct sizes, or a time that is not positive.
    """
    import numpy as np

    pts = np.asarray(points, dtype=float).reshape(-1, 4)
    steps, factor, n, t = pts.T
    distinct = len(set(n.tolist()))
    if distinct < max(2, min_sizes):
        raise CommsError(
            f"too few points to fit alpha and beta: {distinct} distinct message size(s) "
            f"{sorted(set(n.astype(int).tolist()))}, need {max(2, min_sizes)}; sweep more sizes"
        )
    if not (t > 0).all() or not np.isfinite(t).all():
        raise CommsError(f"times must be positive seconds, got {t.tolist()}")
    a = np.stack([steps, factor * n], axis=1) / t[:, None]
    ones = np.ones_like(t)
    coef, *_ = np.linalg.lstsq(a, ones, rcond=None)
    alpha, beta = coef
    if beta <= 0 or not _resolved(a, ones - a @ coef, float(beta)):
        # No bandwidth term: refit alpha alone (weighted least squares of t_i = steps * alpha).
        beta = 0.0
        alpha = float(a[:, 0] @ ones / (a[:, 0] @ a[:, 0]))
    alpha, beta = max(float(alpha), 0.0), float(beta)
    rel = (steps * alpha + factor * n * beta - t) / t
    return Fit(
        alpha,
        1.0 / beta if beta > 0 else math.inf,
        float(np.sqrt(np.mean(rel**2))),
        float(np.max(np.abs(rel))),
    )


def _resolved(a, resid, beta: float) -> bool:
    """Whether the fitted slope beta of the scaled system a @ (alpha, beta) ~ 1 stands out from zero.

    a: (m, 2) scaled design matrix; resid: (m,) residuals of the fit.

    Its share of the i-th measured time is a[i, 1] * beta (rows are divided by t_i). It is zero, as far
    as the data can tell, when its largest share is below
    - the rounding of the solve: m * eps * cond(a) (backward-stable least squares, m rows), e.g. equal
      times give beta ~ 1e-23 instead of 0, depending on the CPU's LAPACK; or
    - twice its standard error, from the residuals, when there are more rows than unknowns (m > 2).
    """
    import numpy as np

    m = len(resid)
    share = float(np.max(a[:, 1]) * beta)
    if share <= m * np.finfo(float).eps * np.linalg.cond(a):
        return False
    if m > 2:
        var = float(resid @ resid) / (m - 2) * np.linalg.pinv(a.T @ a)[1, 1]
        return beta > 2 * np.sqrt(max(var, 0.0))
    return True


@dataclass(frozen=True)
class LinkFit:
    """The fit of one scope's link: the joint fit over all collectives, each collective's own, and
    whether the collectives' own figures are written (`fit_scope`)."""

    scope: str
    group_size: int
    joint: Fit
    own: dict[str, Fit]
    per_collective: bool
    points: int


def scopes_of(nodes: int, ranks_per_node: int) -> list[str]:
    """The scopes that measure the topology's links: 'world' on one node, 'intra' and 'inter' on several
    (a scope whose groups hold one rank is left out)."""
    if nodes == 1:
        return ["world"] if ranks_per_node > 1 else []
    return [s for s, p in (("intra", ranks_per_node), ("inter", nodes)) if p > 1]


def _max_rel(fit: Fit, points: Sequence[tuple[float, float, float, float]]) -> float:
    """The largest relative miss of `fit` over (steps, factor, bytes, seconds) points."""
    return max(abs(st * fit.alpha_s + fa * n / fit.bandwidth_Bps - t) / t for st, fa, n, t in points)


def fit_scope(rows: Sequence[dict], scope: str, fabric: str, backend: str, material: float, min_sizes: int) -> LinkFit:
    """Fit one scope's bench rows (median times) jointly and per collective.

    Args:
        rows: summary rows of the benchmark (collective, scope, ranks, bytes, median seconds).
        scope: 'world', 'intra' or 'inter'.
        fabric, backend: how the link's collectives run.
        material: the joint fit's largest relative miss may exceed a collective's own by this much before
            the collectives' own figures are kept.
        min_sizes: distinct sizes a fit needs.

    Returns:
        The `LinkFit`.
    """
    mine = [r for r in rows if r["scope"] == scope]
    if not mine:
        raise CommsError(f"no measurements in scope {scope!r}; measure it first")
    p = mine[0]["group_size"]
    by_collective: dict[str, list[tuple[float, float, float, float]]] = {}
    for r in mine:
        steps, factor = level_coefficients(r["collective"], fabric, p, backend)
        by_collective.setdefault(r["collective"], []).append((steps, factor, r["bytes"], r["median_us"] * 1e-6))
    joint = fit_points([pt for pts in by_collective.values() for pt in pts], min_sizes)
    if math.isinf(joint.bandwidth_Bps):
        raise CommsError(
            f"scope {scope}: the bandwidth term does not show above the noise up to "
            f"{max(r['bytes'] for r in mine)} bytes; raise --max-bytes (e.g. 16M) or --rounds"
        )
    own = {c: fit_points(pts, min_sizes) for c, pts in by_collective.items()}
    per = len(own) > 1 and any(
        not math.isinf(own[c].bandwidth_Bps) and _max_rel(joint, pts) - own[c].max_rel > material
        for c, pts in by_collective.items()
    )
    if per:  # a collective whose own bandwidth term is lost in the noise keeps the joint figures
        own = {c: f for c, f in own.items() if not math.isinf(f.bandwidth_Bps)}
    return LinkFit(scope, p, joint, own, per, sum(len(v) for v in by_collective.values()))


def _figures(fit: Fit) -> dict[str, float]:
    return {"latency_us": round(fit.alpha_s * 1e6, 2), "bandwidth_GBps": float(f"{fit.bandwidth_Bps / 1e9:.4g}")}


def fitted_topology(
    base: TopologyConfig, name: str, fits: Sequence[LinkFit], uplink_GBps: float | None = None
) -> TopologyConfig:
    """`base` renamed `name`, each fitted scope's link replaced by its fit.

    With `uplink_GBps` (an emulated cluster's shaped uplink per rank) the inter-node link's bandwidth is
    that rate and every collective's own fit is written beside it.
    """
    topo = replace(base, name=name)
    for f in fits:
        key = LINK_OF_SCOPE[f.scope]
        old: LinkConfig = getattr(topo, key)
        shaped = uplink_GBps is not None and key == "inter_node"
        own = {  # a collective whose bandwidth term is lost in the noise keeps the link's figures
            c: CollectiveLinkConfig(**_figures(x)) for c, x in f.own.items() if not math.isinf(x.bandwidth_Bps)
        }
        own = own if f.per_collective or shaped else {}
        figures = _figures(f.joint)
        if shaped:
            figures["bandwidth_GBps"] = float(f"{uplink_GBps:.4g}")
        topo = replace(topo, **{key: replace(old, **figures, collectives=own, placeholder=False)})
    return topo


def uplink_GBps_of_env(ranks_per_node: int) -> float | None:
    """The emulated cluster's shaped uplink rate per rank (GB/s) from the environment, or None outside it."""
    gbit = os.environ.get(UPLINK_GBIT_ENV)
    return float(gbit) / 8 / ranks_per_node if gbit else None


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(getattr(value, "value", value))  # enums as their value
    return text if text.replace("_", "").isalnum() else json.dumps(text)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def topology_yaml(
    topo: TopologyConfig, fits: Sequence[LinkFit], header: Sequence[str], notes: dict[str, str] | None = None
) -> str:
    """The topology as YAML that `load_topology` and Hydra's topology group read.

    Args:
        topo: the topology to write.
        fits: each fitted link's fit, written as comments with its errors.
        header: comment lines at the top (date, command).
        notes: a comment for a link's line or a collective's ('inter_node', 'inter_node.alltoall') instead
            of the fit's.

    Returns:
        The file's text.
    """
    notes = notes or {}
    by_key = {LINK_OF_SCOPE[f.scope]: f for f in fits}
    lines = [f"# {part}" for h in header for part in textwrap.wrap(h, 108, break_on_hyphens=False) or [""]]
    for key in ("name", "nodes", "ranks_per_node", "device", "backend"):
        lines.append(f"{key}: {_scalar(getattr(topo, key))}")
    for key in ("intra_node", "inter_node"):
        link: LinkConfig = getattr(topo, key)
        f = by_key.get(key)
        unmeasured = "  # not measured here: the figures of the topology it came from"
        lines.append(f"{key}:" + (f"  # {notes[key]}" if key in notes else "" if f else unmeasured))
        lines.append(f"  fabric: {_scalar(link.fabric)}")
        note = ""
        shaped = f is not None and link.bandwidth_GBps != _figures(f.joint)["bandwidth_GBps"]  # fitted_topology
        if shaped:
            note = "  # the shaped uplink's rate per rank; the joint fit's figure is in the header"
        elif f:
            note = (
                f"  # fitted: {f.points} points, {', '.join(sorted(f.own))}, {f.group_size} ranks; "
                f"max relative residual {_pct(f.joint.max_rel)}, rms {_pct(f.joint.rel_rms)}"
            )
        lines.append(f"  bandwidth_GBps: {_scalar(link.bandwidth_GBps)}{note}")
        lines.append(f"  latency_us: {_scalar(link.latency_us)}")
        lines.append(f"  placeholder: {_scalar(link.placeholder)}")
        if link.collectives:
            said = "what it reaches of that rate" if shaped else "the joint one misses them by more (--material)"
            said = notes.get(f"{key}.collectives", f"each one's own fit: {said}")
            lines.append(f"  collectives:  # {said}")
            for c, own in link.collectives.items():
                err = f.own[c] if f and c in f.own else None
                note = notes.get(f"{key}.{c}", f"max relative residual {_pct(err.max_rel)}" if err else "")
                lines.append(
                    f"    {c}: {{bandwidth_GBps: {_scalar(own.bandwidth_GBps)}, latency_us: {_scalar(own.latency_us)}}}"
                    + (f"  # {note}" if note else "")
                )
    for key in ("hbm_GB", "ddr_GB", "dense_tflops", "mem_bw_GBps"):
        lines.append(f"{key}: {_scalar(getattr(topo, key))}")
    return "\n".join(lines) + "\n"


def output_path(name: str, out: str | None) -> Path:
    """Where the topology goes: --out, or conf/topology/NAME.yaml (`topology=NAME`)."""
    from dlrm.comms import TOPOLOGY_DIR

    return Path(out) if out else TOPOLOGY_DIR / f"{name}.yaml"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m dlrm.comms.fit", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--topology", default="cpu", help="name in conf/topology/ or YAML path: what to measure")
    ap.add_argument("--name", default=None, help="the written topology's name (default: --topology's name)")
    ap.add_argument("--out", default=None, help="YAML file to write (default conf/topology/NAME.yaml)")
    ap.add_argument(
        "--collectives", default=",".join(DEFAULT_COLLECTIVES), help=f"comma list of {','.join(COLLECTIVES)}"
    )
    ap.add_argument("--min-bytes", default="4K", help="smallest message size, e.g. 4K")
    ap.add_argument("--max-bytes", default="4M", help="largest message size (doubling from --min-bytes)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per size and round")
    ap.add_argument("--rounds", type=int, default=4, help="sweeps, each in another order of the sizes")
    ap.add_argument(
        "--material",
        type=float,
        default=0.25,
        help="how much more (relative) the joint fit may miss a collective's points than its own fit "
        "before each collective's own fit is written",
    )
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.iters < 1 or args.rounds < 1:
        raise CommsError(
            f"--warmup={args.warmup} --iters={args.iters} --rounds={args.rounds}: pass warmup >= 0, iters >= 1 "
            "and rounds >= 1"
        )
    if not args.material > 0:
        raise CommsError(f"--material={args.material}: give a positive fraction, e.g. 0.25")
    if args.name is not None and not args.name.replace("_", "").replace("-", "").isalnum():
        raise CommsError(f"--name {args.name!r}: use letters, digits, '_' and '-' (a topology=NAME option)")
    return args


def check_sweep(sizes: Sequence[int], min_bytes: str, max_bytes: str) -> None:
    """Refuse a sweep with fewer than MIN_SIZES sizes, before any measurement."""
    if len(sizes) < MIN_SIZES:
        raise CommsError(
            f"--min-bytes {min_bytes} --max-bytes {max_bytes} gives {len(sizes)} message size(s); a fit needs "
            f"at least {MIN_SIZES}: widen the sweep (e.g. --min-bytes 4K --max-bytes 4M)"
        )


# long: parses, measures, fits and writes in one readable sequence
def main(argv: Sequence[str] | None = None) -> TopologyConfig | None:
    """Measure, fit and write in this torchrun worker; rank 0 returns the fitted topology, others None."""
    args = parse_args(argv)  # the arguments are checked before torch is imported (seconds)
    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in collectives if c not in COLLECTIVES]
    if bad or not collectives:
        raise CommsError(f"--collectives {args.collectives!r}: choose some of {','.join(COLLECTIVES)}")
    sizes = sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes))
    check_sweep(sizes, args.min_bytes, args.max_bytes)

    import torch.distributed as dist

    from dlrm.comms import load_topology
    from dlrm.distributed.topology import device_for, init_distributed
    from dlrm.distributed.world import World

    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise CommsError(
            "WORLD_SIZE/RANK are not set: run under torchrun, e.g. torchrun --standalone --nproc_per_node=2 "
            "-m dlrm.comms.fit --topology cpu"
        )
    world = World.from_env()
    base = load_topology(args.topology)
    name = args.name or base.name
    rpn = base.ranks_per_node or world.local_world_size
    if rpn != world.local_world_size or base.nodes * rpn != world.world_size:
        raise CommsError(
            f"topology {base.name} says {base.nodes} node(s) x {rpn} ranks but torchrun started "
            f"WORLD_SIZE={world.world_size}, LOCAL_WORLD_SIZE={world.local_world_size}; launch with "
            f"--nnodes={base.nodes} --nproc_per_node={rpn} or pick the topology of this machine"
        )
    scopes = scopes_of(base.nodes, rpn)
    if not scopes:
        raise CommsError("one rank sends nothing: run with at least 2 ranks (torchrun --nproc_per_node=2)")
    layout = group_layout(world.world_size, base.nodes, rpn)
    check_request(collectives, sizes, {s: len(layout[s][0]) for s in scopes})
    out = output_path(name, args.out)
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise CommsError(f"cannot write {out}: its directory does not exist or is not writable; pass --out FILE")
    device = device_for(base, world)
    ours = not dist.is_initialized()
    init_distributed(base, world)
    try:
        began = time.time()
        rows = measure(Request(collectives, scopes, sizes, base.nodes, rpn, base), world.rank, world.world_size,
                       device, args.warmup, args.iters, args.rounds)  # fmt: skip
        if not world.is_main:
            return None
        print(format_table(rows), flush=True)
        backend = backend_of(base)
        fits = [
            fit_scope(rows, s, str(getattr(base, LINK_OF_SCOPE[s]).fabric), backend, args.material, MIN_SIZES)
            for s in scopes
        ]
        uplink = uplink_GBps_of_env(rpn) if base.nodes > 1 else None
        topo = fitted_topology(base, name, fits, uplink)
        topo.check()
        command = "python -m dlrm.comms.fit " + shlex.join(argv if argv is not None else sys.argv[1:])
        header = [
            f"{name}: {base.nodes} node(s) x {rpn} ranks, {backend} on {device.type}; links fitted to measurement.",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} by `{command}` under torchrun "
            f"({world.world_size} ranks): {', '.join(collectives)}, {sizes[0]}..{sizes[-1]} bytes ({len(sizes)} "
            f"sizes), median of {args.rounds} rounds x {args.iters} iterations of the slowest rank;",
            "alpha and B by least squares of the relative error (dlrm.comms.costmodel.fit_points). Rerun it on "
            "your machine to replace them.",
        ]
        for f in fits:
            own = "; ".join(
                f"{c} alone {x.alpha_s * 1e6:.1f} us / {x.bandwidth_Bps / 1e9:.3g} GB/s (max {_pct(x.max_rel)})"
                for c, x in f.own.items()
            )
            header.append(
                f"scope {f.scope} ({f.group_size} ranks) -> {LINK_OF_SCOPE[f.scope]}: {f.joint.alpha_s * 1e6:.1f} us / "
                f"{f.joint.bandwidth_Bps / 1e9:.3g} GB/s, max relative residual {_pct(f.joint.max_rel)}; {own}"
            )
        if uplink is not None:
            header.append(
                f"On dlrm.cluster's emulated fabric ({UPLINK_GBIT_ENV}={os.environ[UPLINK_GBIT_ENV]}): inter_node's "
                f"bandwidth is the shaped uplink's {uplink:.4g} GB/s per rank and its collectives' own fits what each "
                "reaches of it; dlrm.cluster --gbit scales them alike."
            )
        header.append(
            f"Other figures (memory, compute) are those of topology {args.topology!r}; set them to your machine."
        )
        write_atomic(out, topology_yaml(topo, fits, header).encode())
        load_topology(str(out))  # what was written reads back as a topology
        for line in header[3:]:
            print(line)
        print(f"wrote {out}" + (f" (topology={name})" if args.out is None else ""), flush=True)
        return topo
    finally:
        if ours:
            dist.destroy_process_group()


if __name__ == "__main__":
    run_rank_command(main, CommsError)
