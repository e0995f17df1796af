"""What the trainer prints (rank 0): the run's configuration and plan, evaluations, the closing lines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dlrm.config import Config, ModelConfig, ShardingConfig, TrainerConfig


def config_lines(
    cfg: Config,
    nodes: int,
    ranks_per_node: int,
    backend: str,
    device: str,
    dense_params: int,
    total_steps: int,
    eval_batches: int,
) -> list[str]:
    """The run's configuration in a few console lines; `eval_batches`: those an evaluation scores. Takes
    the whole Config: the lines describe the job's model, data, optimizers, topology and precisions."""
    m, tables, o = cfg.model, cfg.model.tables, cfg.optim
    rows = sum(t.rows for t in tables)
    dims = sorted({t.dim for t in tables})
    emb = sum(t.rows * t.dim for t in tables)
    batch = cfg.data.global_batch_size
    return [
        f"model: {len(tables)} tables, {rows:,} rows, dim {'/'.join(map(str, dims))} ({emb / 1e6:,.1f}M embedding "
        f"params); bottom {'-'.join(map(str, [m.dense_in_features, *m.bottom_mlp]))}, top "
        f"{'-'.join(map(str, m.top_mlp))}, interaction {m.interaction} ({dense_params / 1e6:,.2f}M dense params)"
        + (f"; tasks {', '.join(f'{t.name} (weight {t.weight:g})' for t in m.tasks)}" if len(m.tasks) > 1 else ""),
        f"data: {cfg.data.source}, global batch {batch:,} ({batch // (nodes * ranks_per_node):,} per rank), "
        f"{total_steps} steps, {_eval_text(eval_batches, cfg.data.eval_batches)}",
        f"optim: embedding {o.embedding.name} lr {o.embedding.lr:g} (fused into backward), "
        f"dense {o.dense.name} lr {o.dense.lr:g}",
        f"topology: {cfg.topology.name}, {nodes} node(s) x {ranks_per_node} rank(s), {backend} on {device}",
    ] + precision_lines(cfg.model, cfg.sharding, cfg.trainer)


def _eval_text(batches: int, asked: int) -> str:
    """The data line's evaluation part: `batches` an evaluation scores, of `asked` (data.eval_batches)."""
    if not batches:
        return "no eval" + (f" (the data has no eval split; data.eval_batches={asked})" if asked else "")
    held = f" (all the eval split holds; data.eval_batches={asked})" if batches < asked else ""
    return f"eval {batches} batches{held}"


def precision_lines(model: ModelConfig, sh: ShardingConfig, tr: TrainerConfig) -> list[str]:
    """One line naming the storage and wire precisions that are not fp32 (none when all are): the
    tables', the embedding comms' and the dense all-reduce's."""
    parts = [
        f"tables {model.embedding_precision}" if model.embedding_precision != "fp32" else "",
        f"embedding comms {sh.qcomms_forward} forward, {sh.qcomms_backward} backward"
        if "fp32" != sh.qcomms_forward or "fp32" != sh.qcomms_backward
        else "",
        f"dense allreduce {tr.dense_allreduce_precision}" if tr.dense_allreduce_precision != "fp32" else "",
    ]
    parts = [p for p in parts if p]
    return [f"precision: {'; '.join(parts)}"] if parts else []


def plan_lines(plan: list[dict], world_size: int, backend: str) -> list[str]:
    """The sharding plan (`describe_plan` rows): one line per (sharding type, kernel), tables per rank."""
    groups: dict[tuple, list[dict]] = {}
    for row in plan:
        groups.setdefault((row["sharding_type"], row["compute_kernel"]), []).append(row)
    lines = [f"sharding plan ({world_size} ranks, {backend}):"]
    for (kind, kernel), rows in groups.items():
        per_rank = Counter(rank for row in rows for rank in row["ranks"])
        spread = ", ".join(f"{r}:{n}" for r, n in sorted(per_rank.items()))
        lines.append(f"  {kind:<17} {len(rows):>3} tables, kernel {kernel}; tables on rank {spread}")
    return lines


def eval_text(evaluation: dict) -> str:
    """An evaluation's figures: auc, logloss, ne, calibration; per task ("<task>: ...; ...") for several."""
    if not evaluation:
        return "no eval data"
    tasks = [key.split("/", 1)[1] for key in evaluation if key.startswith("auc/")]
    if not tasks:
        return _figures_text(evaluation, "")
    return "; ".join(f"{task}: {_figures_text(evaluation, f'/{task}')}" for task in tasks)


def _figures_text(evaluation: dict, suffix: str) -> str:
    def value(key: str, undefined: str) -> str:
        v = evaluation.get(key + suffix)
        return undefined if v is None else f"{v:.4f}"

    return (
        f"auc {value('auc', 'n/a (one class)')} logloss {value('logloss', 'n/a')} ne {value('ne', 'n/a (one class)')} "
        f"calibration {value('calibration', 'n/a (no positives)')}"
    )


