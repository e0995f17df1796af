"""torchrun, quiet about user errors: `python -m dlrm.torchrun [torchrun options] -m dlrm.train [overrides]`.

Takes exactly torchrun's arguments and runs torchrun's own `run`. Only what a failure prints differs:

| the ranks' failure                                          | the job exits | printed                       |
|-------------------------------------------------------------|---------------|-------------------------------|
| a user error (2), the other ranks 2 or stopped by torchrun  | 2             | the rank's `error:` line only |
| a clean stop on SIGINT/SIGTERM                              | 130 / 143     | nothing more                  |
| a collective timed out or lost a rank                       | 3             | one `failed:` line            |
| anything else                                               | its status    | torchrun's full report        |

A multi-node launch gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 unless the environment sets it
(`separate_store`): rank 0's worker hosts the job's store, a new one every rendezvous round, so an
agent started again in place of a dead node's can join. Single-node launches keep torch's default, as
does a multi-node training that names no run directory (its ranks agree on one through the agent's store).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from argparse import Namespace
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.run import parse_args, parse_min_max_nnodes, run

USER_ERROR = 2  # dlrm.common.errors.UserError.exit_code
COLLECTIVE_FAILED = 3  # a collective timed out or lost a rank (core.topology), or fell short (comms.preflight)
# A clean stop on a signal (dlrm.trainer.stop.TrainingStopped): 128 + SIGINT / SIGTERM / SIGHUP.
STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP)
QUIET = (USER_ERROR, COLLECTIVE_FAILED, *STOPPED)  # the rank has printed its one line
SEPARATE_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torch's opt-out of the agent-hosted store


def separate_store(args: Namespace) -> bool:
    """Whether the ranks should host their own store: a multi-node launch, unless it is a training
    that names no run directory.
    """
    try:
        multi_node = not args.standalone and parse_min_max_nnodes(args.nnodes)[1] > 1
    except (RuntimeError, ValueError):  # a bad --nnodes: torchrun's `run` reports it
        return False
    named = any(a.lstrip("+").startswith(("hydra.run.dir=", "run.name=")) for a in args.training_script_args)
    return multi_node and (named or not (args.module and args.training_script == "dlrm.train"))


def only_user_errors(failures: dict) -> int | None:
    """The job's exit status if torchrun's failures ({rank: ProcessFailure}) are a user error or a
    clean stop and their consequences (the first failure exited 2, 130 or 143; the others the same,
    or were stopped by torchrun's SIGTERM); None for anything else."""
    if not failures:
        return None
    first = min(failures.values(), key=lambda f: f.timestamp)
    quiet = first.exitcode in QUIET and all(f.exitcode in (*QUIET, -signal.SIGTERM) for f in failures.values())
    return first.exitcode if quiet else None


class _DropUserErrorNoise(logging.Filter):
    """Drops torchrun's "failed (exitcode: 2) ..." line (the rank has said what went wrong) and its
    "Sending process P closing signal SIGTERM" lines (the ordinary stop of the other ranks; a failure
    summary, when there is one, lists every rank's exit status anyway). SIGKILL lines stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("failed (exitcode") and args and args[0] in QUIET:
            return False
        if msg.startswith("Received") and "death signal" in msg:  # the ranks say where they stopped
            return False
        return not (msg.startswith("Sending process") and args and args[-1] in ("SIGTERM", "SIGINT"))


@record
def main(argv: Sequence[str] | None = None) -> None:
    """Run torchrun with these arguments; exit with the job's status, quiet as the module says."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if separate_store(args):
        os.environ.setdefault(SEPARATE_STORE, "1")
    for name in ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api"):
        logging.getLogger(name).addFilter(_DropUserErrorNoise())
    try:
        run(args)
    except ChildFailedError as e:
        status = only_user_errors(e.failures)
        if status is not None:
            sys.exit(status)
        raise
    except SignalException as e:  # torchrun was signalled and has stopped the ranks (they said where)
        sys.exit(128 + e.sigval)


if __name__ == "__main__":
    main()
