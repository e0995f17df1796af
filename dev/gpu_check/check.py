"""The check itself: the machine's context (device, sizes, the card's memory), running each step's
process into the report, and the steps in ORDER (lifecycle.py: a run saved, resumed and evaluated on
another plan; features.py: speed, precisions, the UVM cache, tables as large as the card holds)."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

from dev.gpu_check import sizing
from dev.gpu_check.report import Report
from dev.gpu_check.runs import ROOT, Runner, Step, figures

PROBES = ROOT / "dev" / "gpu_check" / "probes.py"


def has_option(section: str, name: str, value: str | None = None) -> bool:
    """Whether this version's config schema (dlrm.config) has `section.name`, with `value` among its choices
    (the check also runs older trees, as a bundle carries them)."""
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


class Check:
    """Runs the steps in ORDER and keeps the report up to date; what a step needs of the machine."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.device, self.quick = args, args.device, bool(args.quick)
        self.sz = sizing.QUICK if self.quick else sizing.FULL
        self.out: Path = args.out.resolve()
        self.work: Path = (args.work or args.out / "runs").resolve()
        self.logs: Path = (args.logs or args.out).resolve()
        self.runner = Runner(self.logs, args.budget_s, self.sz.min_start_s)
        header = {"device": self.device, "quick": self.quick, "budget_s": args.budget_s}
        self.report = Report(self.out, {**header, "out": str(self.out), "work": str(self.work)})
        gpus = self.report.data["gpus"] or []
        self.card_mib: int | None = gpus[0]["memory_mib"] if gpus and self.device == "cuda" else None

    # -- what steps share ----------------------------------------------------------------------------

    def topology(self) -> list[str]:
        """One rank; on cuda the card's own memory for the planner and the memory check."""
        if self.device != "cuda":
            return ["topology=cpu"]
        hbm = [f"topology.hbm_GB={self.card_mib * 2**20 / 1e9:.1f}"] if self.card_mib else []
        return ["topology=dgx_h100", "topology.ranks_per_node=1", *hbm]

    def no_breakdown(self) -> list[str]:
        return ["trainer.breakdown=false"] if has_option("trainer", "breakdown") else []

    def train_command(self, *overrides: str) -> list[str]:
        return [self.args.python, "-m", "dlrm.train", *overrides]

    def probe_command(self, probe: str, out: Path, *args: str) -> list[str]:
        return [self.args.python, str(PROBES), probe, "--out", str(out), *args]

    def save(self) -> None:
        self.report.save(self.runner.spent())

    def execute(self, step: Step) -> tuple[dict[str, Any], str] | None:
        """Run `step` (recorded in the report; skipped when the budget does not allow it to start)."""
        res = self.report.add({"name": step.name, "description": step.description})
        res.update(status="running", passed=False, reason="running (a report cut short here ended during this step)")
        self.save()
        done = self.runner.run(step, self.sz.timeout_s[step.name])
        if done is None:
            self.skip(res, f"budget: {self.runner.spent():.0f} s of --budget-s {self.args.budget_s} spent")
            return None
        res.update(done[0])
        if step.output.is_dir() or step.output.suffix != ".json":
            res["figures"] = figures(step.output)
        return res, done[1]

    def skip(self, res: dict[str, Any], reason: str) -> None:
        self.report.skip(res, reason)
        self.save()

    def judge(self, res: dict[str, Any], problems: list[str], ok_reason: str, headline: str = "") -> None:
        res["headline"] = headline
        self.report.judge(res, problems, ok_reason)
        self.save()

    def unavailable(self, name: str, reason: str, **more: Any) -> None:
        self.report.unavailable(name, reason, **more)
        self.save()

    # -- the steps -------------------------------------------------------------------------------------

    def run(self) -> int:
        from dev.gpu_check import features, lifecycle

        steps = {**lifecycle.STEPS, **features.STEPS}
        assert set(steps) == set(sizing.ORDER), "every step has its place in ORDER"
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.work.exists():
            shutil.rmtree(self.work)  # a fresh start: resume=auto must find train's checkpoints only
        self.work.mkdir(parents=True)
        self.save()
        card = f", card {self.report.data['gpus'][0]['name']}" if self.card_mib else ""
        quick = " (quick)" if self.quick else ""
        print(f"[gpu_check] device {self.device}{quick}{card}, budget {self.args.budget_s} s, report "
              f"{self.out / 'report.json'}", flush=True)  # fmt: skip
        results: dict[str, dict | None] = {}
        for name in sizing.ORDER:
            results[name] = steps[name](self, results)
        return 0 if self.report.finish(self.runner.spent()) else 1
