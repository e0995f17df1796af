"""What a GPU adds: speed at the MLPerf DCNv2 shape, half-precision tables and comms, the UVM cache
through an evaluation, and tables as large as the card holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dev.gpu_check import sizing
from dev.gpu_check.runs import Step, finite, first_error_line, num, read_json

if TYPE_CHECKING:
    from dev.gpu_check.check import Check


def gpu_model(c: Check, cap: int | None) -> list[str]:
    """bench_dcnv2 (the MLPerf DCNv2 model, row-wise Adagrad at MLPerf's lr) at one GPU's batch, on this
    machine's topology, the tables capped at `cap` rows."""
    tables = sizing.table_rows()
    return [
        "experiment=bench_dcnv2",
        *c.topology(),
        f"data.global_batch_size={c.sz.gpu_batch}",
        "data.eval_batches=2",
        *c.no_breakdown(),
        *sizing.cap_overrides(tables, sizing.QUICK_TABLE_ROWS if c.quick else cap),
    ]


def throughput(c: Check, results: dict) -> dict[str, Any] | None:
    s, out = c.sz, c.work / "throughput.json"
    args = ["--warmup", str(s.warmup), "--windows", str(s.windows), "--window", str(s.window)]
    what = (
        f"bench_dcnv2 at {s.gpu_batch} per step, tables capped at {sizing.THROUGHPUT_TABLE_ROWS:,} rows, breakdown off"
    )
    done = c.execute(
        Step(
            "throughput",
            what,
            c.probe_command("throughput", out, *args, *gpu_model(c, sizing.THROUGHPUT_TABLE_ROWS)),
            out,
        )
    )
    if done is None:
        return None
    res, _ = done
    m = res["measured"] = read_json(out) or {}
    problems = []
    if not (finite(m.get("samples_per_s")) and m["samples_per_s"] > 0 and finite(m.get("final_loss"))):
        problems.append(f"no finite samples/s and loss: {m.get('samples_per_s')}, {m.get('final_loss')}")
    if c.device == "cuda" and not (finite(m.get("device_ms_per_step")) and m["device_ms_per_step"] > 0):
        problems.append("no device time per step (CUDA events)")
    rate = m.get("samples_per_s") or 0
    res["of_mlperf_per_gpu"] = rate / sizing.MLPERF_PER_GPU
    mlperf = f" ({res['of_mlperf_per_gpu']:.2f} of MLPerf's 1.72M per H100)" if c.device == "cuda" else ""
    headline = (
        f"{num(rate)} samples/s{mlperf}, host {num(m.get('host_ms_per_step'), '.2f')} ms/step, "
        f"device {num(m.get('device_ms_per_step'), '.2f')} ms/step"
    )
    c.judge(res, problems, "measured", headline)
    return res


def fp16(c: Check, results: dict) -> dict[str, Any] | None:
    """fp16 tables with fp16 comms both ways (the gradients loss-scaled)."""
    return _precision_run(
        c, "fp16", ["model.embedding_precision=fp16", "sharding.qcomms_forward=fp16", "sharding.qcomms_backward=fp16"]
    )


def bf16_qcomms(c: Check, results: dict) -> dict[str, Any] | None:
    if c.device != "cuda":
        c.unavailable(
            "bf16_qcomms", "not run: TorchRec sends bf16 comms as fp16 on Gloo, so the config refuses them on CPU"
        )
        return None
    return _precision_run(c, "bf16_qcomms", ["sharding.qcomms_forward=bf16", "sharding.qcomms_backward=bf16"])


def _precision_run(c: Check, name: str, overrides: list[str]) -> dict[str, Any] | None:
    run_dir, s = c.work / name, c.sz
    command = c.train_command(*c.topology(), f"data.global_batch_size={s.batch}", f"data.eval_batches={s.eval_batches}",
                              "trainer.progress=lines", f"trainer.log_every_steps={s.log_every}", *c.no_breakdown(),
                              f"trainer.max_steps={s.steps // 2}", "checkpoint.at_end=false", *overrides,
                              f"hydra.run.dir={run_dir}")  # fmt: skip
    done = c.execute(Step(name, "the default model with " + " ".join(overrides), command, run_dir))
    if done is None:
        return None
    res, _ = done
    f, problems = res["figures"], []
    if f["steps"] != s.steps // 2 or not finite(f["final_loss"]) or not finite(f["eval_logloss"]):
        problems.append(f"steps {f['steps']}, final loss {f['final_loss']}, eval logloss {f['eval_logloss']}")
    ok = f"trained: loss {num(f['final_loss'], '.5f')}, auc {num(f['eval_auc'], '.5f')}"
    c.judge(res, problems, ok, f"{num(f['train_samples_per_s'])} samples/s")
    return res


def bf16_tables(c: Check, results: dict) -> dict[str, Any] | None:
    """model.embedding_precision=bf16 is refused in one line, before any process group (fbgemm 1.8 trains
    no bf16 weights); bf16_probe asks this machine's fbgemm directly."""
    run_dir = c.work / "bf16_tables"
    command = c.train_command(*c.topology(), "model.embedding_precision=bf16", f"hydra.run.dir={run_dir}")
    done = c.execute(Step("bf16_tables", "model.embedding_precision=bf16: the one-line refusal", command, run_dir))
    if done is None:
        return None
    res, text = done
    res["expect_refusal"] = True
    res["refusal"] = line = first_error_line(text)
    problems = []
    if res["exit_code"] != 2 or not line or "model.embedding_precision" not in line:
        problems.append(f"exit code {res['exit_code']}, no one-line refusal naming model.embedding_precision: {line}")
    c.judge(res, problems, "refused in one line", line or "")
    return res


def bf16_probe(c: Check, results: dict) -> dict[str, Any] | None:
    if c.device != "cuda":
        c.unavailable("bf16_probe", "not run: fbgemm's GPU kernels only (its CPU ones have no bf16 weights at all)")
        return None
    out = c.work / "bf16_probe.json"
    what = (
        "fbgemm's TBE with bf16 weights on the GPU, cache precision bf16 (TorchRec's) and fp32: a lookup and an update"
    )
    done = c.execute(Step("bf16_probe", what, c.probe_command("bf16", out), out))
    if done is None:
        return None
    res, _ = done
    m = res["measured"] = read_json(out) or {}
    trains = any((m.get(k) or {}).get("trains") for k in ("cache_bf16", "cache_fp32"))
    res["refusal_can_be_lifted"] = trains
    verdict = (
        "fbgemm trains bf16 tables here: revisit the refusal (dlrm/config)"
        if trains
        else "fbgemm refuses bf16 tables, as expected"
    )
    c.judge(res, [] if m else ["no result written"], verdict, "; ".join(f"{k}: {v}" for k, v in m.items()))
    return res


def uvm_caching(c: Check, results: dict) -> dict[str, Any] | None:
    if c.device != "cuda":
        c.unavailable(
            "uvm_caching", "not run: sharding.compute_kernel=fused_uvm_caching and the prefetch pipeline need a GPU"
        )
        return None
    s, out = c.sz, c.work / "uvm_caching.json"
    cache = [
        "sharding.compute_kernel=fused_uvm_caching",
        "sharding.cache_load_factor=0.05",
        "sharding.prefetch_pipeline=true",
        "trainer.pipeline=true",
    ]
    what = (
        f"tables in host memory behind a 5% HBM cache, prefetch pipeline, an evaluation after step {s.uvm_steps // 2}"
    )
    command = c.probe_command(
        "uvm", out, "--steps", str(s.uvm_steps), *gpu_model(c, sizing.THROUGHPUT_TABLE_ROWS), *cache
    )
    done = c.execute(Step("uvm_caching", what, command, out))
    if done is None:
        return None
    res, _ = done
    m = res["measured"] = read_json(out) or {}
    evals, problems = m.get("evaluations") or [], []
    if "fused_uvm_caching" not in (m.get("plan_kernels") or []):
        problems.append(f"plan kernels {m.get('plan_kernels')}: no fused_uvm_caching")
    if m.get("steps") != s.uvm_steps or len(evals) < 2:
        problems.append(f"steps {m.get('steps')}, {len(evals)} evaluations")
    locked = [e.get("locked_lines_after") for e in evals]
    if any(n != 0 for n in locked):
        problems.append(f"cache lines left locked after the evaluations: {locked}")
    hits = [(e.get("training_before") or {}).get("hit_rate") for e in evals] + [None, None]
    headline = f"hit rate {hits[0]} before the mid-run evaluation, {hits[1]} after; lines locked after each: {locked}"
    c.judge(res, problems, "trained through the evaluation with no line left locked", headline)
    return res


def full_tables(c: Check, results: dict) -> dict[str, Any] | None:
    """The MLPerf DCNv2 tables (104.5 GB in fp32) capped to sizing.TABLE_SHARE of the card's memory (whole
    where they fit), the planner told the card's memory: step time and peak memory, or the memory check's
    one-line refusal (recorded as a failure)."""
    run_dir, s, tables = c.work / "full_tables", c.sz, sizing.table_rows()
    card_gb, cap = sizing.card_tables(c.card_mib) if c.card_mib else (None, None)
    capped = (
        [(min(r, cap) if cap else r, d) for r, d in tables]
        if not c.quick
        else [(min(r, sizing.QUICK_TABLE_ROWS), d) for r, d in tables]
    )
    command = c.train_command(
        *gpu_model(c, cap),
        f"trainer.max_steps={s.full_steps}",
        f"trainer.log_every_steps={max(1, s.full_steps // 3)}",
        "trainer.progress=lines",
        "trainer.tensorboard=false",
        "checkpoint.at_end=false",
        f"hydra.run.dir={run_dir}",
    )
    what = (
        "MLPerf DCNv2 tables with row-wise Adagrad, "
        + (f"capped at {cap:,} rows" if cap else "whole")
        + " to fit the card"
    )
    done = c.execute(Step("full_tables", what, command, run_dir))
    if done is None:
        return None
    res, text = done
    f, problems = res["figures"], []
    res.update(
        card_GB=card_gb, row_cap=sizing.QUICK_TABLE_ROWS if c.quick else cap, table_GB=sizing.table_bytes(capped) / 1e9
    )
    if res["exit_code"] == 2:
        res["refusal"] = first_error_line(text)
        problems.append(f"refused: {res['refusal']}")
    elif f["steps"] != s.full_steps or not isinstance(f["mean_step_s"], int | float):
        problems.append(f"steps {f['steps']}, step time {f['mean_step_s']}")
    memory = f"GPU {num(f['peak_gpu_mem_mb'])}" if c.device == "cuda" else f"RSS {num(f['peak_rss_mb'])}"
    headline = f"{res['table_GB']:.2f} GB of tables and state, {num(f['mean_step_s'], '.4f')} s/step, peak {memory} MB"
    c.judge(res, problems, f"kernels {f['compute_kernels']}", headline)
    return res


STEPS = {
    "throughput": throughput,
    "fp16": fp16,
    "bf16_qcomms": bf16_qcomms,
    "bf16_tables": bf16_tables,
    "bf16_probe": bf16_probe,
    "uvm_caching": uvm_caching,
    "full_tables": full_tables,
}
