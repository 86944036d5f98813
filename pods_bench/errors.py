"""The one exception type users see.

Anything raised as `PodsBenchError` is bad input or a bad environment, never a bug: the CLI prints
its message as a single line (`pods-bench: error: ...`) and exits with status 2, no traceback.
"""


class PodsBenchError(Exception):
    """Bad input (config, data, files) with a one-line message naming what is wrong."""


def require(ok: bool, message: str) -> None:
    """A check of input: `message` (naming its config key) as the one-line error unless `ok`."""
    if not ok:
        raise PodsBenchError(message)
