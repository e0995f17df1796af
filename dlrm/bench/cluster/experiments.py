# long file: one benchmark run end to end: its experiments (comms, train, scale), rounds and results.json
"""The Zion paper's questions measured on the emulated cluster, beside the model.

    python -m dlrm.bench.cluster --out outputs/cluster_bench              # all experiments, 3 rounds
    python -m dlrm.bench.cluster --quick --out outputs/cluster_bench_q    # fewer rounds and runs

Needs root: each run is an emulated-cluster job. Experiments (`--experiments`):

- ``comms``: the collective benchmark on 2x2, scopes world, intra and inter, against the cost model of
  the emu_2x2 topology at that uplink rate; geometric-mean error per collective and scope. Once per
  uplink rate, in the first round.
- ``train``: training on 2x2 (or `--shape`) per variant (`--variants`: flat, hierarchical, local SGD,
  each sharding type) at every `--gbits`: step time, exposed alltoall and allreduce shares, and
  comm_vs_model.
- ``scale``: weak scaling at `--batch-per-rank`: one-node runs calibrate the planner's `--scale
  --measured` projection, compared with the measured multi-node runs.

Variants run interleaved within a round, their order rotated each round; figures are medians over
rounds. `results.json` grows as runs end; `findings.md` and `findings.png` are rewritten after each
round, all atomically. `--render` rewrites them from a results.json with the current model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dlrm.bench.cluster.findings import findings, findings_md
from dlrm.bench.cluster.modelled import (
    comms_model_links,
    comms_rows,
    emulated_name,
    plan_overrides,
    projection_rows,
    remodel,
)
from dlrm.bench.cluster.plot import plot
from dlrm.bench.cluster.summaries import (
    DEFAULT_SHAPE,
    VARIANTS,
    comms_table,
    describe,
    machine,
    scale_table,
    train_record,
    train_table,
)
from dlrm.cluster.fabric import check_rate
from dlrm.common.errors import ArgumentParser, UsageError, UserError
from dlrm.common.io import output_dir_problem, write_atomic, write_json_atomic

SCHEMA = "dlrm.bench.cluster/1"
EXPERIMENTS = ("comms", "train", "scale")
COLLECTIVES = ("allreduce", "alltoall", "reduce_scatter", "allgather")
RUN_TIMEOUT_S = 600


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
    shape: tuple[int, int] = DEFAULT_SHAPE
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
    if not values:
        raise UsageError(f"{flag}={text}: give uplink rates in Gbit/s, comma-separated (e.g. {flag} 0.5,2)")
    for v in values:
        check_rate(v, flag)
    return tuple(sorted(set(values)))


def _names(text: str, flag: str, allowed: Sequence[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise UsageError(f"{flag}={text}: choose from {','.join(allowed)} (comma-separated)")
    return names


def _shape(text: str) -> tuple[int, int]:
    """'NxR': N nodes (2 to 4) of R ranks (1 or 2), the shapes the emulated topologies describe."""
    try:
        nodes, rpn = (int(x) for x in text.lower().split("x"))
    except ValueError:
        nodes = rpn = 0
    if not (2 <= nodes <= 4 and rpn in (1, 2)):
        raise UsageError(f"--shape={text}: give NODESxRANKS, 2 to 4 nodes of 1 or 2 ranks (e.g. --shape 2x1)")
    return nodes, rpn


def parse_args(argv: Sequence[str] | None) -> Options:
    """The options, checked (UsageError names the bad one); `--quick` sets the values not given."""
    ap = ArgumentParser(prog="python -m dlrm.bench.cluster", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=Options.out, help="directory for results.json, findings.md, findings.png")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default {Options.rounds})")
    ap.add_argument("--gbits", help="uplink rates, Gbit/s, comma-separated (default 0.5,2)")
    ap.add_argument("--steps", type=int, help=f"training steps per run (default {Options.steps})")
    ap.add_argument("--batch-per-rank", type=int, help=f"samples per rank and step (default {Options.batch_per_rank})")
    ap.add_argument("--model", default=Options.model, help="the model config (conf/model)")
    ap.add_argument("--experiments", help=f"comma list of {','.join(EXPERIMENTS)} (default all)")
    ap.add_argument("--variants", help=f"training variants, comma list of {','.join(VARIANTS)} (default all)")
    ap.add_argument("--shape", help="nodes x ranks per node of the train experiment (default 2x2; e.g. 2x1)")
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
        shape=base.shape if a.shape is None else _shape(a.shape),
    )
    if opts.rounds < 1:
        raise UsageError(f"--rounds={opts.rounds}: give 1 or more")
    if opts.steps < 8 or opts.steps % 4:
        raise UsageError(f"--steps={opts.steps}: give a multiple of 4 (local SGD's period), at least 8")
    if opts.batch_per_rank < 1:
        raise UsageError(f"--batch-per-rank={opts.batch_per_rank}: give 1 or more")
    if opts.max_minutes is not None and not opts.max_minutes > 0:
        raise UsageError(f"--max-minutes={opts.max_minutes}: give a positive number of minutes")
    from dlrm.comms.measure import parse_size

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
    """One emulated-cluster job: `kind` train or comms, its shape, uplink (None: one node, no link), variant."""

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
    """The jobs of one round, in the order they run (rotated by `round_index`).

    The scale experiment calibrates on one node of the shape's ranks; on 2x2 it also measures 2x1 and 4x1.
    """
    specs: list[Spec] = []
    if "comms" in opts.experiments and round_index == 0:
        specs += [Spec("comms", 2, 2, g, "bench") for g in opts.gbits]
    nodes, rpn = opts.shape
    default = opts.shape == DEFAULT_SHAPE
    jobs: list[Spec] = []
    if "scale" in opts.experiments:
        jobs += [Spec("train", 1, r, None, "auto") for r in ((1, 2) if default else (rpn,))]
    for g in opts.gbits:
        if "train" in opts.experiments:
            jobs += [Spec("train", nodes, rpn, g, v) for v in opts.variants]
        if "scale" in opts.experiments:
            if default:
                jobs += [Spec("train", 2, 1, g, "auto"), Spec("train", 4, 1, g, "auto")]
            if "train" not in opts.experiments or "auto" not in opts.variants:
                jobs.append(Spec("train", nodes, rpn, g, "auto"))
    k = round_index % len(jobs) if jobs else 0
    return specs + jobs[k:] + jobs[:k]


def train_overrides(opts: Options, spec: Spec, run_dir: Path) -> list[str]:
    """The training overrides of one run: weak scaling at batch_per_rank, quiet, one small eval."""
    ranks = spec.nodes * spec.ranks_per_node
    topology = emulated_name(spec.nodes, spec.ranks_per_node)
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
    """The emulated-cluster command line of one job, writing into `run_dir`."""
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
        return [*cmd, "--module", "dlrm.comms.measure", "--", "--topology", f"emu_{spec.nodes}x{spec.ranks_per_node}",
                "--scopes", "world,intra,inter", "--collectives", ",".join(COLLECTIVES), "--min-bytes", "64K",
                "--max-bytes", opts.comms_max_bytes, "--iters", str(opts.comms_iters), "--warmup", "2",
                "--out", str(run_dir)]  # fmt: skip
    return [*cmd, "--", *train_overrides(opts, spec, run_dir)]


# --- running -------------------------------------------------------------------------------------------


def run_job(opts: Options, spec: Spec, run_dir: Path) -> tuple[bool, str, float]:
    """Run one emulated-cluster job.

    Returns:
        (whether it succeeded, the tail of its stderr, its wall seconds).
    """
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
    """The planner's `--json --scale` projection calibrated on a one-node run of `series` ('1x1' or '1x2')."""
    overrides, counts = plan_overrides(opts.model, opts.batch_per_rank, gbit, series, opts.shape)
    cmd = [sys.executable, "-m", "dlrm.plan", "--json", "--scale", counts]
    cmd += ["--measured", str(calibration / "summary.json"), *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"dlrm.plan failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def save(out: Path, results: dict, with_figures: bool) -> None:
    """Write results.json (and with_figures, findings.md and findings.png) into `out`, each atomically."""
    write_json_atomic(out / "results.json", results)
    if with_figures:
        write_atomic(out / "findings.md", findings_md(results).encode())
        write_atomic(out / "findings.png", plot(results))


def _record(spec: Spec, k: int, ok: bool, tail: str, seconds: float, run_dir: Path, results: dict) -> dict:
    """One job's record for results.json: its figures read back (a comms job's rows go to results)."""
    rec: dict = {**asdict(spec), "name": spec.name, "round": k, "ok": ok, "seconds": round(seconds, 1)}
    rec["run_dir"] = str(run_dir)
    if not ok:
        rec["error"] = tail
        return rec
    try:
        if spec.kind == "comms":
            bench = json.loads((run_dir / "bench.json").read_text())
            assert spec.gbit is not None
            rows = comms_rows(bench, spec.gbit, comms_model_links(spec.gbit, spec.nodes, spec.ranks_per_node))
            results["comms"] += rows
            rec["comms_rows"] = len(rows)
        else:
            rec.update(train_record(run_dir))
    except (OSError, ValueError, KeyError) as e:
        rec.update(ok=False, error=f"unreadable output: {e}")
    return rec


def _project(opts: Options, out: Path, k: int, results: dict) -> None:
    """Add round k's measured-calibration scaling projections, from its one-node runs, to results."""
    for series, rpn in (("1x1", 1), ("1x2", 2)):
        cal = out / "runs" / f"r{k + 1}" / Spec("train", 1, rpn, None, "auto").name
        if not (cal / "summary.json").is_file():
            continue
        for g in opts.gbits:
            try:
                results["projections"] += projection_rows(run_plan(opts, g, series, cal), k, g, series)
            except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                say(f"projection {series} at {g:g} Gbit/s failed: {e}")


def run(opts: Options, now: Callable[[], float] = time.monotonic) -> int:
    """Run every round's jobs, saving the results after each job and the findings after each round.

    Returns:
        0 when every job succeeded, else 1.

    Raises:
        UsageError: this process cannot build the emulated cluster (rights or tools missing).
    """
    from dlrm.cluster.emulator import missing_right

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
            rec = _record(spec, k, ok, tail, seconds, run_dir, results)
            results["runs"].append(rec)
            say(f"round {k + 1}/{opts.rounds} [{i + 1}/{len(specs)}] {spec.name} ({seconds:.0f} s): {describe(rec)}")
            save(out, results, with_figures=False)
        if "scale" in opts.experiments:
            _project(opts, out, k, results)
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
    """Rewrite findings.md and findings.png from an earlier run's results.json, the model side
    re-evaluated against the stored measurements.
    """
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
    done = remodel(results, say)
    say(f"re-modelled with the current model: {done}")
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
