"""The cluster experiments' findings: the paper's questions answered from the measured medians
(`findings`), and the page itself (`findings_md`). Pure functions of the results dict.
"""

from __future__ import annotations

import statistics

from dlrm.bench.cluster.summaries import (
    DENSE_SYNC,
    GOALS,
    SHARDING_VARIANTS,
    comm_ratio,
    comms_errors,
    comms_table,
    median,
    pct,
    projected,
    runs_of,
    scale_table,
    shape_of,
    train_cell,
    train_table,
)


def _share_findings(results: dict) -> list[str]:
    """The alltoall's share of the step as the link slows."""
    out: list[str] = []
    n, k = shape_of(results)
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    # The alltoall's share as the link slows.
    shares = [
        (
            g,
            median(train_cell(results, n, k, g, "auto", "a2a_share")),
            projected(results, g, f"1x{k}", n, "allreduce", "a2a_share"),
        )
        for g in gbits
    ]
    shares = [s for s in shares if s[1] is not None]
    if len(shares) >= 2:
        (g_fast, m_fast, p_fast), (g_slow, m_slow, p_slow) = shares[-1], shares[0]
        out.append(
            f"**Alltoall share vs link speed** ({n} x {k}, the planner's plan): as the uplink slows from {g_fast:g} to "
            f"{g_slow:g} Gbit/s the exposed embedding exchange (input_dist + pooled alltoall + gradient alltoall) goes "
            f"from {pct(m_fast)} to {pct(m_slow)} of the step (modelled {pct(p_fast)} to {pct(p_slow)})."
        )
    for rpn, nodes in [s for s in ((1, 4), (1, 2)) if s != (k, n)]:
        s4 = [(g, median(train_cell(results, nodes, rpn, g, "auto", "a2a_share"))) for g in gbits]
        s4 = [s for s in s4 if s[1] is not None]
        if len(s4) >= 2:
            out.append(
                f"On {nodes} x {rpn} the alltoall share is "
                + ", ".join(f"{pct(s)} at {g:g} Gbit/s" for g, s in s4)
                + "."
            )
            break
    return out


def _sync_findings(results: dict) -> list[str]:
    """Hierarchical allreduce and local SGD against the flat allreduce, per rate."""
    out: list[str] = []
    n, k = shape_of(results)
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    # Hierarchical allreduce and local SGD against the flat allreduce.
    for v, what in (("hierarchical", "Hierarchical allreduce"), ("local_sgd", "Local SGD (H=4)")):
        parts = []
        for g in gbits:
            base, other = (
                median(train_cell(results, n, k, g, "auto", "step_s")),
                median(train_cell(results, n, k, g, v, "step_s")),
            )
            if base is None or other is None:
                continue
            ar_b = median(train_cell(results, n, k, g, "auto", "allreduce_share"))
            ar_v = median(train_cell(results, n, k, g, v, "allreduce_share"))
            mb, mv = projected(results, g, f"1x{k}", n, "allreduce"), projected(results, g, f"1x{k}", n, DENSE_SYNC[v])
            modelled = f", modelled {mv / mb:.2f}x" if mb and mv else ""
            parts.append(
                f"at {g:g} Gbit/s {other / base:.2f}x the flat allreduce's step time{modelled} "
                f"(allreduce share {pct(ar_b)} -> {pct(ar_v)})"
            )
        if parts:
            verdict = []
            for g in gbits:
                base, other = (
                    median(train_cell(results, n, k, g, "auto", "step_s")),
                    median(train_cell(results, n, k, g, v, "step_s")),
                )
                if base and other:
                    verdict.append(
                        "pays" if other < 0.97 * base else "costs" if other > 1.03 * base else "is even (within 3%)"
                    )
            out.append(f"**{what}** on {n} x {k}: " + "; ".join(parts) + f". Verdict per rate: {', '.join(verdict)}.")
    return out


