"""The shape of the package. Data flows one way: the import contracts in pyproject.toml
([tool.importlinter]: the core imports no analysis tool and no entry point; no two packages import
each other, at any level) are checked by `lint-imports` in .ci/lint; here, that they have teeth, that a
bad command line is refused before torch is imported, and that the trainer leaves unimported what a
default run does not use."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT as ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contracts over the package in `tree`."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)}
    cmd = [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env, timeout=120)


def test_the_import_contracts_hold_and_catch_a_core_to_tool_import_and_a_cycle(tmp_path):
    clean = tmp_path / "clean"
    shutil.copytree(ROOT / "dlrm", clean / "dlrm", ignore=shutil.ignore_patterns("__pycache__"))
    assert _lint_imports(clean).returncode == 0, _lint_imports(clean).stdout[-3000:]
    for name, module, line in (
        ("tool", "dlrm/models/mlp.py", "import dlrm.plan.planner\n"),  # the core importing a tool
        ("cycle", "dlrm/config/choices.py", "def _f():\n    import dlrm.run.logs\n"),  # config <-> trainer
    ):
        tree = tmp_path / name
        shutil.copytree(clean, tree)
        with open(tree / module, "a") as f:
            f.write(line)
        r = _lint_imports(tree)
        assert r.returncode != 0 and "BROKEN" in r.stdout, (name, r.stdout[-3000:])


def test_a_bad_command_line_is_refused_before_torch_is_imported():
    """dlrm.train composes and checks (World included) without torch: the refusal comes in a fraction
    of the seconds torch and TorchRec take to import."""
    code = (
        "import sys, dlrm.train\n"
        "sys.argv = ['dlrm.train', 'model=tiny', 'data.global_batch_size=0']\n"
        "try:\n    dlrm.train.main()\nexcept SystemExit as e:\n    print(e.code)\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.stdout.split("\n")[-3:] == ["2", "[]", ""], r.stdout + r.stderr
    assert "data.global_batch_size" in r.stderr


def test_the_trainer_leaves_unimported_what_a_default_run_does_not_use():
    """torchmetrics imports matplotlib (~30 MiB of resident memory on every rank); torch.distributed.optim,
    for local SGD only, costs every rank's start 0.3-0.5 CPU-seconds."""
    unused = ("torchmetrics", "matplotlib", "torch.distributed.optim")
    code = f"import sys, dlrm.trainer.build, dlrm.trainer.loop; print([m for m in {unused!r} if m in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-3000:]
