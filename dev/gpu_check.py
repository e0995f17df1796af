#!/usr/bin/env python3
"""The GPU acceptance check: the real `python -m dlrm.train` on one GPU, one JSON report.

    python dev/gpu_check.py [--out DIR] [--work DIR] [--budget-s N] [--device cuda|cpu] [--quick]

Each step is one `python -m dlrm.train` process (one rank: `topology=dgx_h100 topology.ranks_per_node=1`
on cuda, `topology=cpu` on cpu) with its own timeout; no step starts once --budget-s seconds are spent.
The steps, in this order (`ORDER`: what a first GPU user needs first; their timeouts fit the default budget):

- train: the default model, the per-phase breakdown on (trainer.breakdown=true), several log steps,
  evaluations on the training device, periodic checkpoints, a named run directory;
- per_step_sync: on cuda, train's run again with trainer.sync_every_step=true (the host waits for the GPU
  after every step): its samples/s beside train's (sync off, the default) and their ratio; on cpu there
  is nothing to wait for, so it is listed under not_available;
- uvm_caching: only where this version has the option (sharding.compute_kernel=fused_uvm_caching) and on
  cuda, with a mid-run evaluation; else listed under not_available with the reason;
- resume: the same run continued (trainer.resume=auto) to more steps: the console must say it resumed;
- eval_only_reshard: train's last checkpoint evaluated with sharding=row_wise (train used table_wise):
  eval AUC and log loss equal to train's final evaluation within 1e-5 relative (same data and seed);
- big_tables: the MLPerf DCNv2 model (model=mlperf_dcnv2, optim=rowwise_adagrad) at full size on cuda
  (104.5 GB of fp32 tables in one H200's HBM: topology.hbm_GB=141), a few steps: step time, peak GPU
  memory; or the memory check's refusal line. With --quick every table is capped at QUICK_TABLE_ROWS rows
  by Hydra overrides (model.tables.I.rows=N), as `dlrm.bench.training --max-table-rows` caps them.

The report (<out>/report.json, rewritten atomically after every step, so a run cut short leaves what it
did) holds per step: the command, exit code, wall seconds, the figures of the run's summary.json and
metrics.jsonl, passed and the reason; then not_available and the verdict. Each step's console output is
in <out>/<step>.log; run directories (checkpoints) go under --work (default <out>/runs).
--device cpu implies --quick: tiny steps and batches, the whole check in about a minute on 2 cores
(tests/dev/test_gpu_check.py runs it so). Exit status: 0 when every step that ran passed, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # dlrm from this checkout (the bundle's source tree has no install)

from dlrm.common.io import write_atomic  # noqa: E402

REL_TOL = 1e-5  # eval_only reshard vs train's final evaluation
QUICK_TABLE_ROWS = 1000  # --quick: every MLPerf DCNv2 table capped at this many rows
H200_HBM_GB = 141  # one H200's HBM; the dgx_h100 topology says 80 (an H100's)


@dataclass
class Sizes:
    """Steps, batches and timeouts of one check: full (a GPU) or quick (CPU, or a smoke test on a GPU)."""

    batch: int
    steps: int
    resume_steps: int
    log_every: int
    eval_every: int
    ckpt_every: int
    eval_batches: int
    big_batch: int
    big_steps: int
    big_log_every: int
    timeout_s: dict[str, int] = field(default_factory=dict)
    min_start_s: int = 20  # a step is not started with less budget left than this


# What a first GPU user needs first: training that runs ahead of the GPU (and the cost of waiting for it
# every step), tables in host memory behind a cache through a mid-run evaluation, save -> resume ->
# eval-only on another plan, then the full-size tables, which take the longest.
ORDER = ("train", "per_step_sync", "uvm_caching", "resume", "eval_only_reshard", "big_tables")
FULL = Sizes(
    batch=4096,
    steps=200,
    resume_steps=300,
    log_every=50,
    eval_every=100,
    ckpt_every=100,
    eval_batches=8,
    big_batch=8192,
    big_steps=30,
    big_log_every=10,
    timeout_s={  # in ORDER; together within the default --budget-s (480), so none is starved by another
        "train": 100,
        "per_step_sync": 60,
        "uvm_caching": 60,
        "resume": 60,
        "eval_only_reshard": 45,
        "big_tables": 150,
    },
    min_start_s=45,
)
QUICK = Sizes(
    batch=128,
    steps=8,
    resume_steps=12,
    log_every=2,
    eval_every=4,
    ckpt_every=4,
    eval_batches=2,
    big_batch=64,
    big_steps=4,
    big_log_every=2,
    timeout_s={
        "train": 120,
        "per_step_sync": 120,
        "uvm_caching": 120,
        "resume": 120,
        "eval_only_reshard": 120,
        "big_tables": 180,
    },
    min_start_s=20,
)


@dataclass
class Step:
    name: str
    description: str
    overrides: list[str]
    run_dir: Path
    result: dict[str, Any] = field(default_factory=dict)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_json_atomic(path: Path, obj: Any) -> None:
    """`obj` as JSON at `path`, through dlrm's one atomic writer (values JSON lacks as their str)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the latest invocation in <run_dir>/metrics.jsonl (after its last start event)."""
    records: list[dict[str, Any]] = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "start":
            records = []
        records.append(rec)
    return records


