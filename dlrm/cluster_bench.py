"""The Zion paper's questions measured on the emulated cluster (`python -m dlrm.cluster`), beside the model.

    python -m dlrm.cluster_bench --out outputs/cluster_bench              # all experiments, 3 rounds
    python -m dlrm.cluster_bench --quick --out outputs/cluster_bench_q    # about 2-3 minutes

Needs root (each run is a `dlrm.cluster` job: network namespaces, tc-shaped uplinks). Experiments
(`--experiments`):

- ``comms``: `dlrm.comms.bench` on 2 nodes x 2 ranks (`dlrm.cluster --module`), scopes world, intra and
  inter, against the cost model built from the emu_2x2 topology at that uplink rate (not fitted to the
  measurement): geometric-mean absolute error per collective and scope over sizes >= 64 KiB. Once, in
  the first round, per uplink rate.
- ``train``: `dlrm.train` on 2 x 2 per variant (`--variants`: the planner's plan with DDP's flat
  allreduce, hierarchical allreduce, local SGD every 4 steps, each sharding type) at every `--gbits`:
  the measured step time (median over the run's log windows after the first), the exposed alltoall and
  allreduce shares of a profiled step (`summary.json` step_breakdown phases) and `comm_vs_model`.
- ``scale``: weak scaling at `--batch-per-rank`: one-node runs (1 x 1 and 1 x 2, no inter-node link)
  calibrate `python -m dlrm.plan --scale ... --measured`; its projection is compared with the measured
  2 x 1, 4 x 1 and 2 x 2 runs (the train experiment's `auto` run is the 2 x 2 one).

The variants run interleaved within a round (their order rotated by one each round), so slow phases of a
shared machine fall on all of them; the figures are medians over rounds. Each run's record is appended to
`results.json` as it ends; `findings.md` (tables and the findings stated from them) and `findings.png`
are rewritten after each round. All three written atomically.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dlrm.errors import ArgumentParser, UsageError, UserError
from dlrm.io import figure_png, output_dir_problem, write_atomic, write_json_atomic

SCHEMA = "dlrm.cluster_bench/1"
EXPERIMENTS = ("comms", "train", "scale")
VARIANTS: dict[str, list[str]] = {  # 2 x 2 training variants: their dlrm.train overrides
    "auto": [],
    "hierarchical": ["trainer.dense_allreduce=hierarchical"],
    "local_sgd": ["trainer.dense_sync=local_sgd", "trainer.sync_period=4"],
    "table_wise": ["sharding=table_wise"],
    "row_wise": ["sharding=row_wise"],
    "table_row_wise": ["sharding=table_row_wise"],
    "column_wise": ["sharding=column_wise"],
}
SHARDING_VARIANTS = ("auto", "table_wise", "row_wise", "table_row_wise", "column_wise")
DENSE_SYNC = {"auto": "allreduce", "hierarchical": "hierarchical", "local_sgd": "local_sgd"}  # plan's rows
COLLECTIVES = ("allreduce", "alltoall", "reduce_scatter", "allgather")
A2A_PHASES = ("input_dist", "emb_a2a_fwd", "grad_a2a")  # waiting on the embedding exchange
RUN_TIMEOUT_S = 600
GOALS = {"comms_error": 0.25, "comm_vs_model": 1.5, "auto_within": 0.10, "scale_error": 0.20}


def say(message: str) -> None:
    print(message, flush=True)


# --- options -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    out: str = "outputs/cluster_bench"
    rounds: int = 3
    gbits: tuple[float, ...] = (0.5, 2.0)
    steps: int = 60
    batch_per_rank: int = 256
    model: str = "dlrm_small"
    experiments: tuple[str, ...] = EXPERIMENTS
    variants: tuple[str, ...] = tuple(VARIANTS)
    comms_max_bytes: str = "4M"
    comms_iters: int = 10
    max_minutes: float | None = None
    quick: bool = False
    render: bool = False


QUICK = {
    "rounds": 1,
    "gbits": (1.0,),
    "steps": 20,
    "variants": ("auto", "hierarchical"),
    "comms_max_bytes": "256K",
    "comms_iters": 5,
}


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise UsageError(f"{flag}={text}: give positive uplink rates in Gbit/s, comma-separated (e.g. {flag} 0.5,2)")
    return tuple(sorted(set(values)))


def _names(text: str, flag: str, allowed: Sequence[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise UsageError(f"{flag}={text}: choose from {','.join(allowed)} (comma-separated)")
    return names


def parse_args(argv: Sequence[str] | None) -> Options:
    """The options, checked (UsageError names the bad one); `--quick` sets the values not given."""
    ap = ArgumentParser(prog="python -m dlrm.cluster_bench", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=Options.out, help="directory for results.json, findings.md, findings.png")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default {Options.rounds})")
    ap.add_argument("--gbits", help="uplink rates, Gbit/s, comma-separated (default 0.5,2)")
    ap.add_argument("--steps", type=int, help=f"training steps per run (default {Options.steps})")
    ap.add_argument("--batch-per-rank", type=int, help=f"samples per rank and step (default {Options.batch_per_rank})")
    ap.add_argument("--model", default=Options.model, help="the model config (conf/model)")
    ap.add_argument("--experiments", help=f"comma list of {','.join(EXPERIMENTS)} (default all)")
    ap.add_argument("--variants", help=f"2 x 2 training variants, comma list of {','.join(VARIANTS)} (default all)")
    ap.add_argument("--comms-max-bytes", help="largest message of the comms benchmark (default 4M; from 64K)")
    ap.add_argument("--max-minutes", type=float, help="start no round that would end after this many minutes")
    ap.add_argument("--quick", action="store_true", help="1 round, 1 Gbit/s, 20 steps, auto and hierarchical")
    ap.add_argument("--render", action="store_true", help="run nothing: rewrite --out's findings from its results.json")
    a = ap.parse_args(argv)
    base = replace(Options(), **QUICK) if a.quick else Options()
    opts = replace(
        base,
        out=a.out,
        render=a.render,
        model=a.model,
        quick=a.quick,
        max_minutes=a.max_minutes,
        rounds=base.rounds if a.rounds is None else a.rounds,
        steps=base.steps if a.steps is None else a.steps,
        batch_per_rank=base.batch_per_rank if a.batch_per_rank is None else a.batch_per_rank,
        gbits=base.gbits if a.gbits is None else _floats(a.gbits, "--gbits"),
        experiments=base.experiments if a.experiments is None else _names(a.experiments, "--experiments", EXPERIMENTS),
        variants=base.variants if a.variants is None else _names(a.variants, "--variants", tuple(VARIANTS)),
        comms_max_bytes=base.comms_max_bytes if a.comms_max_bytes is None else a.comms_max_bytes,
    )
    if opts.rounds < 1:
        raise UsageError(f"--rounds={opts.rounds}: give 1 or more")
    if opts.steps < 8 or opts.steps % 4:
        raise UsageError(f"--steps={opts.steps}: give a multiple of 4 (local SGD's period), at least 8")
    if opts.batch_per_rank < 1:
        raise UsageError(f"--batch-per-rank={opts.batch_per_rank}: give 1 or more")
    if opts.max_minutes is not None and not opts.max_minutes > 0:
        raise UsageError(f"--max-minutes={opts.max_minutes}: give a positive number of minutes")
    from dlrm.comms.bench import parse_size

    try:
        if parse_size(opts.comms_max_bytes) < 64 * 2**10:
            raise ValueError
    except (ValueError, UserError):
        raise UsageError(f"--comms-max-bytes={opts.comms_max_bytes}: give a size of 64K or more (e.g. 4M)") from None
    problem = output_dir_problem(opts.out, "--out")
    if problem:
        raise UsageError(problem)
    return opts


# --- what to run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One dlrm.cluster job: `kind` train or comms, its shape, uplink (None: one node, no link), variant."""

    kind: str
    nodes: int
    ranks_per_node: int
    gbit: float | None
    variant: str

    @property
    def name(self) -> str:
        rate = "local" if self.gbit is None else f"{self.gbit:g}g"
        return f"{self.kind}-{self.nodes}x{self.ranks_per_node}-{rate}-{self.variant}"


