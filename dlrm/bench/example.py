"""This project's training speed as ratios to TorchRec's DLRM example, over interleaved rounds.

    git clone https://github.com/facebookresearch/dlrm ~/src/dlrm
    .venv/bin/python -m dlrm.bench.example --example ~/src/dlrm --rounds 5 --configs fp32,bf16 --out F
    .venv/bin/python -m dlrm.bench.example --example ~/src/dlrm --short   # the regression guard: minutes

Each round runs the example (unchanged, on 2 ranks, the bench_cpu shape in its own flags:
`EXAMPLE_ARGS`) and each chosen configuration of ours once, the order reversed in even rounds.
Reports per configuration the median, min and max over the rounds of its ratio to the same round's
example: samples/s, samples per CPU-second, peak RSS per rank. `--short` runs 2 rounds of fp32 and
bf16 with short windows and ends with one line of the guarded ratios against `GOALS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlrm.bench.example_timer import ExampleNotFound, find_script
from dlrm.common.errors import ArgumentParser, UsageError, exit_on_user_error
from dlrm.common.io import write_json_atomic

TIMER = Path(__file__).resolve().parent / "example_timer.py"
EXAMPLE = "example"
# The bench_cpu shape in the example's own flags: 26 tables x 100,000 rows, dim 16, bottom MLP
# 13-512-256-64-16, top 512-256-1, 1,024 samples per rank (2,048 on 2 ranks), SGD at bench_cpu's lr
# (the example's default, 15, is tuned for Criteo). The rest are its defaults: one id per feature,
# dot interaction, RandomRecDataset cycling 10 batches, 10 val and 10 test batches after training.
EXAMPLE_ARGS = (
    "--batch_size", "1024", "--num_embeddings", "100000", "--embedding_dim", "16",
    "--dense_arch_layer_sizes", "512,256,64,16", "--over_arch_layer_sizes", "512,256,1", "--learning_rate", "0.1",
)  # fmt: skip
BF16 = ("trainer.dense_precision=bf16",)
DEFAULT_CONFIGS = "fp32,bf16,bf16_1p2t"
# --short: what is not given on the command line (rounds, configs, warmup, window, windows)
SHORT = {"rounds": 2, "configs": "fp32,bf16", "warmup": 10, "window": 10, "windows": 3}
# The guarded figures: (configuration, ratio key, goal, "min" or "max")
GOALS = (
    ("fp32", "samples_per_s", 1.3, "min"),
    ("bf16", "samples_per_s", None, "min"),
    ("fp32", "peak_rss_mb", 1.05, "max"),
)


@dataclass(frozen=True)
class Setup:
    """One benchmarked job: `ranks` processes of `threads` intra-op threads each, with `overrides`."""

    what: str
    ranks: int
    threads: int
    overrides: tuple[str, ...] = ()


SETUPS = {
    EXAMPLE: Setup("TorchRec's DLRM example, 2 ranks, fp32 (the baseline)", 2, 1),
    "fp32": Setup("ours, 2 ranks, fp32 (the example's math)", 2, 1),
    "fp32_mkl": Setup("ours, 2 ranks, fp32, MKL's products as the example's", 2, 1, ("trainer.cpu_gemm=mkl",)),
    "bf16": Setup("ours, 2 ranks, bf16 autocast (the documented CPU benchmark)", 2, 1, BF16),
    "bf16_1p2t": Setup("ours, 1 process x 2 threads, bf16 (the most samples/s on 2 idle cores)", 1, 2, BF16),
    "bf16_1p1t": Setup("ours, 1 process x 1 thread, bf16 (the most samples per CPU-second)", 1, 1, BF16),
    "fp32_compiled": Setup(
        "ours, 2 ranks, fp32, torch.compile of the dense part (the fastest on a CPU without native bf16)",
        2,
        1,
        ("trainer.compile_dense=true",),
    ),
    "fp32_1p2t": Setup("ours, 1 process x 2 threads, fp32 (for a CPU without native bf16)", 1, 2),
    "fp32_1p1t": Setup("ours, 1 process x 1 thread, fp32 (for a CPU without native bf16)", 1, 1),
}


class RunFailed(Exception):
    """A benchmark run exited with an error or wrote no figures."""


def command(
    name: str, timing: Sequence[str], out: Path, cache_batches: int, example: Path | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one run of SETUPS[name], writing its figures to `out`.

    Raises:
        ValueError: the example's run without `example`, the path of its script.
    """
    setup = SETUPS[name]
    if name == EXAMPLE:
        if example is None:
            raise ValueError("the example's run needs its script (--example)")
        program, extra = [str(TIMER), "--example", str(example)], ["--", *EXAMPLE_ARGS]  # the example's flags last
    else:
        program, extra = ["-m", "dlrm.bench.training"], [*setup.overrides]
        if cache_batches:
            extra += ["--cache-batches", str(cache_batches)]
    if setup.ranks > 1:
        launcher = [sys.executable, "-m", "dlrm.torchrun", "--standalone", f"--nproc_per_node={setup.ranks}"]
    else:
        launcher = [sys.executable]
    env = dict(os.environ, OMP_NUM_THREADS=str(setup.threads))
    return [*launcher, *program, *timing, "--out", str(out), *extra], env


