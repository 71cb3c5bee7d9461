"""Errors that the command line turns into exit statuses.

``BadInput`` is for anything the user can fix (config, paths, data files): the CLI prints its
one-paragraph message and exits with status 2. Everything else is a bug or an environment
failure and exits with status 1.
"""


class BadInput(Exception):
    """A problem with user input; the message must name it and list the valid choices."""