def round_specs(opts: Options, round_index: int) -> list[Spec]:
    """The jobs of one round, in the order they run (rotated by the round's index)."""
    specs: list[Spec] = []
    if "comms" in opts.experiments and round_index == 0:
        specs += [Spec("comms", 2, 2, g, "bench") for g in opts.gbits]
    jobs: list[Spec] = []
    if "scale" in opts.experiments:
        jobs += [Spec("train", 1, 1, None, "auto"), Spec("train", 1, 2, None, "auto")]
    for g in opts.gbits:
        if "train" in opts.experiments:
            jobs += [Spec("train", 2, 2, g, v) for v in opts.variants]
        if "scale" in opts.experiments:
            jobs += [Spec("train", 2, 1, g, "auto"), Spec("train", 4, 1, g, "auto")]
            if "train" not in opts.experiments or "auto" not in opts.variants:
                jobs.append(Spec("train", 2, 2, g, "auto"))
    k = round_index % len(jobs) if jobs else 0
    return specs + jobs[k:] + jobs[:k]


def train_overrides(opts: Options, spec: Spec, run_dir: Path) -> list[str]:
    """dlrm.train's overrides for one run: weak scaling at batch_per_rank, quiet, one small eval."""
    ranks = spec.nodes * spec.ranks_per_node
    topology = "emu_2x2" if spec.ranks_per_node == 2 else "emu_4x1"
    return [
        f"model={opts.model}",
        f"topology={topology}",
        f"topology.nodes={spec.nodes}",
        f"data.global_batch_size={opts.batch_per_rank * ranks}",
        f"trainer.max_steps={opts.steps}",
        f"trainer.log_every_steps={log_every(opts.steps)}",
        "trainer.eval_every_steps=0",
        "data.eval_batches=1",
        "trainer.progress=none",
        "trainer.tensorboard=false",
        *VARIANTS[spec.variant],
        f"hydra.run.dir={run_dir}",
    ]


