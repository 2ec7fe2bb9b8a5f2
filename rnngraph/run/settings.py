"""Settings read from the environment by the run floor: byte counts such as 2G or 500M, counts, and the store limit."""
from __future__ import annotations

import functools
import os

from ..errors import RnnGraphError

SCALE = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def byte_count(variable: str, default: str | int) -> int:
    """The environment variable `variable` as bytes (suffixes K, M, G, T), else `default` (bytes, or a byte
    count as text)."""
    text = os.environ.get(variable)
    if text is None and isinstance(default, int):
        return default
    return _bytes(variable, default if text is None else text)


@functools.lru_cache(maxsize=64)
def _bytes(variable: str, text: str) -> int:
    """byte_count's parse, once a text (calls read their limits on every call)."""
    text = text.strip().upper()
    try:
        value = int(float(text.rstrip("KMGTB") or "x") * SCALE.get(text.rstrip("B")[-1:], 1))
    except ValueError:
        value = -1
    if value < 0:
        raise RnnGraphError(f"{variable} must be a byte count such as 2G or 500M, got {text!r}")
    return value


def count(variable: str, what: str) -> int | None:
    """The environment variable `variable` as a whole number of `what` >= 1, or None where it is unset."""
    text = os.environ.get(variable)
    if text is not None and not (text.isdigit() and int(text) >= 1):
        raise RnnGraphError(f"{variable} must be a whole number of {what} >= 1, got {text!r}")
    return int(text) if text else None


def switch(variable: str) -> bool | None:
    """The environment variable `variable` as on (1) or off (0), or None where it is unset."""
    text = os.environ.get(variable)
    if text is not None and text not in ("0", "1"):
        raise RnnGraphError(f"{variable} must be 1 or 0, got {text!r}")
    return None if text is None else text == "1"


STORE_SHARE = 16         # the default store limit is this share of the device's memory ...
STORE_FLOOR = 2 ** 31    # ... and at least this


def default_store_limit(memory_bytes: int) -> int:
    """The store limit of a device of this much memory: a sixteenth, at least 2 GiB (an H200: 9.4 GB)."""
    return max(STORE_FLOOR, memory_bytes // STORE_SHARE)


def store_limit(backend) -> int:
    """RNNGRAPH_STORE_BYTES (suffixes K, M, G), else default_store_limit of the backend's device memory: the
    values and gradients a call may keep for its backward; a longer call recomputes its chunks instead
    (Executor.forward)."""
    return byte_count("RNNGRAPH_STORE_BYTES", default_store_limit(backend.memory_bytes))