def run_once(
    name: str, timing: Sequence[str], cache_batches: int, timeout_s: float, example: Path | None = None
) -> dict:
    """Run SETUPS[name] once and return the figures it wrote as JSON.

    Raises:
        RunFailed: the run exited with an error, wrote no figures or outlived `timeout_s`.
    """
    with tempfile.TemporaryDirectory(prefix="against_example_") as tmp:
        out = Path(tmp) / "figures.json"
        cmd, env = command(name, timing, out, cache_batches, example)
        # In its own session, so that a timeout or Ctrl-C stops the whole run (torchrun and its ranks).
        with subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        ) as proc:
            try:
                output, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired as e:
                _stop(proc)
                raise RunFailed(f"{name}: no result within {timeout_s:.0f} s (--timeout): {' '.join(cmd)}") from e
            except BaseException:
                _stop(proc)
                raise
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(output.splitlines()[-15:])
            raise RunFailed(f"{name}: exited {proc.returncode}: {' '.join(cmd)}\n{tail}")
        return json.loads(out.read_text())


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Stop `proc`'s process group: SIGTERM (torchrun passes it on to its ranks), then after the
    launcher exits, or after `grace_s`, SIGKILL to whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def round_order(names: Sequence[str], round_number: int) -> list[str]:
    """The runs of round `round_number` (from 1): the example, then `names`; reversed in even rounds."""
    order = [EXAMPLE, *names]
    return order if round_number % 2 else order[::-1]


def figures(result: dict) -> dict:
    """The compared figures of one run's JSON."""
    return {
        "samples_per_s": result["samples_per_s_median"],
        "samples_per_cpu_s": result["samples_per_cpu_s"],
        "peak_rss_mb": max(result["peak_rss_mb_per_rank"]),
        "eval_auc": result.get("eval_auc"),
    }


def ratios(rows: list[dict], name: str) -> dict[str, list[float]]:
    """Per figure, the ratio of `name`'s run to the example's of the same round, round by round."""
    example = {row["round"]: row for row in rows if row["config"] == EXAMPLE}
    out: dict[str, list[float]] = {"samples_per_s": [], "samples_per_cpu_s": [], "peak_rss_mb": []}
    for row in sorted((row for row in rows if row["config"] == name), key=lambda row: row["round"]):
        base = example.get(row["round"])
        if base is not None:
            for key, values in out.items():
                values.append(row[key] / base[key])
    return out


def summary(rows: list[dict], names: Sequence[str]) -> dict[str, dict]:
    """Per configuration: median samples/s, and the median, min and max of each ratio to the example."""
    result = {}
    for name in [EXAMPLE, *names]:
        mine = [row for row in rows if row["config"] == name]
        if not mine:
            continue
        entry: dict = {"what": SETUPS[name].what, "runs": len(mine)}
        entry["samples_per_s_median"] = statistics.median(row["samples_per_s"] for row in mine)
        if name != EXAMPLE:
            for key, values in ratios(rows, name).items():
                if values:
                    entry[f"{key}_ratio"] = {
                        "median": statistics.median(values),
                        "min": min(values),
                        "max": max(values),
                        "per_round": values,
                    }
        result[name] = entry
    return result


def compare(
    names: Sequence[str], rounds: int, run: Callable[[str], dict], report: Callable[[str], None], done=None
) -> list[dict]:
    """Run `rounds` rounds of the example and `names` in `round_order`; one row of figures per run.

    Args:
        run: runs one setup by name and returns its figures.
        report: receives a progress line per run.
        done: if given, called with the rows so far after each round.
    """
    rows: list[dict] = []
    for rnd in range(1, rounds + 1):
        this_round = {}
        for name in round_order(names, rnd):
            report(f"round {rnd}/{rounds}: {name} ...")
            row = this_round[name] = {"round": rnd, "config": name, **figures(run(name))}
            rows.append(row)
            line = f"round {rnd}/{rounds}: {name}: {row['samples_per_s']:,.0f} samples/s, "
            line += f"{row['samples_per_cpu_s']:,.0f} per CPU-second, peak RSS {row['peak_rss_mb']:.0f} MiB"
            report(line + (f", eval AUC {row['eval_auc']:.5f}" if row["eval_auc"] is not None else ""))
        base = this_round[EXAMPLE]["samples_per_s"]
        report(
            f"round {rnd}/{rounds}: samples/s to the example's: "
            + ", ".join(f"{name} {this_round[name]['samples_per_s'] / base:.2f}x" for name in names)
        )
        if done is not None:
            done(rows)
    return rows