def log_every(steps: int) -> int:
    """A log window (one profiled step each) of about a sixth of the run: 5 windows after the first."""
    return max(1, steps // 6)


def cluster_command(opts: Options, spec: Spec, run_dir: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "dlrm.cluster",
        "--nodes",
        str(spec.nodes),
        "--ranks-per-node",
        str(spec.ranks_per_node),
    ]
    if spec.gbit is not None:
        cmd += ["--gbit", f"{spec.gbit:g}"]
    if spec.kind == "comms":
        return [*cmd, "--module", "dlrm.comms.bench", "--", "--topology", f"emu_{spec.nodes}x{spec.ranks_per_node}",
                "--scopes", "world,intra,inter", "--collectives", ",".join(COLLECTIVES), "--min-bytes", "64K",
                "--max-bytes", opts.comms_max_bytes, "--iters", str(opts.comms_iters), "--warmup", "2",
                "--out", str(run_dir)]  # fmt: skip
    return [*cmd, "--", *train_overrides(opts, spec, run_dir)]


# --- reading a run -------------------------------------------------------------------------------------


def train_record(run_dir: Path) -> dict:
    """The figures of one training run from its summary.json and metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    windows = [w for w in records if "step_s" in w and "step" in w]
    step_s, before = [], 0
    for w in windows:  # less the profiler's overhead the trainer recorded for the window's profiled step
        length = max(1, w["step"] - before)
        step_s.append(w["step_s"] - w.get("profile_overhead_s", 0.0) * w.get("profiled_steps", 1) / length)
        before = w["step"]
    steady = step_s[1:] or step_s  # the first window holds the warm-up
    phases = summary.get("step_breakdown", {}).get("phase_s", {})
    total = sum(phases.values())
    cvm = summary.get("comm_vs_model", {})
    plan_types: dict[str, int] = {}
    for entry in summary.get("sharding_plan", []):
        plan_types[entry["sharding_type"]] = plan_types.get(entry["sharding_type"], 0) + 1
    raw = [w["step_s"] for w in windows][1:] or [w["step_s"] for w in windows]
    return {
        "step_s": statistics.median(steady) if steady else None,
        "step_with_profiler_s": statistics.median(raw) if raw else None,
        "a2a_share": sum(phases.get(p, 0.0) for p in A2A_PHASES) / total if total else None,
        "allreduce_share": phases.get("dense_allreduce", 0.0) / total if total else None,
        "phase_s": phases,
        "comm_measured_s": {k: v["measured_s"] for k, v in cvm.items() if isinstance(v, dict)},
        "comm_model_s": {k: v["model_s"] for k, v in cvm.items() if isinstance(v, dict)},
        "plan_types": plan_types,
        "samples_per_s": summary.get("train_samples_per_s"),
    }


def comms_model_links(gbit: float, nodes: int, ranks_per_node: int):
    """(intra, inter) cost-model links of the emulated topology at this uplink rate, as dlrm.cluster sets it."""
    from dlrm.comms.costmodel import Link
    from dlrm.compose import compose

    cfg = compose(
        [f"topology=emu_{nodes}x{ranks_per_node}", f"topology.inter_node.bandwidth_GBps={gbit / 8 / ranks_per_node!r}"]
    )
    return Link.from_config(cfg.topology.intra_node), Link.from_config(cfg.topology.inter_node)


def comms_rows(bench: dict, gbit: float, links) -> list[dict]:
    """Per measured size: the cost model's time for the same collective, scope and size."""
    from dlrm.comms.bench import base_collective
    from dlrm.comms.costmodel import collective_time, two_level_time

    intra, inter = links
    nodes = bench["nodes"]
    rows = []
    for r in bench["results"]:
        c, scope, p, n = base_collective(r["collective"]), r["scope"], r["group_size"], r["bytes"]
        if scope == "world":
            model = two_level_time(c, intra, inter, nodes, p // nodes, n)
        else:
            model = collective_time(c, intra if scope == "intra" else inter, p, n)
        rows.append({"gbit": gbit, "collective": c, "scope": scope, "group_size": p, "bytes": n,
                     "measured_s": r["median_us"] * 1e-6, "model_s": model})  # fmt: skip
    return rows


def projection_rows(plan: dict, round_index: int, gbit: float, series: str) -> list[dict]:
    """The rows of `dlrm.plan --json --scale` (one node included: the calibration run modelled again)."""
    rows = []
    for r in plan["scaling"]:
        if r["nodes"] >= 1:
            share = r.get("share", {})
            rows.append({"round": round_index, "gbit": gbit, "series": series, "nodes": r["nodes"],
                         "dense_sync": r["dense_sync"], "step_s": r["step_s"], "a2a_share": share.get("alltoall"),
                         "allreduce_share": share.get("allreduce_exposed")})  # fmt: skip
    return rows


# --- summaries -----------------------------------------------------------------------------------------


def median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def runs_of(results: dict, nodes: int, rpn: int, gbit: float | None, variant: str) -> list[dict]:
    """The successful training runs of one shape, uplink and variant, in the order they ran."""
    want = (nodes, rpn, gbit, variant)
    return [
        r
        for r in results["runs"]
        if r["kind"] == "train" and r.get("ok") and (r["nodes"], r["ranks_per_node"], r["gbit"], r["variant"]) == want
    ]


def train_cell(results: dict, nodes: int, rpn: int, gbit: float | None, variant: str, key: str) -> list[float]:
    return [r[key] for r in runs_of(results, nodes, rpn, gbit, variant) if r.get(key) is not None]


def projected(
    results: dict, gbit: float, series: str, nodes: int, dense_sync: str | None, key: str = "step_s"
) -> float | None:
    """The median over rounds of `dlrm.plan --scale`'s figure `key` for that row (None: not projected)."""
    want = (gbit, series, nodes, dense_sync)
    rows = results.get("projections", [])
    return median([p[key] for p in rows if (p["gbit"], p["series"], p["nodes"], p["dense_sync"]) == want])


def comms_errors(results: dict) -> list[dict]:
    """Geometric-mean |model/measured - 1| over sizes >= 64 KiB per (gbit, collective, scope)."""
    from dlrm.comms.accuracy import geomean_abs_error

    groups: dict[tuple, list[dict]] = {}
    for r in results.get("comms", []):
        groups.setdefault((r["gbit"], r["collective"], r["scope"]), []).append(r)
    out = []
    for (g, c, scope), rows in sorted(groups.items()):
        n = [r["bytes"] for r in rows]
        m = [r["measured_s"] for r in rows]
        p = [r["model_s"] for r in rows]
        big = [(x, y) for x, y, s in zip(m, p, n, strict=True) if s >= 64 * 2**10]
        out.append({"gbit": g, "collective": c, "scope": scope, "error": geomean_abs_error(n, m, p),
                    "ratio_median": median([y / x for x, y in big]) if big else None})  # fmt: skip
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"x{x:.2f}"


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0] * 1e3:.1f}"
    return f"{statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def train_table(results: dict) -> str:
    """One row per (uplink, 2 x 2 variant): measured and modelled step, shares and comm_vs_model."""
    rows = []
    gbits = sorted(
        {r["gbit"] for r in results["runs"] if r["kind"] == "train" and r["nodes"] == 2 and r["ranks_per_node"] == 2}
    )
    for g in gbits:
        base = median(train_cell(results, 2, 2, g, "auto", "step_s"))
        for v in VARIANTS:
            steps = train_cell(results, 2, 2, g, v, "step_s")
            if not steps:
                continue
            step = statistics.median(steps)
            runs = runs_of(results, 2, 2, g, v)
            kinds = ("embedding_exchange", "dense_allreduce")
            ratio = {kind: median([comm_ratio(r, kind) for r in runs]) for kind in kinds}
            types = ", ".join(f"{k} {n}" for k, n in sorted(runs[-1]["plan_types"].items())) if runs else "-"
            dense_sync = DENSE_SYNC.get(v)
            model_step = projected(results, g, "1x2", 2, dense_sync) if dense_sync else None
            rows.append([
                f"{g:g}", v, len(steps), _spread(steps), "-" if base is None else f"{step / base:.2f}", _ms(model_step),
                _pct(median(train_cell(results, 2, 2, g, v, "a2a_share"))),
                _pct(projected(results, g, "1x2", 2, dense_sync, "a2a_share") if dense_sync else None),
                _pct(median(train_cell(results, 2, 2, g, v, "allreduce_share"))),
                _x(ratio["embedding_exchange"]), _x(ratio["dense_allreduce"]), types,
            ])  # fmt: skip
    header = ["Gbit/s", "variant (2 x 2)", "runs", "step ms measured (min-max)", "vs auto", "step ms modelled",
              "alltoall share measured", "alltoall share modelled", "allreduce share measured",
              "emb. exchange measured/model", "allreduce measured/model", "plan (tables per type)"]  # fmt: skip
    return table(rows, header)


