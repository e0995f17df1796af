"""The cluster experiments' results read back: a training run's figures, summaries over rounds, and the
tables of findings.md. Pure functions of the results dict.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path

VARIANTS: dict[str, list[str]] = {  # 2 x 2 training variants: their dlrm.train overrides
    "auto": [],
    "hierarchical": ["trainer.dense_allreduce=hierarchical"],
    "local_sgd": ["trainer.dense_sync=local_sgd", "trainer.sync_period=4"],
    "table_wise": ["sharding=table_wise"],
    "row_wise": ["sharding=row_wise"],
    "table_row_wise": ["sharding=table_row_wise"],
    "column_wise": ["sharding=column_wise"],
    "data_parallel": ["sharding=data_parallel"],
}
SHARDING_VARIANTS = ("auto", "table_wise", "row_wise", "table_row_wise", "column_wise", "data_parallel")
DENSE_SYNC = {"auto": "allreduce", "hierarchical": "hierarchical", "local_sgd": "local_sgd"}  # plan's rows
A2A_PHASES = ("input_dist", "emb_a2a_fwd", "grad_a2a")  # waiting on the embedding exchange
GOALS = {"comms_error": 0.25, "comm_vs_model": 1.25, "auto_within": 0.05, "scale_error": 0.20}
DEFAULT_SHAPE = (2, 2)  # nodes x ranks per node of the train experiment


def shape_of(results: dict) -> tuple[int, int]:
    """(nodes, ranks per node) of the results' train experiment; 2x2 for results without `--shape`."""
    nodes, rpn = results.get("options", {}).get("shape") or DEFAULT_SHAPE
    return int(nodes), int(rpn)


# --- reading a run -------------------------------------------------------------------------------------


def train_record(run_dir: Path) -> dict:
    """The figures of one training run from its summary.json and metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    windows = [w for w in records if "step_s" in w and "step" in w]
    step_s = [w["step_s"] for w in windows]  # the trainer keeps the profiler's start, stop and reading off it
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


# --- summaries -----------------------------------------------------------------------------------------


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None: no such value)."""
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
    """Figure `key` of each successful run of that shape, uplink and variant, where it has one."""
    return [r[key] for r in runs_of(results, nodes, rpn, gbit, variant) if r.get(key) is not None]


def projected(
    results: dict, gbit: float, series: str, nodes: int, dense_sync: str | None, key: str = "step_s"
) -> float | None:
    """The median over rounds of the `--scale` projection's figure `key` for that row (None: not projected)."""
    want = (gbit, series, nodes, dense_sync)
    rows = results.get("projections", [])
    return median([p[key] for p in rows if (p["gbit"], p["series"], p["nodes"], p["dense_sync"]) == want])


def comms_errors(results: dict) -> list[dict]:
    """Geometric-mean |model/measured - 1| over sizes of at least 64 KiB, per (gbit, collective, scope)."""
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


def pct(x: float | None) -> str:
    """A share as a whole percentage, or "-"."""
    return "-" if x is None else f"{x:.0%}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"x{x:.2f}"


def table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0] * 1e3:.1f}"
    return f"{statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def train_table(results: dict) -> str:
    """One row per (uplink, variant) of the train experiment's shape: measured and modelled step, shares and
    comm_vs_model."""
    rows = []
    n, k = shape_of(results)
    gbits = sorted(
        {r["gbit"] for r in results["runs"] if r["kind"] == "train" and r["nodes"] == n and r["ranks_per_node"] == k}
    )
    for g in gbits:
        base = median(train_cell(results, n, k, g, "auto", "step_s"))
        for v in VARIANTS:
            steps = train_cell(results, n, k, g, v, "step_s")
            if not steps:
                continue
            step = statistics.median(steps)
            runs = runs_of(results, n, k, g, v)
            kinds = ("embedding_exchange", "dense_allreduce")
            ratio = {kind: median([comm_ratio(r, kind) for r in runs]) for kind in kinds}
            types = ", ".join(f"{k} {n}" for k, n in sorted(runs[-1]["plan_types"].items())) if runs else "-"
            dense_sync = DENSE_SYNC.get(v)
            model_step = projected(results, g, f"1x{k}", n, dense_sync) if dense_sync else None
            rows.append([
                f"{g:g}", v, len(steps), _spread(steps), "-" if base is None else f"{step / base:.2f}", _ms(model_step),
                pct(median(train_cell(results, n, k, g, v, "a2a_share"))),
                pct(projected(results, g, f"1x{k}", n, dense_sync, "a2a_share") if dense_sync else None),
                pct(median(train_cell(results, n, k, g, v, "allreduce_share"))),
                _x(ratio["embedding_exchange"]), _x(ratio["dense_allreduce"]), types,
            ])  # fmt: skip
    header = ["Gbit/s", f"variant ({n} x {k})", "runs", "step ms measured (min-max)", "vs auto", "step ms modelled",
              "alltoall share measured", "alltoall share modelled", "allreduce share measured",
              "emb. exchange measured/model", "allreduce measured/model", "plan (tables per type)"]  # fmt: skip
    return table(rows, header)


def comm_ratio(run: dict, kind: str) -> float | None:
    """comm_vs_model's measured / modelled seconds of `kind` in one run (None: not reported)."""
    m, p = run.get("comm_measured_s", {}).get(kind), run.get("comm_model_s", {}).get(kind)
    return m / p if m is not None and p else None


def scale_table(results: dict) -> str:
    """Measured weak-scaling step times beside the planner's `--scale --measured` projection."""
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
    """Markdown: the cost model's error per (uplink, collective, scope) against the comms goal."""
    rows = [
        [f"{e['gbit']:g}", e["collective"], e["scope"], "-" if e["error"] is None else f"{e['error']:.0%}",
         _x(e["ratio_median"]), "met" if e["error"] is not None and e["error"] <= GOALS["comms_error"] else "missed"]
        for e in comms_errors(results)
    ]  # fmt: skip
    return table(
        rows,
        ["Gbit/s", "collective", "scope", "model error (geomean, >= 64 KiB)", "model/measured (median)", "goal 25%"],
    )


def describe(rec: dict) -> str:
    """One line summing up a job's record for the progress log."""
    if not rec.get("ok"):
        return f"FAILED: {rec.get('error', '')}"
    if rec["kind"] == "comms":
        return f"{rec.get('comms_rows', 0)} (collective, scope, size) timings"
    cm, mm = rec.get("comm_measured_s", {}), rec.get("comm_model_s", {})
    ratio = " ".join(f"{k.split('_')[0]} x{cm[k] / mm[k]:.1f}" for k in cm if mm.get(k))
    shares = f"alltoall {pct(rec['a2a_share'])}, allreduce {pct(rec['allreduce_share'])}"
    return f"step {_ms(rec['step_s'])} ms, {shares}, comm measured/model {ratio or '-'}"


def machine() -> dict:
    """The machine and library versions the results were measured on."""
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
