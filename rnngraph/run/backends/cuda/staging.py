"""Host-to-device copies that never wait for the GPU: a host array is copied into pinned memory and from there
to the device in stream order. A copy from pageable memory (cupy's ndarray.set) first waits for all the GPU's
work, so a call in chunks that wrote its cursor that way (run/cursor.py: once a forward, twice a backward) left
the GPU idle while the host prepared the rest of the call."""
from __future__ import annotations

import numpy as np

RING = 4        # pinned buffers, each reused once the copy from it has run: the host may run this many copies ahead


class Staging:
    """A ring of pinned host buffers and, for each, an event recorded after the copy that last read it."""

    def __init__(self, cupy):
        self.cp, self.next = cupy, 0
        self.ring: list = [[np.empty(0, np.uint8), None] for _ in range(RING)]

    def upload(self, dst, host):
        """dst (a contiguous device array) = host (a numpy array of its size and dtype), in the current stream's
        order, returning before the copy has run."""
        slot = self.ring[self.next]
        self.next = (self.next + 1) % RING
        buf, done = slot
        if done is not None:
            done.synchronize()          # the copy that last read this buffer has run
        if buf.nbytes < host.nbytes:
            n = max(host.nbytes, 4096)
            slot[0] = buf = np.frombuffer(self.cp.cuda.alloc_pinned_memory(n), np.uint8, n)
        staged = buf[:host.nbytes].view(host.dtype).reshape(dst.shape)
        staged[...] = host.reshape(dst.shape)
        stream = self.cp.cuda.get_current_stream()
        dst.set(staged, stream=stream)
        slot[1] = stream.record()
