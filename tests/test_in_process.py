"""Commands run in the test process (tests/helpers/cli.py) leave the process as they found it: a later
test in the same pytest worker meets the state a fresh process would give it."""

from __future__ import annotations

import torch

from tests.helpers.cli import process_state, train_in_process

TINY = ("model=tiny", "data.global_batch_size=64", "data.eval_batches=1", "trainer.progress=none")


def _threads_line(run_dir) -> str:
    (line,) = [x for x in (run_dir / "train.log").read_text().splitlines() if "intra-op threads per rank" in x]
    return line.split(": ", 1)[1]


def test_runs_in_process_leave_the_process_as_they_found_it(capfd, tmp_path):
    """A run, a run failing inside training (its process group up), and a run again: each ends with the
    exit status and lines of a process; the third chooses its threads as the first did; afterwards
    argv, environment, cwd, logging, warning filters, signal handlers, torch's threads and RNG, the
    process group and Hydra are as before."""
    before = process_state()
    code, out, err = train_in_process(capfd, *TINY, "trainer.max_steps=2", "run.name=a", cwd=tmp_path)
    assert code == 0 and out.splitlines()[-1].startswith("done: 2 steps"), (out + err)[-3000:]
    code, out, err = train_in_process(
        capfd, *TINY, "optim=sgd", "optim.dense.lr=1e30", "optim.embedding.lr=1e30", "trainer.max_steps=6",
        "trainer.log_every_steps=1", "trainer.pipeline=false", "run.name=nan", cwd=tmp_path,
    )  # fmt: skip
    assert code == 2 and [x for x in err.splitlines() if x.startswith("error: loss is")], (out + err)[-3000:]
    code, out, err = train_in_process(capfd, *TINY, "trainer.max_steps=2", "run.name=b", cwd=tmp_path)
    assert code == 0, (out + err)[-3000:]
    assert _threads_line(tmp_path / "outputs/b") == _threads_line(tmp_path / "outputs/a")
    after = process_state()
    assert torch.equal(after.pop("rng"), before.pop("rng"))
    assert after == before