def comm_ratio(run: dict, kind: str) -> float | None:
    """comm_vs_model's measured / modelled seconds of `kind` in one run (None: not reported)."""
    m, p = run.get("comm_measured_s", {}).get(kind), run.get("comm_model_s", {}).get(kind)
    return m / p if m is not None and p else None


def scale_table(results: dict) -> str:
    """Measured weak-scaling step times beside `dlrm.plan --scale --measured` calibrated on one node."""
    rows = []
    for series, rpn in (("1x1", 1), ("1x2", 2)):
        one = train_cell(results, 1, rpn, None, "auto", "step_s")
        if not one:
            continue
        gbits = sorted({p["gbit"] for p in results.get("projections", []) if p["series"] == series})
        again = projected(results, gbits[0], series, 1, "allreduce") if gbits else None
        rows.append([f"{rpn}", 1, "-", _spread(one), f"{_ms(again)} (calibration)", "-"])
        for g in gbits:
            for nodes in (2, 4):
                meas = train_cell(results, nodes, rpn, g, "auto", "step_s")
                model = projected(results, g, series, nodes, "allreduce")
                if model is None and not meas:
                    continue
                m = median(meas)
                err = None if (m is None or model is None) else model / m - 1
                rows.append(
                    [f"{rpn}", nodes, f"{g:g}", _spread(meas), _ms(model), "-" if err is None else f"{err:+.0%}"]
                )
    return table(
        rows, ["ranks per node", "nodes", "Gbit/s", "step ms measured (min-max)", "step ms modelled", "model error"]
    )


