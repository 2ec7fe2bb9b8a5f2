"""rnngraph's one exception type and its warning category."""


class RnnGraphError(ValueError):
    """Any invalid cell, schedule, layer call or checkpoint. The message names what is wrong and how to fix it."""


class RnnGraphWarning(UserWarning):
    """Something legal but probably unintended, e.g. an input the cell never reads."""
