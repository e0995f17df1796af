"""A docs page's commands, read from its first bash block, run as written in the test's process.

`python -m MODULE ARGS` runs as Python runs it (`runpy` with `__main__` as the name, `sys.argv` the
module's path and ARGS) in the page's working directory, without a new interpreter: the imports of
torch and TorchRec are paid once per test process, not once per command. Output is captured at the
file descriptors, so a command's own child processes are captured too.
"""

from __future__ import annotations

import os
import runpy
import sys
import warnings
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import TORCHRUN_VARS


def page_commands(page: str) -> list[list[str]]:
    """The commands of docs/PAGE's first ```bash block, each as its words (`python -m ...` only)."""
    text = (REPO_ROOT / "docs" / page).read_text()
    lines = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    commands = [line.split() for line in lines]
    for argv in commands:
        assert argv[:2] == ["python", "-m"] and len(argv) > 2, " ".join(argv)
    return commands


def _exit_here(code: int) -> None:
    """os._exit for a command run in the test's process: its exit status reaches the test, which goes on."""
    raise SystemExit(code)


def run_as_written(argv: list[str], cwd: Path, monkeypatch, capfd) -> tuple[int, str]:
    """`python -m MODULE ARGS` (argv as page_commands gives it) run in this process in `cwd`, as one
    process of no launcher (the torchrun variables unset); its child processes find this checkout
    (PYTHONPATH); an os._exit ends the command, not the test process.

    Returns: (exit status, the stdout and stderr of the command and of its child processes)."""
    module, args = argv[2], argv[3:]
    capfd.readouterr()  # what came before is not this command's
    with monkeypatch.context() as m:
        m.chdir(cwd)
        m.setenv("PYTHONPATH", str(REPO_ROOT))
        for name in TORCHRUN_VARS:
            m.delenv(name, raising=False)
        m.setattr(os, "_exit", _exit_here)
        m.setattr(sys, "argv", [module, *args])  # runpy puts the module's path first, as python -m
        with warnings.catch_warnings():  # a module the tests imported before runs afresh as __main__
            warnings.filterwarnings("ignore", message=".*found in sys.modules.*", category=RuntimeWarning)
            with pytest.raises(SystemExit) as exited:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                sys.exit(0)  # a module that ends without sys.exit exits 0
    out, err = capfd.readouterr()
    code = exited.value.code
    return (0 if code is None else code if isinstance(code, int) else 1), out + err


def run_page(page: str, cwd: Path, monkeypatch, capfd) -> list[str]:
    """Every command of docs/PAGE, in order, in `cwd`; each must exit 0. Returns their outputs."""
    outputs = []
    for argv in page_commands(page):
        code, output = run_as_written(argv, cwd, monkeypatch, capfd)
        assert code == 0, f"{' '.join(argv)} exited {code}:\n{output[-3000:]}"
        outputs.append(output)
    return outputs