def comms_table(results: dict) -> str:
    rows = [
        [f"{e['gbit']:g}", e["collective"], e["scope"], "-" if e["error"] is None else f"{e['error']:.0%}",
         _x(e["ratio_median"]), "met" if e["error"] is not None and e["error"] <= GOALS["comms_error"] else "missed"]
        for e in comms_errors(results)
    ]  # fmt: skip
    return table(
        rows,
        ["Gbit/s", "collective", "scope", "model error (geomean, >= 64 KiB)", "model/measured (median)", "goal 25%"],
    )


def findings(results: dict) -> list[str]:
    """The paper's questions answered from the measured medians, one sentence each."""
    out: list[str] = []
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    # The alltoall's share as the link slows.
    shares = [
        (
            g,
            median(train_cell(results, 2, 2, g, "auto", "a2a_share")),
            projected(results, g, "1x2", 2, "allreduce", "a2a_share"),
        )
        for g in gbits
    ]
    shares = [s for s in shares if s[1] is not None]
    if len(shares) >= 2:
        (g_fast, m_fast, p_fast), (g_slow, m_slow, p_slow) = shares[-1], shares[0]
        out.append(
            f"**Alltoall share vs link speed** (2 x 2, the planner's plan): as the uplink slows from {g_fast:g} to "
            f"{g_slow:g} Gbit/s the exposed embedding exchange (input_dist + pooled alltoall + gradient alltoall) goes "
            f"from {_pct(m_fast)} to {_pct(m_slow)} of the step (modelled {_pct(p_fast)} to {_pct(p_slow)})."
        )
    for rpn, nodes in ((1, 4), (1, 2)):
        s4 = [(g, median(train_cell(results, nodes, rpn, g, "auto", "a2a_share"))) for g in gbits]
        s4 = [s for s in s4 if s[1] is not None]
        if len(s4) >= 2:
            out.append(
                f"On {nodes} x {rpn} the alltoall share is "
                + ", ".join(f"{_pct(s)} at {g:g} Gbit/s" for g, s in s4)
                + "."
            )
            break
    # Hierarchical allreduce and local SGD against the flat allreduce.
    for v, what in (("hierarchical", "Hierarchical allreduce"), ("local_sgd", "Local SGD (H=4)")):
        parts = []
        for g in gbits:
            base, other = (
                median(train_cell(results, 2, 2, g, "auto", "step_s")),
                median(train_cell(results, 2, 2, g, v, "step_s")),
            )
            if base is None or other is None:
                continue
            ar_b = median(train_cell(results, 2, 2, g, "auto", "allreduce_share"))
            ar_v = median(train_cell(results, 2, 2, g, v, "allreduce_share"))
            mb, mv = projected(results, g, "1x2", 2, "allreduce"), projected(results, g, "1x2", 2, DENSE_SYNC[v])
            modelled = f", modelled {mv / mb:.2f}x" if mb and mv else ""
            parts.append(
                f"at {g:g} Gbit/s {other / base:.2f}x the flat allreduce's step time{modelled} "
                f"(allreduce share {_pct(ar_b)} -> {_pct(ar_v)})"
            )
        if parts:
            verdict = []
            for g in gbits:
                base, other = (
                    median(train_cell(results, 2, 2, g, "auto", "step_s")),
                    median(train_cell(results, 2, 2, g, v, "step_s")),
                )
                if base and other:
                    verdict.append(
                        "pays" if other < 0.97 * base else "costs" if other > 1.03 * base else "is even (within 3%)"
                    )
            out.append(f"**{what}** on 2 x 2: " + "; ".join(parts) + f". Verdict per rate: {', '.join(verdict)}.")
    # The planner's choice against the measured fastest sharding type.
    for g in gbits:
        steps: dict[str, float] = {}
        for v in SHARDING_VARIANTS:
            s = median(train_cell(results, 2, 2, g, v, "step_s"))
            if s is not None:
                steps[v] = s
        if "auto" in steps and len(steps) > 1:
            best = min(steps, key=lambda v: steps[v])
            gap = steps["auto"] / steps[best] - 1
            ok = "met" if gap <= GOALS["auto_within"] else "missed"
            autos = runs_of(results, 2, 2, g, "auto")
            plan = ", ".join(f"{n} tables {k}" for k, n in sorted(autos[-1]["plan_types"].items())) if autos else "?"
            out.append(
                f"**Planner's choice at {g:g} Gbit/s**: auto planned {plan}; "
                f"measured fastest: {best} ({steps[best] * 1e3:.1f} ms); auto {steps['auto'] * 1e3:.1f} ms, {gap:+.0%} "
                f"(goal within 10%: {ok})."
            )
    # comm_vs_model.
    multi = [
        r for r in results["runs"] if r["kind"] == "train" and r.get("ok") and r["nodes"] * r["ranks_per_node"] > 1
    ]
    for kind in ("embedding_exchange", "dense_allreduce"):
        rs = sorted(x for r in multi if (x := comm_ratio(r, kind)) is not None)
        if rs:
            within = sum(1 for x in rs if 1 / GOALS["comm_vs_model"] <= x <= GOALS["comm_vs_model"])
            out.append(
                f"**comm_vs_model {kind}** (measured / modelled seconds per step, every multi-rank run): "
                f"median x{statistics.median(rs):.2f}, x{rs[0]:.2f}-x{rs[-1]:.2f}; {within} of {len(rs)} within 1.5x."
            )
    errs = [e for e in comms_errors(results) if e["error"] is not None]
    if errs:
        met = [e for e in errs if e["error"] <= GOALS["comms_error"]]
        worst = max(errs, key=lambda e: e["error"])
        out.append(
            f"**Cost model vs comms benchmark**: {len(met)} of {len(errs)} (rate, collective, scope) cells within 25%; "
            f"worst {worst['collective']} {worst['scope']} at {worst['gbit']:g} Gbit/s, {worst['error']:.0%}."
        )
    return out


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchrec": version("torchrec"),
        "loadavg_start": os.getloadavg(),
    }


