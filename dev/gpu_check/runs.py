"""Running a step's command within the budget, and reading what a dlrm.train run left behind."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Step:
    """One step: its command (a process), and where its run writes (a run directory or a JSON file)."""

    name: str
    description: str
    command: list[str]
    output: Path
    result: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Runs steps one at a time, each in its own session, killed at its time limit; none starts once fewer
    than `min_start_s` seconds of `budget_s` are left. Each step's console goes to <out>/<step>.log."""

    def __init__(self, out: Path, budget_s: float, min_start_s: float) -> None:
        self.out, self.budget_s, self.min_start_s = out, budget_s, min_start_s
        self.t0 = time.monotonic()

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget_s - self.spent()

    def run(self, step: Step, timeout_s: float) -> tuple[dict[str, Any], str] | None:
        """The step's result (command, exit code, wall seconds, console tail) and console text; None if
        the budget leaves too little to start it."""
        res: dict[str, Any] = {"name": step.name, "description": step.description, "command": step.command}
        step.result = res
        if self.left() < self.min_start_s:
            return None
        timeout = max(1.0, min(timeout_s, self.left()))
        log = self.out / f"{step.name}.log"
        res.update(timeout_s=round(timeout, 1), log=str(log), output=str(step.output))
        start = time.monotonic()
        with open(log, "w") as f:
            f.write("$ " + " ".join(step.command) + "\n")
            f.flush()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            proc = subprocess.Popen(
                step.command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the step and anything it started
                proc.wait()
                code = None
        text = log.read_text(errors="replace")
        res.update(wall_s=round(time.monotonic() - start, 3), exit_code=code, timed_out=code is None)
        res["console_tail"] = text.splitlines()[-15:]
        return res, text


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


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
        if isinstance(rec, dict):
            records = [] if rec.get("event") == "start" else records
            records.append(rec)
    return records


def checkpoints(run_dir: Path) -> list[str]:
    """Complete checkpoints in <run_dir>/checkpoints (step_N directories; .partial ones are not)."""
    d = run_dir / "checkpoints"
    return sorted(p.name for p in d.glob("step_*") if p.is_dir()) if d.is_dir() else []


def figures(run_dir: Path) -> dict[str, Any]:
    """What a dlrm.train run recorded: summary.json's headline numbers, and from metrics.jsonl the
    evaluations, log records, mean step time and peak GPU memory."""
    s = read_json(run_dir / "summary.json") or {}
    recs = read_metrics(run_dir)
    logs = [r for r in recs if "step_s" in r]
    evals = [r for r in recs if "eval_logloss" in r]
    gpu = [r["peak_gpu_mem_mb"] for r in logs if isinstance(r.get("peak_gpu_mem_mb"), int | float)]
    rss = s.get("peak_rss_mb_per_rank") or [r["peak_rss_mb"] for r in logs if "peak_rss_mb" in r]
    plan = [p for p in s.get("sharding_plan") or [] if isinstance(p, dict)]
    return {
        "summary_found": bool(s),
        "device": s.get("device"),
        "steps": s.get("steps"),
        "global_batch_size": s.get("global_batch_size"),
        "train_samples_per_s": s.get("train_samples_per_s"),
        "final_loss": s.get("final_loss"),
        "eval_auc": s.get("eval_auc"),
        "eval_logloss": s.get("eval_logloss"),
        "evaluations": len(evals),
        "log_records": len(logs),
        "mean_step_s": sum(r["step_s"] for r in logs) / len(logs) if logs else None,
        "peak_gpu_mem_mb": max(gpu) if gpu else None,
        "peak_rss_mb": max(rss) if rss else None,
        "sharding_types": sorted({str(p.get("sharding_type")) for p in plan}),
        "compute_kernels": sorted({str(p.get("compute_kernel")) for p in plan}),
        "checkpoints": checkpoints(run_dir),
    }


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def num(x: Any, spec: str = ",.0f") -> str:
    """A figure for a progress line: formatted by `spec`, or "n/a"."""
    return format(x, spec) if finite(x) else "n/a"


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
