"""A finished run's summary.json rebuilt from what outlived it: metrics.jsonl and the manifest of the
checkpoint the run ended on (a kill after the last checkpoint and before the summary loses only it).
No torch: it runs before anything is built."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dlrm.checkpoint.layout import MANIFEST
from dlrm.checkpoint.manifest import read_manifest
from dlrm.common.io import UnreadableFileError, read_bounded, write_json_atomic

METRICS_LIMIT = 1 << 30  # a JSON line per log window and evaluation: far below this for any real run
_EVAL_KEYS = ("auc", "logloss", "ne", "calibration")


def _records(metrics: Path) -> tuple[list[dict], int]:
    """The JSON objects of metrics.jsonl in file order, and the count of lines that are not one (a
    line cut by a kill)."""
    records, unreadable = [], 0
    for line in read_bounded(metrics, METRICS_LIMIT).splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        elif line.strip():
            unreadable += 1
    return records, unreadable


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def rebuild_summary(run_dir: Path, checkpoint: Path, backend: str, topology: str, global_batch_size: int) -> str:
    """Write run_dir/summary.json from run_dir/metrics.jsonl and `checkpoint`'s manifest.

    Figures that neither holds (peak memory, the step breakdown, skipped steps) are left out.

    Args:
        run_dir: the finished run's directory.
        checkpoint: the checkpoint the run ended on.
        backend, topology, global_batch_size: the run's, as its config says.

    Returns:
        What the summary was rebuilt from, for the console.
    """
    manifest = read_manifest(checkpoint)
    step = manifest["step"]
    metrics = run_dir / "metrics.jsonl"
    try:
        records, unreadable = _records(metrics)
    except (FileNotFoundError, UnreadableFileError):
        records, unreadable = [], 0
    # a continuation records again the steps after its checkpoint: the last record of a step is the kept one
    windows = [r for r in records if "loss" in r and r["step"] <= step]
    evals = [r for r in records if "eval_auc" in r and r["step"] <= step]
    evaluation = evals[-1] if evals else {}
    recorded = manifest.get("run_time")
    run_time: dict = recorded if isinstance(recorded, dict) else {}
    timed, seconds = run_time.get("timed_steps"), _number(run_time.get("train_seconds"))
    summary = {
        "world_size": manifest.get("world_size"),
        "backend": backend,
        "topology": topology,
        "sharding_plan": manifest.get("sharding_plan"),
        "steps": step,
        "global_batch_size": global_batch_size,
        "train_samples_per_s": timed * global_batch_size / seconds if isinstance(timed, int) and seconds else None,
        "timed_steps": timed if isinstance(timed, int) else 0,
        "invocations": run_time.get("invocations"),
        "final_loss": _number(windows[-1]["loss"]) if windows else None,
        **{f"eval_{k}": _number(evaluation.get(f"eval_{k}")) for k in _EVAL_KEYS},
        **{k: _number(v) for k, v in evaluation.items() if k.startswith("eval_") and "/" in k},
        "wall_time_s": _number(run_time.get("wall_seconds")),
        "rebuilt_from": [str(metrics)] * bool(records) + [str(checkpoint / MANIFEST)],
        "unreadable_metrics_lines": unreadable,
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return " and ".join(summary["rebuilt_from"])
