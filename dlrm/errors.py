"""One base class for errors caused by the user's input (config, files, command-line values).

Every entry point catches `UserError`, prints its message once as `error: ...` and exits with
status 2, without a traceback. The message names the key, file or value and the fix.
Anything else is a bug or an environment failure and keeps its traceback.

Under torchrun: an error every rank raises alike (`same_on_all_ranks`: config, plan, global loss)
is printed by rank 0 only; any other (a file one rank reads) by each rank that meets it, as
`error: [rank R] ...`.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input that the user can fix; `str(e)` names what is wrong and how to fix it."""

    exit_code = 2
    same_on_all_ranks = False  # True: every rank raises the same error, so only rank 0 prints it