def read_yaml(path: Path) -> Any:
    import yaml  # PyYAML: Hydra's own need, so present wherever dlrm.train runs

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints in <run_dir>/checkpoints (step_N directories; .partial ones are not)."""
    d = run_dir / "checkpoints"
    return sorted(p for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []


def figures(run_dir: Path) -> dict[str, Any]:
    """What the run recorded: summary.json's headline numbers, and from metrics.jsonl the mean step time,
    the peak GPU memory (cuda) and the last evaluation's sample count."""
    s = read_json(run_dir / "summary.json") or {}
    recs = read_metrics(run_dir)
    logs = [r for r in recs if "step_s" in r]
    evals = [r for r in recs if "eval_logloss" in r]
    gpu = [r["peak_gpu_mem_mb"] for r in logs if isinstance(r.get("peak_gpu_mem_mb"), int | float)]
    rss = s.get("peak_rss_mb_per_rank") or [r["peak_rss_mb"] for r in logs if "peak_rss_mb" in r]
    breakdown = s.get("step_breakdown") or {}
    plan = s.get("sharding_plan") or []
    out: dict[str, Any] = {
        "summary_found": bool(s),
        "device": s.get("device"),
        "backend": s.get("backend"),
        "steps": s.get("steps"),
        "global_batch_size": s.get("global_batch_size"),
        "train_samples_per_s": s.get("train_samples_per_s"),
        "final_loss": s.get("final_loss"),
        "eval_auc": s.get("eval_auc"),
        "eval_logloss": s.get("eval_logloss"),
        "eval_samples": evals[-1].get("eval_samples") if evals else None,
        "evaluations": len(evals),
        "log_records": len(logs),
        "mean_step_s": sum(r["step_s"] for r in logs) / len(logs) if logs else None,
        "loop_wall_s": s.get("wall_time_s"),
        "job_wall_s": s.get("job_wall_time_s"),
        "peak_gpu_mem_mb": max(gpu) if gpu else None,
        "peak_rss_mb": max(rss) if rss else None,
        "sharding_types": sorted({str(p.get("sharding_type")) for p in plan if isinstance(p, dict)}),
        "compute_kernels": sorted({str(p.get("compute_kernel")) for p in plan if isinstance(p, dict)}),
        "breakdown_profiled_steps": breakdown.get("profiled_steps"),
        "breakdown_phase_s": breakdown.get("phase_s"),
        "checkpoints": [p.name for p in checkpoints(run_dir)],
    }
    return out


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def close(a: Any, b: Any, rel: float = REL_TOL) -> bool:
    return finite(a) and finite(b) and abs(a - b) <= rel * max(abs(a), abs(b))