def end_lines(
    summary: dict, global_batch_size: int, world_size: int, run_dir: Path | None, tensorboard: bool
) -> list[str]:
    """The console's closing lines: throughput, the per-phase breakdown, comms against the model, outputs."""
    lines = []
    speed, invocations = summary["train_samples_per_s"], summary.get("invocations", 1)
    if speed:
        over = f" over {invocations} invocations" if invocations > 1 else ""
        lines.append(
            f"trained {summary['steps']} steps{over}: {speed:,.0f} samples/s, "
            f"{global_batch_size / speed * 1e3:.1f} ms/step; loop {summary['wall_time_s']:.1f} s, "
            f"job {summary['job_wall_time_s']:.1f} s"
        )
    if invocations > 1:
        this = summary["this_invocation"]
        lines.append(
            f"this invocation: steps {this['first_step'] + 1}..{summary['steps']}, "
            f"{this['train_samples_per_s'] or 0:,.0f} samples/s, loop {this['wall_time_s']:.1f} s"
        )
    if "target_auc" in summary:
        lines.append(
            f"target AUC {summary['target_auc']}: reached at step {summary['steps_to_target']} "
            f"({summary['samples_to_target']:,} samples)"
            if summary["reached_target"]
            else f"target AUC {summary['target_auc']}: not reached in {summary['steps']} steps "
            f"(final eval AUC {summary['eval_auc']})"
        )
    b = summary.get("step_breakdown")
    if b is not None:
        ms = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in b["phase_s"].items())
        lines.append(
            f"step breakdown, ms (mean of {b['profiled_steps']} profiled steps, {b['profiled_step_s'] * 1e3:.1f} ms "
            f"each; profiling took {b['profile_overhead_s'] * 1e3:.0f} ms per profiled step, off the clock): {ms}"
        )
        if world_size > 1:
            lines += comm_lines(b, summary.get("comm_vs_model"))
    if run_dir is not None:
        lines.append(
            f"outputs: {run_dir} (summary.json, metrics.jsonl, train.log"
            + (", tensorboard/" if tensorboard else "")
            + ")"
        )
    return lines


def comm_lines(breakdown: dict, versus: dict | None) -> list[str]:
    """The console lines of the profiled steps' collectives, one per kind.

    Each says its own time (last entry to last exit, where measured), and a rank's transfer apart from
    waiting for peers and from time behind a collective of another kind (where there was any); with
    `versus` (per kind, the cost model's comparison), that comparison or why there is none.
    """
    wait, transfer = breakdown.get("comm_wait_s", {}), breakdown.get("comm_transfer_s", {})
    behind, critical = breakdown.get("comm_behind_s", {}), breakdown.get("comm_critical_s", {})
    parts = []
    for kind, total in breakdown["comm_s"].items():
        if not total:
            continue
        if kind in wait:
            queued = behind.get(kind, 0.0)
            parts.append(
                (f"{kind} {critical[kind] * 1e3:.2f} all in to all out, per rank: " if kind in critical else f"{kind} ")
                + f"transfer {transfer[kind] * 1e3:.2f}, waiting for peers {wait[kind] * 1e3:.2f}"
                + (f", behind other collectives {queued * 1e3:.2f}" if queued >= 5e-6 else "")
            )
        else:
            parts.append(f"{kind} {total * 1e3:.2f} (waiting not told apart: the ranks' collectives differed)")
    lines = []
    if parts:
        slowest = breakdown.get("slowest_rank")
        late = breakdown.get("waited_for_rank_s", [])
        lines.append(
            "collectives per profiled step, ms: "
            + "; ".join(parts)
            + (
                f" (rank {slowest} is the slowest: the others waited {late[slowest] * 1e3:.2f} ms per step for it)"
                if slowest is not None
                else ""
            )
        )
    if versus:
        lines.append("comms per step, measured vs model: " + _versus_text(versus))
    return lines


def _versus_text(versus: dict) -> str:
    """comm_vs_model's rows on one line: each row's ratio or why not; one reason for all said once."""
    rows = {k: v for k, v in versus.items() if isinstance(v, dict)}
    why = {k: v.get("why", "no model figure") for k, v in rows.items() if not v.get("compared", v["ratio"] is not None)}
    if rows and len(why) == len(rows) and len(set(why.values())) == 1:
        return f"not compared ({next(iter(why.values()))})"
    parts = [
        f"{k} not compared ({why[k]})"
        if k in why
        else f"{k} {v['measured_s'] * 1e3:.2f} vs {v['model_s'] * 1e3:.2f} ms (x{v['ratio']:.2f})"
        for k, v in rows.items()
    ]
    return "; ".join(parts) + f" (model: {versus.get('model', 'topology config')})"