def _planner_findings(results: dict) -> list[str]:
    """The planner's choice against the measured fastest sharding type, per rate."""
    out: list[str] = []
    n, k = shape_of(results)
    gbits = sorted({r["gbit"] for r in results["runs"] if r["gbit"] is not None})
    # The planner's choice against the measured fastest sharding type.
    for g in gbits:
        steps: dict[str, float] = {}
        for v in SHARDING_VARIANTS:
            s = median(train_cell(results, n, k, g, v, "step_s"))
            if s is not None:
                steps[v] = s
        if "auto" in steps and len(steps) > 1:
            best = min(steps, key=lambda v: steps[v])
            gap = steps["auto"] / steps[best] - 1
            ok = "met" if gap <= GOALS["auto_within"] else "missed"
            autos = runs_of(results, n, k, g, "auto")
            plan = ", ".join(f"{n} tables {k}" for k, n in sorted(autos[-1]["plan_types"].items())) if autos else "?"
            out.append(
                f"**Planner's choice at {g:g} Gbit/s**: auto planned {plan}; "
                f"measured fastest: {best} ({steps[best] * 1e3:.1f} ms); auto {steps['auto'] * 1e3:.1f} ms, {gap:+.0%} "
                f"(goal within {GOALS['auto_within']:.0%}: {ok})."
            )
    return out


def _model_findings(results: dict) -> list[str]:
    """The trainer's comm_vs_model and the cost model against the comms benchmark."""
    out: list[str] = []
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
                f"median x{statistics.median(rs):.2f}, x{rs[0]:.2f}-x{rs[-1]:.2f}; {within} of {len(rs)} "
                f"within {GOALS['comm_vs_model']:g}x."
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


def findings(results: dict) -> list[str]:
    """The paper's questions answered from the measured medians, one sentence each."""
    return [
        *_share_findings(results),
        *_sync_findings(results),
        *_planner_findings(results),
        *_model_findings(results),
    ]


def _contention(results: dict, cpus) -> str:
    """Whether the runs' ranks outnumber the cores (then compute is contended in the larger runs)."""
    ranks = max((r["nodes"] * r["ranks_per_node"] for r in results["runs"] if r["kind"] == "train"), default=0)
    if not isinstance(cpus, int) or ranks <= cpus:
        return f"At most {ranks} ranks on {cpus} cores: one core per rank (shared with the machine's other load)."
    return f"{ranks} ranks share {cpus} cores: compute is contended in the runs with more ranks than cores."


def findings_md(results: dict) -> str:
    """The findings page: the machine and options, the findings, and the tables."""
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
        "a profiled step's phases. " + _contention(results, m.get("cpus"))
    )
    again = results.get("remodelled")
    if again:
        head += (
            f" Model figures (the collectives' model, the `--scale` projections, comm_vs_model's modelled seconds) "
            f"re-evaluated on {again.get('at', '?')} by `--render` with the model of that date against the same "
            f"measurements ({again.get('comms_rows', 0)} collective rows, {again.get('projections', 0)} projection "
            f"rows, {again.get('comm_vs_model_runs', 0)} runs' comm_vs_model); the run's own model figures are kept "
            "in results.json (`model_s_at_run`, `projections_at_run`, `comm_model_s_at_run`)."
        )
    parts = ["# The Zion paper's questions on the emulated cluster", "", head, ""]
    parts += ["## Findings", ""] + [f"- {f}" for f in findings(results)] + [""]
    n, k = shape_of(results)
    parts += [f"## Training on {n} nodes x {k} rank(s)", "", train_table(results), ""]
    if results.get("projections"):
        parts += [
            "## Weak scaling: `dlrm.plan --scale --measured` (one-node run) vs measured",
            "",
            scale_table(results),
            "",
        ]
    if results.get("comms"):
        parts += [
            "## Collectives: cost model (emu_2x2 topology, not fitted) vs `dlrm.comms.measure` on 2 x 2",
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
