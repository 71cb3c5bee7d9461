"""Errors that the command line turns into exit statuses.

``BadInput`` is for anything the user can fix (config, paths, data files): the CLI prints its
one-paragraph message and exits with status 2. ``NonFinite`` is a computation that produced
NaN or inf (a training run that diverged, a model whose outputs are not numbers): one
paragraph too, and status 2 when a setting or an input caused it, else 1. Everything else is
a bug or an environment failure and exits with status 1.
"""


class BadInput(Exception):
    """A problem with user input; the message must name it and list the valid choices."""


class NonFinite(Exception):
    """NaN or inf where a number was needed; ``status`` is the exit status (2 when a setting
    or an input the user chose caused it, 1 otherwise)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def exit_status(exc: BaseException) -> int | None:
    """The exit status of an error whose message is the whole story (BadInput: 2,
    NonFinite: its own), or None for anything else (a traceback's worth)."""
    if isinstance(exc, BadInput):
        return 2
    if isinstance(exc, NonFinite):
        return exc.status
    return None
