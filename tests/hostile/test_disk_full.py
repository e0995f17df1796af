"""A full disk is one `error:` line naming the path, exit 2, not an OSError traceback: while DCP writes
a checkpoint (the last good checkpoint kept, the partial one removed), and while summary.json is
written. The full disk is injected (OSError ENOSPC, patched in before `dlrm.train.main` runs in a
child process: the error exits at once once a process group is up): a real one needs a tmpfs, hence root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import assert_one_error

REPO = Path(__file__).resolve().parents[2]
RUN = ("model=tiny", "data.global_batch_size=64", "data.eval_batches=1", "trainer.progress=none")
PATCHES = {
    "checkpoint": """
import errno
from torch.distributed.checkpoint import FileSystemWriter
from dlrm.checkpoint import checkpointer

class FullWriter(FileSystemWriter):
    def write_data(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

real, calls = checkpointer.storage_writer, []
def writer(path):  # the second save meets a full disk
    calls.append(path)
    return real(path) if len(calls) == 1 else FullWriter(path)
checkpointer.storage_writer = writer
""",
    "summary": """
import errno
from dlrm.trainer import reporter
def full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))
reporter.write_json_atomic = full
""",
}


def _train(patch: str, *overrides: str) -> subprocess.CompletedProcess:
    script = f"{PATCHES[patch]}\nimport sys\nfrom dlrm import train\nsys.argv[0] = 'dlrm.train'\ntrain.main()\n"
    return subprocess.run(
        [sys.executable, "-c", script, *RUN, *overrides], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_good_one(tmp_path):
    run = tmp_path / "run"
    done = _train("checkpoint", "trainer.max_steps=2", "checkpoint.every_steps=1", f"hydra.run.dir={run}")
    good = run / "checkpoints" / "step_00000001"
    line = assert_one_error(done.returncode, done.stdout, done.stderr, str(run / "checkpoints"), "No space left")
    assert f"the last good one kept: {good}" in line
    assert (good / "manifest.json").is_file() and [p.name for p in (run / "checkpoints").iterdir()] == [good.name]


def test_a_full_disk_while_writing_the_summary_is_one_line(tmp_path):
    run = tmp_path / "run"
    done = _train("summary", "trainer.max_steps=1", f"hydra.run.dir={run}")
    assert_one_error(done.returncode, done.stdout, done.stderr, str(run / "summary.json"), "No space left")
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