def table(result: dict[str, dict]) -> list[str]:
    """The summary as text lines: one per configuration."""
    lines = ["configuration: median samples/s; to the example's (median, min-max): samples/s, per CPU-second, peak RSS"]
    for name, entry in result.items():
        line = f"  {name} ({entry['what']}): {entry['samples_per_s_median']:,.0f}"
        parts = []
        for key in ("samples_per_s", "samples_per_cpu_s", "peak_rss_mb"):
            r = entry.get(f"{key}_ratio")
            if r is not None:
                parts.append(f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
        if parts:
            line += "; " + ", ".join(parts)
        lines.append(line)
    return lines


# long: the command line, its checks and the rounds read top to bottom
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m dlrm.bench.example", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--example",
        required=True,
        help="a checkout of https://github.com/facebookresearch/dlrm (its torchrec_dlrm/dlrm_main.py runs), "
        "or the example's dlrm_main.py",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds (each runs the example and every configuration; default 3)"
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="the regression guard: " + ", ".join(f"--{k} {v}" for k, v in SHORT.items()) + " unless given",
    )
    parser.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated (default {DEFAULT_CONFIGS}), of: "
        + "; ".join(f"{k}: {v.what}" for k, v in SETUPS.items() if k != EXAMPLE),
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default: each program's, 20)")
    parser.add_argument("--window", type=int, default=None, help="steps per window (default: each program's, 20)")
    parser.add_argument("--windows", type=int, default=None, help="timed windows (default: each program's, 9)")
    parser.add_argument(
        "--cache-batches",
        type=int,
        default=0,
        help="ours train on N materialised batches (the example cycles 10 batches made before it starts)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed to one run")
    parser.add_argument("--out", type=Path, default=None, help="write every run and the summary here as JSON")
    try:
        args = parser.parse_args(argv)
        for key, value in (SHORT if args.short else {"rounds": 3, "configs": DEFAULT_CONFIGS}).items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        names = [n.strip() for n in args.configs.split(",") if n.strip()]
        unknown = [n for n in names if n not in SETUPS or n == EXAMPLE]
        if unknown or not names:
            choices = ", ".join(k for k in SETUPS if k != EXAMPLE)
            parser.error(f"--configs: unknown or empty {unknown or args.configs!r}; choose from {choices}")
        try:
            example = find_script(args.example)
        except ExampleNotFound as e:
            parser.error(str(e))
        if args.rounds < 1 or args.cache_batches < 0 or args.timeout <= 0:
            parser.error("--rounds must be >= 1, --cache-batches >= 0, --timeout > 0")
        timing = []
        for flag, value in (("--warmup", args.warmup), ("--window", args.window), ("--windows", args.windows)):
            if value is not None:
                if value < (0 if flag == "--warmup" else 1):
                    parser.error(f"{flag} must be >= {0 if flag == '--warmup' else 1}, got {value}")
                timing += [flag, str(value)]
    except UsageError as e:
        exit_on_user_error(e, 0)
        raise

    def save(rows: list[dict]) -> None:
        if args.out is not None:
            rounds_done = max(row["round"] for row in rows)
            record = {"rounds_requested": args.rounds, "rounds_completed": rounds_done, "configs": names}
            record.update(example=str(example), example_args=list(EXAMPLE_ARGS))
            record.update(cache_batches=args.cache_batches, runs=rows, summary=summary(rows, names))
            write_json_atomic(args.out, record)

    try:
        rows = compare(
            names,
            args.rounds,
            lambda name: run_once(name, timing, args.cache_batches, args.timeout, example),
            _say,
            save,
        )
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # the run in progress has been stopped (see `run_once`)
        print("interrupted: the rounds completed are in --out, if given", file=sys.stderr)
        sys.exit(130)
    result = summary(rows, names)
    for line in table(result):
        _say(line)
    if args.short:
        _say(guard_line(result))


def guard_line(result: dict[str, dict]) -> str:
    """The guarded ratios (`GOALS`) of a summary, each with its goal and whether it is met."""
    parts = []
    for name, key, goal, kind in GOALS:
        ratio = result.get(name, {}).get(f"{key}_ratio")
        if ratio is None:
            continue
        text = f"{name} {key.replace('_', ' ')} {ratio['median']:.2f}x"
        if goal is not None:
            met = ratio["median"] >= goal if kind == "min" else ratio["median"] <= goal
            text += f" ({'>=' if kind == 'min' else '<='} {goal} {'met' if met else 'MISSED'})"
        parts.append(text)
    return "guard, to TorchRec's example: " + "; ".join(parts)


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    main()
