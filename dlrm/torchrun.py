"""torchrun, quiet about user errors: `python -m dlrm.torchrun [torchrun options] -m dlrm.train [overrides]`.

Takes exactly torchrun's arguments and runs torchrun's own `run`. The difference is what a failure
prints: when a rank exits with status 2 (a user error: the rank has printed `error: <message>`,
see `dlrm.errors`) and every other failed rank exited 2 too or was stopped by torchrun (SIGTERM),
the job exits 2 with nothing more: no "failed (exitcode: 2)" log line, no ChildFailedError summary
and traceback repeating the message. Any other failure (a crash, a signal, another exit status)
gets torchrun's full report and traceback, as plain torchrun would print it.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.run import parse_args, run

USER_ERROR = 2  # dlrm.errors.UserError.exit_code


def only_user_errors(failures: dict) -> bool:
    """Whether torchrun's failures ({rank: ProcessFailure}) are user errors and their consequences:
    the first failure exited 2, the others exited 2 or were stopped by torchrun (SIGTERM)."""
    if not failures:
        return False
    first = min(failures.values(), key=lambda f: f.timestamp)
    return first.exitcode == USER_ERROR and all(f.exitcode in (USER_ERROR, -signal.SIGTERM) for f in failures.values())


class _DropUserErrorNoise(logging.Filter):
    """Drops torchrun's "failed (exitcode: 2) ..." line (the rank has said what went wrong) and its
    "Sending process P closing signal SIGTERM" lines (the ordinary stop of the other ranks; a failure
    summary, when there is one, lists every rank's exit status anyway). SIGKILL lines stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("failed (exitcode") and args and args[0] == USER_ERROR:
            return False
        return not (msg.startswith("Sending process") and args and args[-1] == "SIGTERM")


@record
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_DropUserErrorNoise())
    try:
        run(args)
    except ChildFailedError as e:
        if only_user_errors(e.failures):
            sys.exit(USER_ERROR)
        raise


if __name__ == "__main__":
    main()
