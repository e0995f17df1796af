"""The check's one JSON report, rewritten atomically after every step (a run cut short leaves what it
did), and one progress line per step on stdout."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dev.gpu_check import environment
from dlrm.common.io import write_atomic


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Report:
    """report.json under `out`: the card and the stack first, then each step's result (`steps`), what
    this machine cannot run (`not_available`, with the reason), and the verdict."""

    def __init__(self, out: Path, header: dict[str, Any]) -> None:
        self.path = out / "report.json"
        self.steps: list[dict[str, Any]] = []
        self.not_available: list[dict[str, Any]] = []
        self.data: dict[str, Any] = {
            "check": "dlrm GPU acceptance check (dev/gpu_check)",
            "started": now_iso(),
            **header,
            "gpus": environment.gpus(),
            "stack": environment.stack(),
            "commit": environment.source_commit(),
            "steps": self.steps,
            "not_available": self.not_available,
            "verdict": None,
        }

    def save(self, elapsed_s: float) -> None:
        self.data["elapsed_s"] = round(elapsed_s, 3)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, (json.dumps(self.data, indent=2, default=str) + "\n").encode())

    def add(self, res: dict[str, Any]) -> dict[str, Any]:
        self.steps.append(res)
        return res

    def unavailable(self, name: str, reason: str, **more: Any) -> None:
        self.not_available.append({"name": name, "reason": reason, **more})

    def skip(self, res: dict[str, Any], reason: str) -> None:
        res.update(status="skipped", passed=False, reason=reason)
        self.progress(res)

    def judge(self, res: dict[str, Any], problems: list[str], ok_reason: str) -> None:
        """Passed when the step's process ended well and `problems` is empty; else the reasons, in one line."""
        if res.get("timed_out"):
            problems.insert(0, f"timed out after {res['timeout_s']} s")
        elif res.get("exit_code") != 0 and not res.get("expect_refusal"):
            problems.insert(0, f"exit code {res.get('exit_code')}")
        passed = not problems
        res.update(
            status="passed" if passed else "failed", passed=passed, reason=ok_reason if passed else "; ".join(problems)
        )
        self.progress(res)

    def progress(self, res: dict[str, Any]) -> None:
        wall = f" in {res['wall_s']:.1f} s" if "wall_s" in res else ""
        headline = f" ({res['headline']})" if res.get("headline") else ""
        print(f"[gpu_check] {res['name']}: {res['status']}{wall}{headline}: {res['reason']}", flush=True)

    def finish(self, elapsed_s: float) -> bool:
        """The verdict: every step that was to run passed, and at least one ran. Returns it."""
        ran = [s for s in self.steps if s.get("status") != "skipped"]
        failed = [s["name"] for s in self.steps if not s.get("passed")]
        passed = not failed and bool(ran)
        self.data["verdict"] = {
            "passed": passed,
            "steps_passed": [s["name"] for s in self.steps if s.get("passed")],
            "steps_failed_or_skipped": failed,
            "not_available": [n["name"] for n in self.not_available],
            "summary": f"PASS: {len(ran)} steps passed" if passed else f"FAIL: {', '.join(failed)} did not pass",
        }
        self.data["finished"] = now_iso()
        self.save(elapsed_s)
        print(f"[gpu_check] verdict: {self.data['verdict']['summary']} ({elapsed_s:.1f} s)", flush=True)
        for n in self.not_available:
            print(f"[gpu_check] {n['name']}: {n['reason']}", flush=True)
        return passed