def findings_md(results: dict) -> str:
    m = dict(results.get("machine", {}))
    for key in ("loadavg_start", "loadavg_end"):
        if isinstance(m.get(key), list | tuple):
            m[key] = " ".join(f"{x:.1f}" for x in m[key])
    o = results.get("options", {})
    head = (
        f"Measured {results.get('started', '?')} to {results.get('ended', '?')} on {m.get('cpus', '?')} cores "
        f"({m.get('cpu_model', '?')}), shared: load average {m.get('loadavg_start', '?')} at the start, "
        f"{m.get('loadavg_end', '?')} at the end; torch {m.get('torch', '?')}, torchrec {m.get('torchrec', '?')}, "
        f"Gloo. model={o.get('model')}, {o.get('batch_per_rank')} samples per rank and step (weak scaling), "
        f"{o.get('steps')} steps per run, {results.get('rounds_done', 0)} interleaved round(s); step times are the "
        "median over a run's log windows after the first, less the profiler overhead the trainer recorded for "
        "each window's profiled step, then over rounds (min-max over rounds in brackets). Shares are of "
        "a profiled step's phases. 4 ranks share 2 cores: compute is contended in every multi-rank run."
    )
    parts = ["# The Zion paper's questions on the emulated cluster", "", head, ""]
    parts += ["## Findings", ""] + [f"- {f}" for f in findings(results)] + [""]
    parts += ["## Training on 2 nodes x 2 ranks", "", train_table(results), ""]
    parts += [
        "## Weak scaling: `dlrm.plan --scale --measured` (one-node run) vs measured",
        "",
        scale_table(results),
        "",
    ]
    parts += [
        "## Collectives: cost model (emu_2x2 topology, not fitted) vs `dlrm.comms.bench` on 2 x 2",
        "",
        comms_table(results),
        "",
    ]
    failed = [r for r in results["runs"] if not r.get("ok")]
    if failed:
        parts += (
            ["## Failed runs", ""]
            + [f"- {r['name']} (round {r['round'] + 1}): {r.get('error', '')}" for r in failed]
            + [""]
        )
    return "\n".join(parts)


# --- plot ----------------------------------------------------------------------------------------------


@dataclass
class Series:
    panel: int  # 0: step time vs Gbit/s (2 x 2), 1: step time vs nodes, 2: alltoall share vs Gbit/s
    label: str
    x: list[float]
    y: list[float]
    measured: bool
    color: str = "C0"
    extra: dict = field(default_factory=dict)


PANELS = (
    ("2 nodes x 2 ranks: step time vs uplink", "inter-node uplink (Gbit/s)", "step time (ms)"),
    ("weak scaling, 1 rank per node: step time vs nodes", "nodes", "step time (ms)"),
    ("alltoall (embedding exchange) share of the step", "inter-node uplink (Gbit/s)", "share of the step (%)"),
)


