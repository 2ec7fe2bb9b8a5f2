"""Settings read from the environment by the run floor: byte counts such as 2G or 500M."""
from __future__ import annotations

import os

from ..errors import RnnGraphError

SCALE = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def byte_count(variable: str, default: str) -> int:
    """The environment variable `variable` as bytes (suffixes K, M, G, T), else `default`."""
    text = os.environ.get(variable, default).strip().upper()
    try:
        value = int(float(text.rstrip("KMGTB") or "x") * SCALE.get(text.rstrip("B")[-1:], 1))
    except ValueError:
        value = -1
    if value < 0:
        raise RnnGraphError(f"{variable} must be a byte count such as 2G or 500M, got {text!r}")
    return value
