"""Checks of a command's user-error output, and the commands (`dlrm.train`, `dlrm.export`,
`dlrm.predict`) run in the test process, judged as their `python -m` processes would be."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from dlrm import train

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE")


def assert_one_error(code, out: str, err: str, *words: str) -> str:
    """Exit 2, exactly one `error:` line holding every word, no traceback; returns the line."""
    text = out + err
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 2, text
    assert len(lines) == 1, text
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in text and "ChildFailedError" not in text, text
    assert "Error executing job" not in text, text  # Hydra's own line for a failed job
    return lines[0]


def main_in_process(monkeypatch, capsys, *args, env=None):
    """`python -m dlrm.train ARGS` in-process (one process, no torchrun variables): (exit status,
    stdout, stderr). `monkeypatch` is kept for the callers; the process state is restored anyway."""
    return train_in_process(capsys, *args, env=env)


def train_in_process(capture, *args: str, cwd: Path | str | None = None, env: dict | None = None):
    """`python -m dlrm.train ARGS` in the test process (`process_state_kept`): (exit status, stdout,
    stderr). `capture`: pytest's capsys or capfd fixture; cwd: the working directory (default: the
    test's); env: variables added to the environment, torchrun's removed (one process)."""

    def command() -> None:
        sys.argv = ["dlrm.train", *args]
        train.main()

    return command_in_process(capture, command, cwd=cwd, env=env)


def train_or_fail(*args: str) -> None:
    """`python -m dlrm.train ARGS` run to its end in the test process, its output not captured (for
    session and module fixtures); a non-zero exit fails the caller."""
    code, _, _ = train_in_process(None, *args)
    assert code == 0, f"dlrm.train {' '.join(args)} exited with {code}"


def train_quietly(run_dir: Path, steps: int, *overrides: str) -> Path:
    """`dlrm.train OVERRIDES` with SGD for `steps` steps in `run_dir`, without progress, breakdown or
    TensorBoard (`train_or_fail`). Returns the last checkpoint's directory."""
    quiet = ("trainer.progress=none", "trainer.breakdown=false", "trainer.tensorboard=false")
    train_or_fail(*overrides, "optim=sgd", f"trainer.max_steps={steps}", *quiet, f"hydra.run.dir={run_dir}")
    return run_dir / "checkpoints" / f"step_{steps:08d}"


def command_in_process(capture, command: Callable[[], object], cwd=None, env: dict | None = None):
    """Run `command()` as `python -m` runs a module's main, inside `process_state_kept`.

    Args:
        capture: pytest's capsys (Python-level output) or capfd (also what native code writes); None:
            the output is not captured (a fixture of a wider scope than capsys).
        command: the module's main; what it returns or raises (SystemExit) is the exit status.
        cwd: the working directory during the command.
        env: variables set during the command; torchrun's (TORCHRUN_VARS) are removed.
    Returns:
        (exit status, stdout, stderr); an uncaught exception is status 1 with its traceback on stderr,
        an `os._exit(n)` (an exit without teardown) is status n.
    """
    if capture is not None:
        capture.readouterr()  # what the test printed before is not the command's
    with process_state_kept():
        for name in TORCHRUN_VARS:
            os.environ.pop(name, None)
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        real_exit, os._exit = os._exit, _exit_without_teardown
        try:
            code = _exit_status(command())
        except SystemExit as e:
            code = _exit_status(e.code)
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            os._exit = real_exit
    out, err = capture.readouterr() if capture is not None else ("", "")
    return code, out, err


def _exit_without_teardown(code: int) -> None:
    """`os._exit` for a command in the test process: its status, as SystemExit (the process is the tests')."""
    raise SystemExit(code)


