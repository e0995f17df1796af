"""One base class for errors caused by the user's input (config, files, command-line values).

Every entry point catches `UserError`, prints its message once as `error: ...` and exits with
status 2, without a traceback. The message names the key, file or value and the fix.
Anything else is a bug or an environment failure and keeps its traceback.

Under torchrun: an error every rank raises alike (`same_on_all_ranks`: config, plan, global loss)
is printed by rank 0 only; any other (a file one rank reads) by each rank that meets it, as
`error: [rank R] ...`, the other ranks after a short wait so that an error rank 0 meets too is
said once. `exit_on_user_error` is how every entry point does so.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar


class UserError(Exception):
    """Bad input that the user can fix; `str(e)` names what is wrong and how to fix it."""

    exit_code = 2
    same_on_all_ranks = False  # True: every rank raises the same error, so only rank 0 prints it
    quiet_elsewhere = False  # with same_on_all_ranks: the other ranks exit at once (no wait for rank 0)
    prefix = "error"  # the line's first word


class UsageError(UserError):
    """A bad command-line option or value."""

    same_on_all_ranks = True  # under torchrun every rank gets the same command line


class ArgumentParser(argparse.ArgumentParser):
    """argparse for our command-line tools: a usage error is a UsageError (one `error:` line, exit 2),
    and `--help` shows each option's default."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse's hook for usage errors
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def user_error_in(e: BaseException) -> UserError | None:
    """The UserError `e` is or wraps (as a cause, or inside DCP's CheckpointException), else None."""
    todo: list[BaseException | None] = [e]
    seen: set[int] = set()
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, UserError):
            return x
        if hasattr(x, "failures") and "torch.distributed.checkpoint" in sys.modules:
            from torch.distributed.checkpoint import CheckpointException

            if isinstance(x, CheckpointException):  # one (exception, traceback) per failed rank
                todo += [f[0] if isinstance(f, tuple) else f for f in x.failures.values()]
        todo += [x.__cause__, x.__context__]
    return None


# How long a rank other than 0 waits for rank 0 to report an error that every rank meets. torchrun
# stops every rank as soon as one exits, so rank 0 must get to print first; a rank still alive after
# this wait says it itself (rank 0 did not stop the job: it did not meet the error).
REPORT_GRACE_S = 30.0
# How long a rank other than 0 waits before printing an error of its own (a file it reads, a lost
# peer): when rank 0 meets it too, rank 0's line stops the job first and the line is said once. Each
# local rank waits a second longer than the one before it, so that on another node its agent stops
# the node's other ranks once the node's first one has spoken: one line per node at most.
LOCAL_GRACE_S = 3.0


def user_error_message(e: UserError, rank: int) -> str | None:
    """The one line to print for `e` on this rank, or None when rank 0 prints it (module docstring)."""
    if rank == 0:
        return f"{e.prefix}: {e}"
    if e.same_on_all_ranks:
        return None
    return f"{e.prefix}: [rank {rank}] {e}"


def _under_launcher() -> bool:
    """True under torchrun, which stops the other ranks when one exits."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def exit_on_user_error(e: BaseException, rank: int) -> None:
    """If `e` is (or wraps) a UserError: print its one line and exit 2; else return, so the caller re-raises.

    A rank other than 0 first waits REPORT_GRACE_S for rank 0 to report an error every rank meets. With a
    process group up, the exit skips interpreter teardown (os._exit): other ranks may be inside a
    collective, where tearing Gloo down can hang or abort instead of exiting 2.
    """
    user = user_error_in(e)
    if user is None:
        return
    line = user_error_message(user, rank)
    if line is None and not user.quiet_elsewhere:  # rank 0 reports it: give it the time to
        time.sleep(REPORT_GRACE_S)
        line = f"{user.prefix}: [rank {rank}] {user}"
    elif rank != 0 and line is not None and _under_launcher():  # rank 0 may meet it too: let it speak first
        time.sleep(LOCAL_GRACE_S + int(os.environ.get("LOCAL_RANK", "0")))
    if line is not None:
        print(line, file=sys.stderr)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(user.exit_code)
    sys.exit(user.exit_code)


T = TypeVar("T")


def run_rank_command(main: Callable[[], T], missing_file: type[UserError] = UserError) -> T:
    """`main()` of a command every rank runs (under torchrun): a UserError, or a missing file as
    `missing_file`, is one line from rank 0 and exit 2 (`exit_on_user_error`)."""
    try:
        return main()
    except (UserError, FileNotFoundError) as e:
        exit_on_user_error(e if isinstance(e, UserError) else missing_file(str(e)), int(os.environ.get("RANK", "0")))
        raise
