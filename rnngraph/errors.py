"""rnngraph's exception types (errors, and Ctrl-C with what was kept) and its warning category."""


class RnnGraphError(ValueError):
    """Any invalid cell, schedule, layer call or checkpoint. The message names what is wrong and how to fix it."""


class RnnGraphWarning(UserWarning):
    """Something legal but probably unintended, e.g. an input the cell never reads."""


class Interrupted(Exception):
    """Ctrl-C during a command, carrying what was kept: `rnngraph: interrupted; <message>`, exit 130.
    A command catches KeyboardInterrupt where it knows what it has written, and raises this."""