def plot_series(results: dict) -> list[Series]:
    """Every line of findings.png: measured ones solid, modelled ones dashed (label says which)."""
    out: list[Series] = []
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    for i, v in enumerate(VARIANTS):
        pts = [(g, median(train_cell(results, 2, 2, g, v, "step_s"))) for g in gbits]
        pts = [(g, s * 1e3) for g, s in pts if s is not None]
        if pts:
            out.append(Series(0, f"{v} (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{i}"))
        if v in DENSE_SYNC:
            mp = [(g, projected(results, g, "1x2", 2, DENSE_SYNC[v])) for g in gbits]
            mp = [(g, s * 1e3) for g, s in mp if s is not None]
            if mp:
                out.append(Series(0, f"{v} (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{i}"))
    one = median(train_cell(results, 1, 1, None, "auto", "step_s"))
    for j, g in enumerate(gbits):
        pts = [(1, one)] + [(n, median(train_cell(results, n, 1, g, "auto", "step_s"))) for n in (2, 4)]
        pts = [(n, s * 1e3) for n, s in pts if s is not None]
        if len(pts) > 1:
            out.append(Series(1, f"{g:g} Gbit/s (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{j}"))
        mp = [(n, projected(results, g, "1x1", n, "allreduce")) for n in (1, 2, 4)]
        mp = [(n, s * 1e3) for n, s in mp if s is not None]
        if len(mp) > 1:
            out.append(Series(1, f"{g:g} Gbit/s (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{j}"))
    for j, (nodes, rpn, series) in enumerate(((2, 2, "1x2"), (4, 1, "1x1"), (2, 1, "1x1"))):
        pts = [(g, median(train_cell(results, nodes, rpn, g, "auto", "a2a_share"))) for g in gbits]
        pts = [(g, s * 100) for g, s in pts if s is not None]
        if pts:
            out.append(
                Series(2, f"{nodes} x {rpn}, auto (measured)", [p[0] for p in pts], [p[1] for p in pts], True, f"C{j}")
            )
        mp = [(g, projected(results, g, series, nodes, "allreduce", "a2a_share")) for g in gbits]
        mp = [(g, s * 100) for g, s in mp if s is not None]
        if mp:
            out.append(
                Series(2, f"{nodes} x {rpn}, auto (modelled)", [p[0] for p in mp], [p[1] for p in mp], False, f"C{j}")
            )
    return out


def plot(results: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 6.5))
    shapes = ("s", "^", "v", "D", "P", "X", "*")  # modelled lines that coincide stay visible: nested markers
    drawn = [0, 0, 0]
    for s in plot_series(results):
        ax = axes[s.panel]
        if s.measured:
            ax.plot(s.x, s.y, "-", marker="o", ms=5, lw=2.0, color=s.color, label=s.label)
        else:
            k = drawn[s.panel]
            drawn[s.panel] += 1
            ax.plot(s.x, s.y, "--", marker=shapes[k % len(shapes)], ms=max(4, 11 - 2 * k), mfc="none", lw=1.5,
                    color=s.color, label=s.label)  # fmt: skip
    for ax, (title, xlabel, ylabel) in zip(axes, PANELS, strict=True):
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8, title="solid: measured, dashed: modelled", title_fontsize=8, ncol=2,
                      loc="upper center", bbox_to_anchor=(0.5, -0.13))  # fmt: skip
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    for ax in (axes[0], axes[2]):
        ax.set_xscale("log", base=2)
        if gbits:
            ax.set_xticks(gbits, [f"{g:g}" for g in gbits])
            ax.set_xlim(min(gbits) / 1.4, max(gbits) * 1.4)
    axes[1].set_xticks([1, 2, 4], ["1", "2", "4"])
    for ax in axes:
        ax.set_ylim(bottom=0)
    fig.suptitle("DLRM on the emulated cluster (network namespaces, tc tbf uplinks; Gloo, 2 shared CPU cores)")
    return figure_png(fig)


# --- running -------------------------------------------------------------------------------------------


