"""Run TorchRec's DLRM example script unchanged and time its training steps as our benchmark times ours.

`--example PATH` names the script or a checkout holding it; it runs with `runpy` as its own
command would, with the example's flags after `--`, under torchrun, one process per rank:

    .venv/bin/python -m dlrm.torchrun --standalone --nproc_per_node=2 dlrm/bench/example_timer.py \
        --example ~/src/dlrm --out F -- --batch_size 1024 --embedding_dim 16 ...

The example's pipeline `progress` is wrapped to note the time after each training step, and its
training is limited to `--warmup` + `--windows` x `--window` batches. Rank 0 writes the median
window's samples/s, samples per CPU-second (child processes included) and peak RSS per rank as
JSON to `--out`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import runpy
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Where an example's dlrm_main.py is found in the checkout `--example` names, in this order.
SCRIPT_PLACES = ("dlrm_main.py", "torchrec_dlrm/dlrm_main.py", "examples/dlrm/dlrm_main.py")
TICKS = os.sysconf("SC_CLK_TCK")


class ExampleNotFound(Exception):
    """`--example` names no file or checkout holding the example script."""


def find_script(path: str | Path) -> Path:
    """The example's dlrm_main.py: `path` itself if it is a file, else the first of SCRIPT_PLACES under it."""
    path = Path(path).expanduser()
    if path.is_file():
        return path.resolve()
    for place in SCRIPT_PLACES:
        if (path / place).is_file():
            return (path / place).resolve()
    raise ExampleNotFound(
        f"--example {path}: no {' or '.join(SCRIPT_PLACES)} there; give a checkout of "
        "https://github.com/facebookresearch/dlrm (its torchrec_dlrm/dlrm_main.py) or the script itself"
    )


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (this one by default) and all its descendants."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        children: list[int] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # the process ended meanwhile
    return total + sum(tree_cpu_seconds(c) for c in children)


class StepClock:
    """Times the training steps of a pipeline class: `install(cls)` wraps `cls.progress`.

    `marks[i]` is the time after training step i (from 0), `start` the time before the first;
    `cpu` holds the CPU seconds (`cpu_clock`) read at the end of step `warmup - 1` and of the last
    timed step (`warmup + windows * window - 1`).
    """

    def __init__(
        self,
        warmup: int,
        window: int,
        windows: int,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = tree_cpu_seconds,
    ) -> None:
        self.warmup, self.window, self.windows = warmup, window, windows
        self.clock, self.cpu_clock = clock, cpu_clock
        self.start: float | None = None
        self.marks: list[float] = []
        self.cpu: list[float] = []

    @property
    def steps(self) -> int:
        return self.warmup + self.windows * self.window

    def install(self, cls: type) -> None:
        original = cls.progress

        @functools.wraps(original)
        def progress(pipeline, *args, **kwargs):
            training = pipeline._model.training
            if training and self.start is None:
                self.start = self.clock()
                if self.warmup == 0:
                    self.cpu.append(self.cpu_clock())
            out = original(pipeline, *args, **kwargs)
            if training:
                self.step_done()
            return out

        cls.progress = progress

    def step_done(self) -> None:
        self.marks.append(self.clock())
        if len(self.marks) in (self.warmup, self.steps):
            self.cpu.append(self.cpu_clock())

    def rates(self, batch: int) -> list[float]:
        """Samples/s of each timed window, `batch` samples per step."""
        if self.start is None or len(self.marks) < self.steps:
            raise RuntimeError(
                f"the example trained {len(self.marks)} steps, fewer than the {self.steps} timed "
                "(--warmup + --windows x --window): did it take --limit_train_batches?"
            )
        times = [self.start, *self.marks]
        edges = [times[self.warmup + i * self.window] for i in range(self.windows + 1)]
        return [self.window * batch / (b - a) for a, b in zip(edges, edges[1:], strict=False)]

    def cpu_seconds(self) -> float:
        return self.cpu[1] - self.cpu[0]


def option(args: Sequence[str], name: str) -> str | None:
    """The value of the example's flag `name` in `args` (`--flag v` or `--flag=v`), the last one given."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, example_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--example", required=True, help="checkout of facebookresearch/dlrm, or the dlrm_main.py")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--windows", type=int, default=9)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(ours)
    if args.warmup < 0 or min(args.window, args.windows) < 1:
        p.error("--window and --windows must be >= 1, --warmup >= 0")
    for flag in ("--limit_train_batches", "--epochs"):
        if option(example_args, flag) is not None:
            p.error(f"{flag} is set here (--warmup + --windows x --window steps, one epoch)")
    try:
        script = find_script(args.example)
    except ExampleNotFound as e:
        p.error(str(e))
    clock = StepClock(args.warmup, args.window, args.windows)
    from torchrec.distributed import TrainPipelineSparseDist  # the class the example imports

    clock.install(TrainPipelineSparseDist)
    sys.argv = [str(script), *example_args, "--limit_train_batches", str(clock.steps)]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")
    report(clock, args.out, int(option(example_args, "--batch_size") or 32), script)  # 32: its default


def report(clock: StepClock, out: Path | None, per_rank_batch: int, script: Path) -> None:
    """Gather every rank's figures over the example's process group; rank 0 prints and writes them."""
    import torch
    import torch.distributed as dist

    from dlrm.common.io import write_json_atomic

    if not dist.is_initialized():
        raise RuntimeError("the example closed its process group: its ranks' figures cannot be gathered")
    world_size = dist.get_world_size()
    batch = per_rank_batch * world_size
    rates = clock.rates(batch)
    mine = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, clock.cpu_seconds()]
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, mine)
    result = {
        "program": f"TorchRec's DLRM example, run as is: {script}",
        "world_size": world_size,
        "global_batch_size": batch,
        "device": "cuda" if torch.cuda.is_available() else "cpu",  # the example's own choice
        "warmup_steps": clock.warmup,
        "window_steps": clock.window,
        "samples_per_s_median": statistics.median(rates),
        "samples_per_s_windows": rates,
        "samples_per_cpu_s": clock.windows * clock.window * batch / sum(g[1] for g in gathered),
        "peak_rss_mb_per_rank": [g[0] for g in gathered],
        "eval_auc": None,  # its AUROC is of random labels: printed by the example, not compared
    }
    if dist.get_rank() == 0:
        print(
            f"example: {world_size} rank(s): {result['samples_per_s_median']:.0f} samples/s median of "
            f"{len(rates)} windows (min {min(rates):.0f}, max {max(rates):.0f}), "
            f"{result['samples_per_cpu_s']:.0f} per CPU-second; peak RSS MiB per rank "
            f"{[round(m) for m in result['peak_rss_mb_per_rank']]}"
        )
        print("bench: " + json.dumps({k: v for k, v in result.items() if k != "samples_per_s_windows"}))
        if out is not None:
            write_json_atomic(out, result)
    dist.barrier()


if __name__ == "__main__":
    main()
