"""A call's cursor: where each chunk of a call in chunks lies in it, as one small int64 array on the device
that the chunks' kernels read (run/chunks.py), and the loop kernels that walk only a chunk's n frames
(ArrayBackend.walking_loops, through Workspace.running), written by the host once a forward (and, for its
backward, the chunk index and the gradients' slots once more).

Layout [HEAD + B + 3·slots + 3·N]: c (the chunk running), step (what a chunk's forward adds to c: 1, or 0 when
the backward runs it again), T, N; the B lengths (T where none are given); the address and the frame and batch
strides (elements) of each slot, the caller's arrays [T, B, F] the call reads and writes; per chunk, (t0, n,
stash offset or -1).
"""
from __future__ import annotations

import numpy as np

from ..arrays import address

HEAD = 4                     # c, step, T, N


class Cursor:
    """A call's cursor: `dev` on the backend (layout above) and, for the references, its slots' arrays."""

    def __init__(self, dev, B: int, slots: int):
        self.dev, self.B, self.slots = dev, B, slots
        self.arrays: list = [None] * slots

    def table(self) -> int:
        """Where the chunks' rows start in dev."""
        return HEAD + self.B + 3 * self.slots

    def write(self, be, T: int, chunks: list, offsets: list, lengths=None):
        """A forward's cursor: c = 0, step 1, its chunks (t0, L, n) with their stash offsets, the lengths
        ([B] on the backend, copied on the device; None: T) and every slot set so far."""
        host = np.zeros(self.table() + 3 * len(chunks), np.int64)
        host[:HEAD] = (0, 1, T, len(chunks))
        host[HEAD:HEAD + self.B] = T
        host[self.table():] = [v for (t0, _, n), off in zip(chunks, offsets) for v in (t0, n, off)]
        be.upload(self.dev[:len(host)], self._slots(host, range(self.slots)))
        if lengths is not None:
            be.copy(self.dev[HEAD:HEAD + self.B], lengths)

    def rewind(self, be, N: int, first: int):
        """A backward's cursor: c = N - 1, step 0 (a forward run again stays at its chunk), and the slots from
        `first` on (the gradients) as set since the forward."""
        be.upload(self.dev[:2], np.array([N - 1, 0], np.int64))
        host = self._slots(np.zeros(self.table(), np.int64), range(first, self.slots))
        be.upload(self.dev[HEAD + self.B + 3 * first:self.table()], host[HEAD + self.B + 3 * first:])

    def _slots(self, host, which):
        for k in which:
            a = self.arrays[k]
            if a is not None:
                host[HEAD + self.B + 3 * k:HEAD + self.B + 3 * k + 3] = \
                    (address(a), a.strides[0] // a.itemsize, a.strides[1] // a.itemsize)
        return host

    def where(self) -> tuple:
        """(c, t0, n, stash offset, N) as the host reads them (the references: a host array)."""
        d = self.dev
        c = int(d[0])
        r = self.table() + 3 * c
        return c, int(d[r]), int(d[r + 1]), int(d[r + 2]), int(d[3])

    def parts(self, xp):
        """Each sequence's frames in the chunk [B] (its length less t0, clipped to 0 .. n), as the references
        read them."""
        _, t0, n, _, _ = self.where()
        return xp.clip(xp.asarray(self.dev[HEAD:HEAD + self.B]) - t0, 0, n)