def _exit_status(code: object) -> int:
    """The status a Python process exits with for `sys.exit(code)` (a message prints to stderr, status 1)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


# The modules holding the job's clock (`from dlrm.run.logs import JOB_START`), set to now for a command.
JOB_CLOCKS = ("dlrm.run.logs", "dlrm.trainer.reporter")
RESTORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def process_state() -> dict:
    """What a command may change in this process and a later test would meet: argv, path, environment,
    working directory, logging (root handlers, logger levels, warnings capture), warning filters,
    signal handlers, the fault handler, the garbage collector, torch's threads and RNG, the process group, Hydra."""
    import torch
    import torch.distributed as dist
    from hydra.core.global_hydra import GlobalHydra

    loggers = logging.root.manager.loggerDict
    return {
        "argv": list(sys.argv),
        "path": list(sys.path),
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "root_handlers": list(logging.root.handlers),
        "levels": {"": logging.root.level}
        | {n: g.level for n, g in loggers.items() if isinstance(g, logging.Logger) and g.level != logging.NOTSET},
        "captured_warnings": getattr(logging, "_warnings_showwarning", None) is not None,
        "warning_filters": list(warnings.filters),
        "signals": {s: signal.getsignal(s) for s in RESTORED_SIGNALS},
        "faulthandler": faulthandler.is_enabled(),
        "garbage_collector": (gc.isenabled(), gc.get_freeze_count()),
        "threads": torch.get_num_threads(),
        "rng": torch.random.get_rng_state(),
        "process_group": dist.is_initialized(),
        "hydra": GlobalHydra.instance().is_initialized(),
    }


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Restore, after the block, the `process_state` it found, and start the block with the clock a new
    process starts with (`dlrm.run.logs.JOB_START`). Files the run left open are its logging handlers'
    (closed here, as at a process exit); glibc's malloc settings (`dlrm.trainer.malloc`) stay, as after
    any in-process build."""
    import torch
    import torch.distributed as dist
    from hydra.core.global_hydra import GlobalHydra

    from dlrm.run import logs

    before = process_state()
    clocks = {m: sys.modules[m].JOB_START for m in JOB_CLOCKS if m in sys.modules}
    logs.JOB_START = time.monotonic()
    for module in clocks:
        sys.modules[module].JOB_START = logs.JOB_START
    try:
        with warnings.catch_warnings():
            try:
                yield
            finally:
                if not before["captured_warnings"]:
                    logging.captureWarnings(False)
    finally:
        for module in JOB_CLOCKS:  # a module first imported by the block keeps the clock it took
            if module in clocks:
                sys.modules[module].JOB_START = clocks[module]
        for handler in logging.root.handlers:
            if handler not in before["root_handlers"]:
                handler.close()
        logging.root.handlers[:] = before["root_handlers"]
        loggers = logging.root.manager.loggerDict
        for name, logger in [("", logging.root), *loggers.items()]:
            if isinstance(logger, logging.Logger):
                logger.setLevel(before["levels"].get(name, logging.NOTSET))
        for s, handler in before["signals"].items():
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        if faulthandler.is_enabled() and not before["faulthandler"]:
            faulthandler.disable()
        torch.set_num_threads(before["threads"])
        torch.random.set_rng_state(before["rng"])
        if dist.is_initialized() and not before["process_group"]:
            dist.destroy_process_group()
        if GlobalHydra.instance().is_initialized() and not before["hydra"]:
            GlobalHydra.instance().clear()
        os.chdir(before["cwd"])
        os.environ.clear()
        os.environ.update(before["environ"])
        sys.argv[:] = before["argv"]
        sys.path[:] = before["path"]


def record_sleeps(monkeypatch) -> list[float]:
    """Replace time.sleep for this test: the main thread's calls are recorded (and return at once);
    other threads (the scenario families' launcher runs beside the tests) still sleep."""
    waits: list[float] = []
    real = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread() is threading.main_thread():
            waits.append(seconds)
        else:
            real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return waits


def predict_in_process(capsys, *args):
    """`python -m dlrm.predict ARGS` in-process: (exit status, stdout, stderr)."""
    from dlrm.predict.cli import main as predict_main  # torch and TorchRec: only for the tests that score

    return command_in_process(capsys, lambda: predict_main([str(a) for a in args]))


def export_in_process(capture, *args: str | Path):
    """`python -m dlrm.export ARGS` in-process: (exit status, stdout, stderr)."""
    from dlrm.export import main as export_main

    return command_in_process(capture, lambda: export_main([str(a) for a in args]))
