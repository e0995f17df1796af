"""Checks of a command's user-error output, and `dlrm.train.main` and `dlrm.predict.main` run in-process."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

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
    monkeypatch.setattr(sys, "argv", ["dlrm.train", *args])
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        train.main()
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def train_in_process(*args: str) -> None:
    """`python -m dlrm.train ARGS` run to its end in this process, without the launcher's variables; fails
    the caller on a non-zero exit. The root logger's handlers and level (which the run replaces with its
    own console and train.log handlers) are restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", ["dlrm.train", *args])
            for name in TORCHRUN_VARS:
                patch.delenv(name, raising=False)
            train.main()
    except SystemExit as e:
        raise AssertionError(f"dlrm.train {' '.join(args)} exited with {e.code}") from None
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        for handler in [h for h in handlers if h not in root.handlers]:
            root.addHandler(handler)
        root.setLevel(level)


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

    rc = predict_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err
