"""One base class for errors caused by the user's input (config, files, command-line values).

Every entry point catches `UserError`, prints its message once (rank 0) as `error: ...` and exits
with status 2, without a traceback. The message names the key, file or value and the fix.
Anything else is a bug or an environment failure and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input that the user can fix; `str(e)` names what is wrong and how to fix it."""

    exit_code = 2
