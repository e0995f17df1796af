"""A docs page's commands, read from its first bash block, run as written in the test's process.

`python -m MODULE ARGS` runs as Python runs it (`runpy` with `__main__` as the name, `sys.argv` the
module's path and ARGS) in the page's working directory, without a new interpreter: the imports of
torch and TorchRec are paid once per test process, not once per command. Output is captured at the
file descriptors, so a command's own child processes are captured too.
"""

from __future__ import annotations

import runpy
import sys
import warnings
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.helpers.cli import command_in_process


def page_commands(page: str) -> list[list[str]]:
    """The commands of docs/PAGE's first ```bash block, each as its words (`python -m ...` only)."""
    text = (REPO_ROOT / "docs" / page).read_text()
    lines = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    commands = [line.split() for line in lines]
    for argv in commands:
        assert argv[:2] == ["python", "-m"] and len(argv) > 2, " ".join(argv)
    return commands


def run_as_written(argv: list[str], cwd: Path, capfd) -> tuple[int, str]:
    """`python -m MODULE ARGS` (argv as page_commands gives it) run in this process in `cwd`
    (`tests.helpers.cli.command_in_process`: one process of no launcher, the process state restored
    after); its child processes find this checkout (PYTHONPATH).

    Returns: (exit status, the stdout and stderr of the command and of its child processes)."""
    module, args = argv[2], argv[3:]

    def command() -> None:
        sys.argv = [module, *args]  # runpy puts the module's path first, as python -m
        with warnings.catch_warnings():  # a module the tests imported before runs afresh as __main__
            warnings.filterwarnings("ignore", message=".*found in sys.modules.*", category=RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)

    code, out, err = command_in_process(capfd, command, cwd=cwd, env={"PYTHONPATH": str(REPO_ROOT)})
    return code, out + err


def run_page(page: str, cwd: Path, capfd) -> list[str]:
    """Every command of docs/PAGE, in order, in `cwd`; each must exit 0. Returns their outputs."""
    outputs = []
    for argv in page_commands(page):
        code, output = run_as_written(argv, cwd, capfd)
        assert code == 0, f"{' '.join(argv)} exited {code}:\n{output[-3000:]}"
        outputs.append(output)
    return outputs