def first_error_line(text: str) -> str | None:
    """dlrm's one-line user error (`error: ...`), else the last traceback line, else None."""
    lines = text.splitlines()
    for line in lines:
        if line.startswith("error: "):
            return line
    for line in reversed(lines):
        if line and not line.startswith(" ") and ("Error" in line or "Exception" in line):
            return line.strip()
    return None


def has_option(section: str, name: str, value: str | None = None) -> bool:
    """Whether this version's config schema (dlrm.config) has `section.name`, with `value` among its choices."""
    try:
        import dlrm.config as config

        cls = {"sharding": config.ShardingConfig, "trainer": config.TrainerConfig}[section]
        fields = {f.name: f for f in dataclasses.fields(cls)}
    except Exception:  # a schema this check cannot read has no such option for it
        return False
    if name not in fields:
        return False
    members = getattr(type(fields[name].default), "__members__", {})
    return value is None or any(str(getattr(m, "value", m)) == value for m in members.values())


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "hydra-core", "tensordict", "torchmetrics"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_info() -> list[str] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def source_commit() -> str | None:
    """The commit checked: git's HEAD, or BUNDLE_COMMIT written by dev/gpu_bundle.py into a bundle's source."""
    marker = ROOT / "BUNDLE_COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


class Check:
    """Runs the steps in order and keeps the report up to date on disk."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device: str = args.device
        self.sz = QUICK if args.quick else FULL
        self.out: Path = args.out.resolve()
        self.work: Path = (args.work or args.out / "runs").resolve()
        self.python: str = args.python
        self.t0 = time.monotonic()
        self.steps: list[dict[str, Any]] = []
        self.not_available: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {
            "check": "dlrm GPU acceptance check (dev/gpu_check.py)",
            "started": now_iso(),
            "device": self.device,
            "quick": bool(args.quick),
            "budget_s": args.budget_s,
            "commit": source_commit(),
            "versions": versions(),
            "gpus": gpu_info(),
            "out": str(self.out),
            "work": str(self.work),
            "steps": self.steps,
            "not_available": self.not_available,
            "verdict": None,
        }

    # -- running ------------------------------------------------------------------------------------

    def topology(self) -> list[str]:
        if self.device == "cuda":
            return ["topology=dgx_h100", "topology.ranks_per_node=1"]
        return ["topology=cpu"]

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.spent(), 3)
        write_json_atomic(self.out / "report.json", self.report)

    def execute(self, step: Step) -> tuple[dict[str, Any], str] | None:
        """Run one step's dlrm.train; None (recorded as skipped) if the budget does not allow it to start."""
        res: dict[str, Any] = {"name": step.name, "description": step.description}
        step.result = res
        self.steps.append(res)
        cmd = [self.python, "-m", "dlrm.train", *step.overrides]
        res["command"] = cmd
        res["run_dir"] = str(step.run_dir)
        left = self.args.budget_s - self.spent()
        if left < self.sz.min_start_s:
            self.skip(res, f"budget: {self.spent():.0f} s of --budget-s {self.args.budget_s} spent")
            return None
        timeout = max(1.0, min(float(self.sz.timeout_s[step.name]), left))
        res["timeout_s"] = round(timeout, 1)
        log = self.out / f"{step.name}.log"
        res["log"] = str(log)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        res.update(status="running", passed=False, reason="running (a report cut short here ended during this step)")
        self.save()
        start = time.monotonic()
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the step and anything it started
                proc.wait()
                code = None
        res["wall_s"] = round(time.monotonic() - start, 3)
        res["exit_code"] = code
        res["timed_out"] = code is None
        text = log.read_text(errors="replace")
        res["console_tail"] = text.splitlines()[-15:]
        res["figures"] = figures(step.run_dir)
        return res, text

    def skip(self, res: dict[str, Any], reason: str) -> None:
        res.update(status="skipped", passed=False, reason=reason)
        self.progress(res)

    def judge(self, res: dict[str, Any], problems: list[str], ok_reason: str) -> None:
        if res.get("timed_out"):
            problems.insert(0, f"timed out after {res['timeout_s']} s")
        elif res.get("exit_code") != 0:
            problems.insert(0, f"exit code {res.get('exit_code')}")
        passed = not problems
        res.update(
            status="passed" if passed else "failed", passed=passed, reason=ok_reason if passed else "; ".join(problems)
        )
        self.progress(res)

    def progress(self, res: dict[str, Any]) -> None:
        f = res.get("figures") or {}
        bits = []
        for key, fmt in (
            ("train_samples_per_s", "{:.0f} samples/s"),
            ("eval_auc", "auc {:.5f}"),
            ("mean_step_s", "{:.4f} s/step"),
            ("peak_gpu_mem_mb", "peak GPU {:.0f} MB"),
        ):
            if isinstance(f.get(key), int | float):
                bits.append(fmt.format(f[key]))
        wall = f" in {res['wall_s']:.1f} s" if "wall_s" in res else ""
        extra = f" ({', '.join(bits)})" if bits else ""
        print(f"[gpu_check] {res['name']}: {res['status']}{wall}{extra}: {res['reason']}", flush=True)
        self.save()

    # -- the steps --------------------------------------------------------------------------------

    def base(self) -> list[str]:
        s = self.sz
        return [
            *self.topology(),
            f"data.global_batch_size={s.batch}",
            f"data.eval_batches={s.eval_batches}",
            "trainer.progress=lines",
            f"trainer.log_every_steps={s.log_every}",
            f"trainer.eval_every_steps={s.eval_every}",
            "trainer.breakdown=true",
            f"checkpoint.every_steps={s.ckpt_every}",
            "checkpoint.keep=100",  # the eval_only step loads train's last checkpoint after resume saved more
        ]

    def train(self) -> dict[str, Any] | None:
        run_dir = self.work / "train"
        step = Step(
            "train",
            "default model; breakdown on; log steps; evaluation on the training device; periodic checkpoints",
            [*self.base(), f"trainer.max_steps={self.sz.steps}", f"hydra.run.dir={run_dir}"],
            run_dir,
        )
        done = self.execute(step)
        if done is None:
            return None
        res, _ = done
        f = res["figures"]
        problems = []
        if f["steps"] != self.sz.steps:
            problems.append(f"summary steps {f['steps']} != trainer.max_steps={self.sz.steps}")
        if f["device"] != self.device:
            problems.append(f"trained on {f['device']}, not {self.device}")
        if not (f["breakdown_profiled_steps"] or 0) >= 1 or not f["breakdown_phase_s"]:
            problems.append("no step_breakdown in summary.json (trainer.breakdown=true)")
        if f["log_records"] < self.sz.steps // self.sz.log_every:
            problems.append(f"{f['log_records']} log records, expected {self.sz.steps // self.sz.log_every}")
        if f["evaluations"] < self.sz.steps // self.sz.eval_every or not finite(f["eval_logloss"]):
            want = self.sz.steps // self.sz.eval_every
            problems.append(f"{f['evaluations']} evaluations (expected {want}), logloss {f['eval_logloss']}")
        if f["eval_auc"] is None:
            problems.append("no eval AUC")
        want = f"step_{self.sz.steps:08d}"
        if want not in f["checkpoints"]:
            problems.append(f"no checkpoint {want} (found {f['checkpoints']})")
        self.judge(res, problems, f"{f['steps']} steps, {f['evaluations']} evaluations, checkpoints {f['checkpoints']}")
        return res

    def resume(self) -> dict[str, Any]:
        run_dir = self.work / "train"
        step = Step(
            "resume",
            "the train run continued: trainer.resume=auto, more trainer.max_steps",
            [
                *self.base(),
                f"trainer.max_steps={self.sz.resume_steps}",
                "trainer.resume=auto",
                f"hydra.run.dir={run_dir}",
            ],
            run_dir,
        )
        done = self.execute(step)
        if done is None:
            return step.result
        res, text = done
        f = res["figures"]
        problems = []
        want = f"at step {self.sz.steps}"
        resumed = [line for line in text.splitlines() if "resumed from " in line and want in line]
        res["resumed_line"] = resumed[0].strip() if resumed else None
        if not resumed:
            problems.append(f"the console never says 'resumed from ... {want}'")
        start = next((r for r in read_metrics(run_dir) if r.get("event") == "start"), {})
        res["start_event"] = start
        if start and not (start.get("resumed") and start.get("step") == self.sz.steps):
            problems.append(f"metrics.jsonl start event {start} is not a resume at step {self.sz.steps}")
        if f["steps"] != self.sz.resume_steps:
            problems.append(f"summary steps {f['steps']} != trainer.max_steps={self.sz.resume_steps}")
        self.judge(res, problems, f"resumed at step {self.sz.steps} and reached {f['steps']}")
        return res

    def eval_only(self, train: dict[str, Any]) -> dict[str, Any]:
        run_dir = self.work / "eval_only"
        src = self.work / "train" / "checkpoints" / f"step_{self.sz.steps:08d}"
        step = Step(
            "eval_only_reshard",
            "train's last checkpoint evaluated only, resharded to row_wise (train planned table_wise)",
            [
                *self.topology(),
                f"data.global_batch_size={self.sz.batch}",
                f"data.eval_batches={self.sz.eval_batches}",
                "trainer.progress=lines",
                "trainer.eval_only=true",
                f"trainer.resume={src}",
                "sharding=row_wise",
                f"hydra.run.dir={run_dir}",
            ],
            run_dir,
        )
        done = self.execute(step)
        if done is None:
            return step.result
        res, text = done
        f, t = res["figures"], train["figures"]
        problems = []
        res["checkpoint"] = str(src)
        res["train_sharding_types"] = t["sharding_types"]
        if f["sharding_types"] != ["row_wise"]:
            problems.append(f"sharding types {f['sharding_types']}, expected only row_wise")
        if f["sharding_types"] == t["sharding_types"]:
            problems.append("same sharding types as train: not a reshard")
        if not any("resumed from " in line and str(src) in line for line in text.splitlines()):
            problems.append(f"the console never says it loaded {src}")
        # The same eval data: the synthetic eval split depends on the data config and the seed alone.
        a, b = read_yaml(self.work / "train" / "config.yaml"), read_yaml(run_dir / "config.yaml")
        same_data = isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in ("data", "seed"))
        res["same_eval_data"] = same_data
        if not same_data:
            problems.append("the data config or seed differs from train's run: not the same eval data")
        res["train_eval_auc"], res["train_eval_logloss"] = t["eval_auc"], t["eval_logloss"]
        for key in ("eval_auc", "eval_logloss"):
            if not close(f[key], t[key]):
                problems.append(f"{key} {f[key]} != train's {t[key]} (rel tol {REL_TOL})")
        keys = ("eval_auc", "eval_logloss")
        rel = [abs(f[k] - t[k]) / max(abs(t[k]), 1e-30) for k in keys if finite(f[k]) and finite(t[k])]
        res["max_rel_diff"] = max(rel) if len(rel) == 2 else None
        ok = f"eval auc {f['eval_auc']} logloss {f['eval_logloss']} equal train's (max rel diff {res['max_rel_diff']})"
        self.judge(res, problems, ok)
        return res

    def big_tables(self) -> dict[str, Any]:
        run_dir = self.work / "big_tables"
        s = self.sz
        over = [
            *self.topology(),
            "model=mlperf_dcnv2",
            "optim=rowwise_adagrad",
            "optim.embedding.lr=0.004",  # MLPerf's (experiment=bench_dcnv2): the default 0.05 diverges
            "optim.dense.lr=0.004",
            f"data.global_batch_size={s.big_batch}",
            "data.eval_batches=2",
            f"trainer.max_steps={s.big_steps}",
            f"trainer.log_every_steps={s.big_log_every}",
            "trainer.progress=lines",
            "trainer.breakdown=false",
            "trainer.tensorboard=false",
            "checkpoint.at_end=false",  # 105 GB of tables: no checkpoint
            f"hydra.run.dir={run_dir}",
        ]
        if self.device == "cuda":
            over.append(f"topology.hbm_GB={H200_HBM_GB}")
        rows = table_rows("mlperf_dcnv2")
        capped = {}
        if self.args.quick:
            for i, n in enumerate(rows):
                if n > QUICK_TABLE_ROWS:
                    over.append(f"model.tables.{i}.rows={QUICK_TABLE_ROWS}")
                    capped[i] = n
        step = Step(
            "big_tables",
            "MLPerf DCNv2 tables with row-wise Adagrad"
            + (f" (quick: tables capped at {QUICK_TABLE_ROWS} rows)" if capped else " at full size"),
            over,
            run_dir,
        )
        done = self.execute(step)
        if done is None:
            return step.result
        res, text = done
        f = res["figures"]
        rows_used = [min(n, QUICK_TABLE_ROWS) if i in capped else n for i, n in enumerate(rows)]
        res["table_rows"] = sum(rows_used)
        res["table_GB_fp32"] = round(sum(rows_used) * 128 * 4 / 1e9, 3)
        res["tables_capped"] = len(capped)
        problems = []
        if res["exit_code"] == 2 and (err := first_error_line(text)):
            res["refusal"] = err
            problems.append(f"refused: {err}")
        elif f["steps"] != s.big_steps:
            problems.append(f"summary steps {f['steps']} != {s.big_steps}")
        if res["exit_code"] == 0:
            if not isinstance(f["mean_step_s"], int | float):
                problems.append("no step time recorded")
            mem = f["peak_gpu_mem_mb"] if self.device == "cuda" else f["peak_rss_mb"]
            if not isinstance(mem, int | float):
                problems.append("no peak memory recorded")
        self.judge(
            res,
            problems,
            f"{f['steps']} steps of {s.big_batch}: {f['mean_step_s']} s/step, "
            f"peak {'GPU' if self.device == 'cuda' else 'RSS'} "
            f"{f['peak_gpu_mem_mb'] if self.device == 'cuda' else f['peak_rss_mb']} MB; kernels {f['compute_kernels']}",
        )
        return res

    def uvm_caching(self) -> None:
        """A real UVM-caching run where the option exists and a GPU is there; else listed as not available."""
        if not has_option("sharding", "compute_kernel", "fused_uvm_caching"):
            self.not_available.append(
                {"name": "uvm_caching", "reason": "not available: no option in this version (sharding.compute_kernel)"}
            )
            return
        if self.device != "cuda":
            self.not_available.append(
                {"name": "uvm_caching", "reason": "not run: sharding.compute_kernel=fused_uvm_caching needs a GPU"}
            )
            return
        run_dir = self.work / "uvm_caching"
        over = [
            *self.base(),
            "sharding.compute_kernel=fused_uvm_caching",
            "sharding.cache_load_factor=0.01",  # a tiny HBM budget: 1% of each table's rows cached
            f"trainer.max_steps={self.sz.steps}",
            "checkpoint.every_steps=0",
            "checkpoint.at_end=false",
            f"hydra.run.dir={run_dir}",
        ]
        if has_option("sharding", "prefetch_pipeline"):
            over.append("sharding.prefetch_pipeline=true")
        done = self.execute(
            Step("uvm_caching", "tables in host memory with a 1% HBM cache (UVM caching)", over, run_dir)
        )
        if done is None:
            return
        res, _ = done
        f = res["figures"]
        problems = []
        if "fused_uvm_caching" not in f["compute_kernels"]:
            problems.append(f"plan kernels {f['compute_kernels']}: no fused_uvm_caching")
        if f["steps"] != self.sz.steps:
            problems.append(f"summary steps {f['steps']} != {self.sz.steps}")
        self.judge(res, problems, f"kernels {f['compute_kernels']}, {f['train_samples_per_s']} samples/s")

    def per_step_sync(self, train: dict[str, Any] | None) -> None:
        """train's run with the host waiting for the GPU after every step: samples/s on vs off."""
        speed = (train or {}).get("figures", {}).get("train_samples_per_s")
        if not has_option("trainer", "sync_every_step"):
            reason = "not available: no option in this version; train's samples/s is the sync-off figure"
            self.not_available.append({"name": "per_step_sync_on_off", "reason": reason, "train_samples_per_s": speed})
            return
        if self.device != "cuda":
            reason = "not run: nothing to wait for on cpu (trainer.sync_every_step acts on a GPU only)"
            self.not_available.append({"name": "per_step_sync_on_off", "reason": reason, "train_samples_per_s": speed})
            return
        run_dir = self.work / "per_step_sync"
        over = [*self.base(), f"trainer.max_steps={self.sz.steps}", "trainer.sync_every_step=true"]
        over += ["checkpoint.every_steps=0", "checkpoint.at_end=false", f"hydra.run.dir={run_dir}"]
        done = self.execute(Step("per_step_sync", "train's run, the GPU synchronized after every step", over, run_dir))
        if done is None:
            return
        res, _ = done
        on = res["figures"]["train_samples_per_s"]
        res["sync_off_samples_per_s"] = speed
        res["sync_on_over_off"] = on / speed if on and speed else None
        problems = [] if res["figures"]["steps"] == self.sz.steps else [f"summary steps {res['figures']['steps']}"]
        self.judge(res, problems, f"sync on {on} vs off {speed} samples/s (on/off {res['sync_on_over_off']})")

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.work.exists():
            shutil.rmtree(self.work)  # a fresh start: resume=auto must find train's checkpoints only
        self.work.mkdir(parents=True)
        self.save()
        print(
            f"[gpu_check] device {self.device}{' (quick)' if self.args.quick else ''}, budget {self.args.budget_s} s, "
            f"report {self.out / 'report.json'}",
            flush=True,
        )
        train = self.train()
        self.per_step_sync(train)
        self.uvm_caching()
        if train is not None and train.get("passed"):
            self.resume()
            self.eval_only(train)  # train's final checkpoint, kept by checkpoint.keep=100
        else:
            for name in ("resume", "eval_only_reshard"):
                res = {"name": name}
                self.steps.append(res)
                self.skip(res, "train did not pass")
        self.big_tables()  # in ORDER
        ran = [s for s in self.steps if s.get("status") != "skipped"]
        failed = [s["name"] for s in self.steps if not s.get("passed")]
        passed = not failed and bool(ran)
        self.report["verdict"] = {
            "passed": passed,
            "steps_passed": [s["name"] for s in self.steps if s.get("passed")],
            "steps_failed_or_skipped": failed,
            "not_available": [n["name"] for n in self.not_available],
            "summary": (
                f"PASS: {len(ran)} steps passed"
                if passed
                else f"FAIL: {', '.join(f'{s}' for s in failed)} did not pass"
            ),
        }
        self.report["finished"] = now_iso()
        self.save()
        print(f"[gpu_check] verdict: {self.report['verdict']['summary']} ({self.spent():.1f} s)", flush=True)
        for n in self.not_available:
            print(f"[gpu_check] {n['name']}: {n['reason']}", flush=True)
        return 0 if passed else 1


def table_rows(model: str) -> list[int]:
    """Rows of each table of conf/model/<model>.yaml, in order."""
    cfg = read_yaml(ROOT / "conf" / "model" / f"{model}.yaml")
    tables = cfg.get("tables", []) if isinstance(cfg, dict) else []
    return [int(t["rows"]) for t in tables]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("outputs/gpu_check"), help="report.json and the step logs")
    p.add_argument("--work", type=Path, default=None, help="the runs' directories (default <out>/runs)")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no step after this many seconds")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if nvidia-smi is found")
    p.add_argument("--quick", action="store_true", help="tiny steps, batches and tables (implied by --device cpu)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs dlrm.train")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if shutil.which("nvidia-smi") else "cpu"
    if args.device == "cpu":
        args.quick = True
    if not args.budget_s > 0:
        p.error("--budget-s must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return Check(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
