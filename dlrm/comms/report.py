"""Report: ring vs fully connected fabrics from the cost model, and a benchmark beside the model.

    python -m dlrm.comms.report --topology zion --out outputs/comms_report
    python -m dlrm.comms.report --bench outputs/comms_bench/bench.json --out outputs/comms_report

From the model alone: allreduce and alltoall time vs message size at --ranks ranks, and at
--scale-bytes per rank over 1 .. --max-nodes nodes. With --bench: alpha and B fitted per (collective,
scope) and measured vs predicted time per size. Prints markdown tables; writes report.md and
report.png (and bench_vs_model.png) into --out, atomically.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import JSON_LIMIT, UnreadableFileError, figure_png, parse_json, read_bounded, write_atomic
from dlrm.comms.accuracy import geomean_abs_error
from dlrm.comms.costmodel import (
    CommsError,
    Link,
    collective_time,
    two_level_time,
)
from dlrm.comms.fit import fit_alpha_beta
from dlrm.comms.measure import FIELDS, SCHEMA, base_collective, parse_size, sweep_sizes

COMPARED = ("ring", "fully_connected")


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def fmt_bytes(n: float) -> str:
    """A byte count in the largest binary unit it reaches (B, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def fmt_us(seconds: float) -> str:
    """Seconds as microseconds, 4 significant digits."""
    return f"{seconds * 1e6:.4g}"


def size_comparison(link: Link, ranks: int, sizes: Sequence[int]) -> dict[str, list[float]]:
    """Seconds per size for '<collective>/<fabric>' on one level of `ranks` ranks."""
    return {
        f"{c}/{f}": [collective_time(c, replace(link, fabric=f), ranks, n) for n in sizes]
        for c in ("allreduce", "alltoall")
        for f in COMPARED
    }


def scale_comparison(
    intra: Link, inter: Link, ranks: int, node_counts: Sequence[int], nbytes: int
) -> dict[str, list[float]]:
    """Seconds per node count for '<collective>/<intra fabric>' at nbytes per rank (two levels)."""
    return {
        f"{c}/{f}": [two_level_time(c, replace(intra, fabric=f), inter, n, ranks, nbytes) for n in node_counts]
        for c in ("allreduce", "alltoall")
        for f in COMPARED
    }


def load_bench(path: str) -> dict:
    """A benchmark's bench.json as a dict.

    Raises:
        CommsError: the file is missing, unreadable or not a benchmark result.
    """
    fix = "pass the bench.json written by `torchrun ... -m dlrm.comms.measure --out DIR` (DIR/bench.json)"
    try:
        data = parse_json(read_bounded(path, JSON_LIMIT))
    except FileNotFoundError:
        raise CommsError(f"benchmark file {path!r} does not exist; {fix}") from None
    except (OSError, ValueError, UnreadableFileError) as e:
        raise CommsError(f"benchmark file {path!r} is not JSON ({str(e).splitlines()[0]}); {fix}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CommsError(f"benchmark file {path!r} has schema {got!r}, expected {SCHEMA!r}; {fix}")
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise CommsError(f"benchmark file {path!r} has no 'results' rows; {fix}")
    for i, row in enumerate(rows):
        missing = [k for k in FIELDS if not isinstance(row, dict) or k not in row]
        if missing:
            raise CommsError(f"benchmark file {path!r}: results[{i}] lacks {', '.join(missing)}; {fix}")
    for key in ("nodes", "intra_fabric", "inter_fabric"):
        if key not in data:
            raise CommsError(f"benchmark file {path!r} lacks key {key!r}; {fix}")
    return data


def bench_vs_model(data: dict) -> tuple[list[list], list[list], dict[tuple, tuple]]:
    """Fit each (collective, scope) of a bench result; (fit rows, per-size rows, curves for the plot)."""
    groups: dict[tuple, list[dict]] = {}
    for r in data["results"]:
        groups.setdefault((r["collective"], r["scope"], r["group_size"]), []).append(r)
    fits, sizes, curves = [], [], {}
    for (c, scope, p), rows in groups.items():
        if scope == "intra" or (scope == "world" and data["nodes"] == 1):
            fabric = data["intra_fabric"]
        else:
            fabric = data["inter_fabric"]
        n = [r["bytes"] for r in rows]
        t = [r["median_us"] * 1e-6 for r in rows]
        fit = fit_alpha_beta(base_collective(c), fabric, p, n, t)
        link = Link(fabric, fit.alpha_s, fit.bandwidth_Bps)
        pred = [collective_time(base_collective(c), link, p, x) for x in n]
        alpha_us, bw = f"{fit.alpha_s * 1e6:.1f}", f"{fit.bandwidth_Bps / 1e9:.3f}"
        geo = geomean_abs_error(n, t, pred)
        fits.append([c, scope, p, fabric, alpha_us, bw, f"{fit.rel_rms:.2f}", "-" if geo is None else f"{geo:.1%}"])
        sizes += [
            [c, scope, fmt_bytes(x), fmt_us(tm), fmt_us(tp), f"{tm / tp:.2f}"]
            for x, tm, tp in zip(n, t, pred, strict=True)
        ]
        curves[(c, scope)] = (n, t, pred)
    return fits, sizes, curves


def _label(key: str) -> str:
    """'alltoall/fully_connected' -> 'alltoall, fully connected fabric' (a legend entry)."""
    collective, fabric = key.split("/")
    return f"{collective}, {fabric.replace('_', ' ')} fabric"


def model_plot(sizes, by_size, node_counts, by_nodes, ranks: int, scale_bytes: int) -> bytes:
    """PNG bytes: modelled time against message size, and against node count at `scale_bytes` per rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, ts in by_size.items():
        a.plot(sizes, [t * 1e6 for t in ts], marker="o", ms=3, label=_label(key))
    a.set(
        xscale="log",
        yscale="log",
        xlabel="message size per rank (bytes)",
        ylabel="time (us)",
        title=f"cost model: {ranks} ranks in one node",
    )
    for key, ts in by_nodes.items():
        b.plot(node_counts, [t * 1e6 for t in ts], marker="o", ms=3, label=_label(key) + " inside nodes")
    b.set(
        xscale="log",
        yscale="log",
        xlabel=f"nodes ({ranks} ranks each)",
        ylabel="time (us)",
        title=f"cost model: scale-out, {fmt_bytes(scale_bytes)} per rank",
    )
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return figure_png(fig)


def bench_plot(curves: dict[tuple, tuple]) -> bytes:
    """PNG bytes: measured and modelled time against message size per (collective, scope)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, ((c, scope), (n, t, pred)) in enumerate(curves.items()):
        color = f"C{i % 10}"
        ax.plot(n, [x * 1e6 for x in t], "o", ms=3, color=color, label=f"{c} ({scope}) measured")
        ax.plot(n, [x * 1e6 for x in pred], "-", color=color, label=f"{c} ({scope}) model")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="message size (bytes)",
        ylabel="median time (us)",
        title="benchmark vs fitted alpha-beta model",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    return figure_png(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m dlrm.comms.report", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--topology", default="zion", help="name in conf/topology/ or YAML path: link alpha and B")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--min-bytes", default="1K")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--scale-bytes", default="64M", help="message size per rank for the scale-out table")
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--bench", default=None, help="bench.json from dlrm.comms.measure: measured vs predicted")
    ap.add_argument("--out", default="outputs/comms_report")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.max_nodes < 1:
        raise CommsError(f"--ranks={args.ranks} --max-nodes={args.max_nodes}: both must be at least 1")
    return args


def model_section(
    name: str, intra: Link, inter: Link, ranks: int, sizes, by_size, node_counts, by_nodes, scale_bytes: int
) -> list[str]:
    """Markdown lines: ring vs fully connected by message size, and the scale-out by node count."""
    keys = list(by_size)
    return [
        f"# Communication cost model: ring vs fully connected ({name} links)",
        "",
        f"Intra-node link: alpha = {intra.alpha_s * 1e6:g} us, B = {intra.bandwidth_Bps / 1e9:g} GB/s per rank; "
        f"inter-node: {inter.fabric}, alpha = {inter.alpha_s * 1e6:g} us, "
        f"B = {inter.bandwidth_Bps / 1e9:g} GB/s per rank.",
        "",
        f"## Time (us) vs message size, {ranks} ranks",
        "",
        table(
            [
                [fmt_bytes(n)]
                + [fmt_us(by_size[k][i]) for k in keys]
                + [f"{by_size['alltoall/ring'][i] / by_size['alltoall/fully_connected'][i]:.2f}"]
                for i, n in enumerate(sizes)
            ],
            ["size"] + keys + ["alltoall ring/fc"],
        ),
        "",
        f"## Scale-out: time (us) at {fmt_bytes(scale_bytes)} per rank, nodes of {ranks} "
        "(intra-node fabric shown; inter-node as above)",
        "",
        table([[n] + [fmt_us(by_nodes[k][i]) for k in keys] for i, n in enumerate(node_counts)], ["nodes"] + keys),
    ]


def bench_section(path: str, data: dict, fits: list, rows: list) -> list[str]:
    """Markdown lines: alpha and B fitted to a benchmark, and measured vs predicted per size."""
    return [
        "",
        f"## Benchmark {path} ({data.get('backend')}, {data.get('world_size')} ranks) vs model",
        "",
        table(
            fits,
            [
                "collective",
                "scope",
                "p",
                "fabric",
                "alpha (us)",
                "B (GB/s)",
                "rel. rms misfit",
                "geo-mean abs. error >= 64 KiB",
            ],
        ),
        "",
        *(
            ["B = inf: the sizes were too small for the bandwidth term to show; sweep larger sizes.", ""]
            if any(f[5] == "inf" for f in fits)
            else []
        ),
        table(rows, ["collective", "scope", "size", "measured (us)", "predicted (us)", "measured/predicted"]),
    ]


def main(argv: Sequence[str] | None = None) -> str:
    """Print and write the report; returns its markdown."""
    from dlrm.comms import load_topology

    args = parse_args(argv)
    topo = load_topology(args.topology)
    intra, inter = Link.from_config(topo.intra_node), Link.from_config(topo.inter_node)
    sizes = sweep_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes))
    scale_bytes = parse_size(args.scale_bytes)
    node_counts = sweep_sizes(1, args.max_nodes)
    by_size = size_comparison(intra, args.ranks, sizes)
    by_nodes = scale_comparison(intra, inter, args.ranks, node_counts, scale_bytes)
    md = model_section(topo.name, intra, inter, args.ranks, sizes, by_size, node_counts, by_nodes, scale_bytes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = ["report.md", "report.png"] + (["bench_vs_model.png"] if args.bench else [])
    replaced = [name for name in names if (out / name).exists()]
    write_atomic(out / "report.png", model_plot(sizes, by_size, node_counts, by_nodes, args.ranks, scale_bytes))
    if args.bench:
        data = load_bench(args.bench)
        fits, rows, curves = bench_vs_model(data)
        md += bench_section(args.bench, data, fits, rows)
        write_atomic(out / "bench_vs_model.png", bench_plot(curves))
    text = "\n".join(md) + "\n"
    write_atomic(out / "report.md", text.encode())
    print(text)
    print(
        "wrote "
        + ", ".join(str(out / name) for name in names)
        + (f" (replacing the earlier {', '.join(replaced)})" if replaced else "")
    )
    return text


if __name__ == "__main__":
    try:
        main()
    except (UserError, FileNotFoundError) as e:  # one line, exit 2 (dlrm.common.errors)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