def run_job(opts: Options, spec: Spec, run_dir: Path) -> tuple[bool, str, float]:
    """Run one dlrm.cluster job; (ok, the tail of its stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cluster_command(opts, spec, run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # Ctrl-C: dlrm.cluster stops its agents and removes its fabric
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        return False, f"timed out after {RUN_TIMEOUT_S} s", time.monotonic() - t0
    except BaseException:  # our own Ctrl-C: let dlrm.cluster (same process group, so it got it too) clean up
        proc.communicate(timeout=120)
        raise
    tail = "\n".join(err.strip().splitlines()[-3:])
    return proc.returncode == 0, tail, time.monotonic() - t0


def run_plan(opts: Options, gbit: float, series: str, calibration: Path) -> dict:
    """`dlrm.plan --json --scale` calibrated on a one-node run of `series` ('1x1' or '1x2')."""
    rpn = int(series[-1])
    topology, counts = ("emu_4x1", "1,2,4") if rpn == 1 else ("emu_2x2", "1,2")
    cmd = [
        *(sys.executable, "-m", "dlrm.plan", "--json", "--scale", counts),
        *("--measured", str(calibration / "summary.json"), f"model={opts.model}", f"topology={topology}"),
        *("topology.nodes=1", f"topology.inter_node.bandwidth_GBps={gbit / 8 / rpn!r}"),
        f"data.global_batch_size={opts.batch_per_rank * rpn}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"dlrm.plan failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def describe(rec: dict) -> str:
    if not rec.get("ok"):
        return f"FAILED: {rec.get('error', '')}"
    if rec["kind"] == "comms":
        return f"{rec.get('comms_rows', 0)} (collective, scope, size) timings"
    cm, mm = rec.get("comm_measured_s", {}), rec.get("comm_model_s", {})
    ratio = " ".join(f"{k.split('_')[0]} x{cm[k] / mm[k]:.1f}" for k in cm if mm.get(k))
    shares = f"alltoall {_pct(rec['a2a_share'])}, allreduce {_pct(rec['allreduce_share'])}"
    return f"step {_ms(rec['step_s'])} ms, {shares}, comm measured/model {ratio or '-'}"


def save(out: Path, results: dict, with_figures: bool) -> None:
    write_json_atomic(out / "results.json", results)
    if with_figures:
        write_atomic(out / "findings.md", findings_md(results).encode())
        write_atomic(out / "findings.png", plot(results))


def run(opts: Options, now: Callable[[], float] = time.monotonic) -> int:
    from dlrm.cluster import missing_right

    reason = missing_right()
    if reason:
        raise UsageError(reason)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"schema": SCHEMA, "options": asdict(opts), "machine": machine(), "runs": [], "projections": [],
                     "comms": [], "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rounds_done": 0}  # fmt: skip
    t0 = now()
    round_s: list[float] = []
    for k in range(opts.rounds):
        if opts.max_minutes is not None and round_s and (now() - t0 + max(round_s)) / 60 > opts.max_minutes:
            say(f"--max-minutes {opts.max_minutes:g}: no time for round {k + 1}; stopping after {k}")
            break
        r0 = now()
        specs = round_specs(opts, k)
        for i, spec in enumerate(specs):
            run_dir = out / "runs" / f"r{k + 1}" / spec.name
            ok, tail, seconds = run_job(opts, spec, run_dir)
            rec: dict = {**asdict(spec), "name": spec.name, "round": k, "ok": ok, "seconds": round(seconds, 1)}
            rec["run_dir"] = str(run_dir)
            if not ok:
                rec["error"] = tail
            else:
                try:
                    if spec.kind == "comms":
                        bench = json.loads((run_dir / "bench.json").read_text())
                        assert spec.gbit is not None
                        rows = comms_rows(
                            bench, spec.gbit, comms_model_links(spec.gbit, spec.nodes, spec.ranks_per_node)
                        )
                        results["comms"] += rows
                        rec["comms_rows"] = len(rows)
                    else:
                        rec.update(train_record(run_dir))
                except (OSError, ValueError, KeyError) as e:
                    rec.update(ok=False, error=f"unreadable output: {e}")
            results["runs"].append(rec)
            say(f"round {k + 1}/{opts.rounds} [{i + 1}/{len(specs)}] {spec.name} ({seconds:.0f} s): {describe(rec)}")
            save(out, results, with_figures=False)
        if "scale" in opts.experiments:
            for series, rpn in (("1x1", 1), ("1x2", 2)):
                cal = out / "runs" / f"r{k + 1}" / Spec("train", 1, rpn, None, "auto").name
                if not (cal / "summary.json").is_file():
                    continue
                for g in opts.gbits:
                    try:
                        results["projections"] += projection_rows(run_plan(opts, g, series, cal), k, g, series)
                    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                        say(f"projection {series} at {g:g} Gbit/s failed: {e}")
        results["rounds_done"] = k + 1
        round_s.append(now() - r0)
        results["machine"]["loadavg_end"] = os.getloadavg()
        results["ended"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        save(out, results, with_figures=True)
        tables = f"{train_table(results)}\n\n{scale_table(results)}\n\n{comms_table(results)}"
        say(f"\nafter round {k + 1} ({round_s[-1] / 60:.1f} min):\n\n{tables}\n")
    say("\n".join(f"- {f}" for f in findings(results)))
    say(f"wrote {out / 'results.json'}, {out / 'findings.md'}, {out / 'findings.png'}")
    return 0 if all(r.get("ok") for r in results["runs"]) else 1


def render(opts: Options) -> int:
    """Rewrite findings.md and findings.png from an earlier run's results.json (the tables' code may have changed)."""
    out = Path(opts.out)
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(
            f"--render: cannot read {out / 'results.json'} ({e}); pass the --out of an earlier run"
        ) from None
    for rec in results["runs"]:  # read the runs again where they are kept (this code may read them better)
        if rec["kind"] == "train" and rec.get("ok") and (Path(rec.get("run_dir", "")) / "summary.json").is_file():
            rec.update(train_record(Path(rec["run_dir"])))
    save(out, results, with_figures=True)
    say(findings_md(results))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts = parse_args(argv)
        return render(opts) if opts.render else run(opts)
    except UserError as e:
        print(f"{e.prefix}: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
