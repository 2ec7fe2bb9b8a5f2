"""CUDA graph recordings for the cupy backend: a body is recorded once per key on a private capture
stream and replayed on the caller's stream after that; recordings are kept least recently used first,
within a count and a byte limit (RNNGRAPH_GRAPH_CACHE_BYTES)."""
from __future__ import annotations

import os
import warnings
from collections import OrderedDict

from ....errors import RnnGraphError, RnnGraphWarning
from ...settings import byte_count


class Recordings:
    """key -> (graph, or "eager" where capture failed; the device bytes the recording took), LRU."""

    def __init__(self, cupy, max_graphs: int = 1024, max_bytes: int | None = None):
        self.cp, self.max_graphs = cupy, max_graphs
        self.max_bytes = graph_bytes_limit() if max_bytes is None else int(max_bytes)
        self.entries: OrderedDict = OrderedDict()
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def run(self, key, fn):
        """Replays key's recording; the first time runs fn eagerly (compiling kernels, computing this
        call's result), then records it. A failed capture warns and stays eager for that key."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            if entry[0] == "eager":
                return fn()
            entry[0].launch(self.cp.cuda.get_current_stream())     # in order with the caller's work, no events
            return None
        fn()
        self.entries[key] = self._record(fn)
        while len(self.entries) > 1 and (len(self.entries) > self.max_graphs or self.info()["graph_bytes"] > self.max_bytes):
            self.entries.popitem(last=False)
        return None

    def forget(self, serials: set):
        """Drops the recordings of the workspaces with these serials (key[2], as the executor keys them)."""
        for key in [k for k in self.entries if k[2] in serials]:
            del self.entries[key]

    def info(self) -> dict:
        """Recorded graphs and the device bytes they took when instantiated (the driver's free memory
        before and after each recording: it moves in pages, so a small graph may count 0)."""
        return {"graphs": len(self.entries), "graph_bytes": sum(b for _, b in self.entries.values())}

    def _record(self, fn):
        cp, s = self.cp, self.stream
        cp.cuda.get_current_stream().synchronize()
        free = cp.cuda.runtime.memGetInfo()[0]
        graph, error = None, None
        with s:
            s.begin_capture()
            try:
                fn()
            except Exception as e:          # never leave the stream capturing
                error = e
            finally:
                try:
                    graph = s.end_capture()
                except Exception as e:
                    error = error or e
        if error is not None or graph is None:
            warnings.warn(f"CUDA graph capture failed ({type(error).__name__}: {error}); running this "
                          "loop eagerly instead", RnnGraphWarning, stacklevel=5)
            return "eager", 0
        cp.cuda.get_current_stream().synchronize()
        return graph, max(0, free - cp.cuda.runtime.memGetInfo()[0])


def graph_bytes_limit() -> int:
    """RNNGRAPH_GRAPH_CACHE_BYTES (bytes; suffixes K, M, G), else 2 GiB."""
    return byte_count("RNNGRAPH_GRAPH_CACHE_BYTES", "2G")


def chunk_frames_setting(given: int | None) -> int | None:
    """Frames per recorded chunk: `given`, else RNNGRAPH_CHUNK_FRAMES, else None: each loop strategy's own
    (plan/loops, LoopStrategy.chunk_frames); 0 turns chunks off."""
    text = str(given) if given is not None else os.environ.get("RNNGRAPH_CHUNK_FRAMES")
    if text is None:
        return None
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 0:
        raise RnnGraphError(f"the chunk length (chunk_frames, RNNGRAPH_CHUNK_FRAMES) must be a whole number of frames "
                            f">= 0 (0: no chunks), got {text!r}")
    return k
