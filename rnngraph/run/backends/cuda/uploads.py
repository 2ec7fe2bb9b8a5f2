"""Host-to-device uploads that do not wait for the GPU (a call's cursor, run/cursor.py). A copy from pageable host
memory returns only once it has landed, after everything queued before it: a backward's cursor upload waited for
its forward, and the GPU then sat idle through the host's work until the backward's first launch. From pinned
memory the copy is queued like a kernel; the host values pass through a ring of pinned buffers, each written again
only after its last copy has landed (its event)."""
from __future__ import annotations

import numpy

from ....errors import RnnGraphError

SLOTS = 8           # a forward's cursor is one upload, a backward's two: a buffer is written again calls later


class Uploads:
    """dst [n] (a contiguous device array) = host [n], queued on the current stream; the buffers grow to the
    largest upload."""

    def __init__(self, cp):
        self.cp, self.k = cp, 0
        self.slots: list = [None] * SLOTS          # (pinned bytes, the event of their last copy)

    def __call__(self, dst, host):
        import cupyx
        if not dst.flags.c_contiguous:
            raise RnnGraphError("internal: an upload's destination must be contiguous")
        data = numpy.ascontiguousarray(host, dtype=dst.dtype).view(numpy.uint8).reshape(-1)
        if data.size != dst.nbytes:
            raise RnnGraphError(f"internal: uploading {data.size} bytes into {dst.nbytes}")
        slot, self.k = self.k, (self.k + 1) % SLOTS
        buf, done = self.slots[slot] or (None, self.cp.cuda.Event(disable_timing=True))
        done.synchronize()                      # its last copy landed (long ago: SLOTS uploads back)
        if buf is None or buf.size < data.size:
            buf = cupyx.empty_pinned(max(data.size, 256), numpy.uint8)
        buf[:data.size] = data
        stream = self.cp.cuda.get_current_stream()
        dst.data.copy_from_host_async(buf.ctypes.data, data.size, stream)
        done.record(stream)
        self.slots[slot] = (buf, done)
