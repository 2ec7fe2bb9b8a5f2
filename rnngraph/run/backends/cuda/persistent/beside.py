"""Work beside a running backward loop: the GEMMs after it, frame by frame as it walks them, on a side stream and
the SMs its cooperative grid leaves idle (Executor._loop, CupyBackend.launch_beside).

The backward kernel tells each row group's frames walked after every frame's first barrier (kernels.walked); a
one-thread kernel on the side stream ends once they reach a count (WALKED_SOURCE), and the GEMMs of those frames
follow it there. The side stream forks after the launch's zeroing of that count, so no wait reads the last
launch's; and no GEMM starts before the kernel has passed a barrier, so every block of its grid is resident by then
(the waiting kernel's one block may hold an SM: the grid leaves SPARE_SMS idle). Measured on an H200 (bfloat16 LSTM,
T = 1024, B = 16, H = 768: 96 blocks of 132 SMs): the three GEMMs after the loop took 0.36 ms alone; started
0.3 ms into the backward beside it, they ended 1.24 ms later, and the backward took 4.711 ms against 4.677 alone.
"""
from __future__ import annotations

import numpy

SPARE_SMS = 16      # fewer idle SMs: the side's GEMMs would crawl, and the main stream wait for them at the join

WALKED_SOURCE = r"""
extern "C" __global__ void rg_persist_walked(const unsigned int* bar, int groups, unsigned int frames) {
    // ends once every row group of the running backward has told `frames` frames walked (kernels.walked)
    for (int g = 0; g < groups; ++g) {
        unsigned int seen;
        do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar + 2 + 2 * g) : "memory"); }
        while (seen < frames);
    }
}
"""


class Launch(tuple):
    """A persistent loop's launches (zeroing, the kernel, its sums); `walked` (bar, row groups) where its kernel
    tells the frames it has walked and work may run beside it."""
    walked = None


def telling(launches: tuple, k, bar, sms: int) -> tuple:
    """launches as a Launch whose `walked` is (bar, k.row_groups) where kernel k tells its frames walked (a
    backward with a barrier a frame) on a grid leaving SPARE_SMS of the GPU's `sms` idle; else as they are."""
    if not (k.tells_walked and k.blocks + SPARE_SMS <= sms):
        return launches
    out = Launch(launches)
    out.walked = (bar, k.row_groups)
    return out


def launch_beside(be, launch: Launch, spans):
    """ArrayBackend.launch_beside on the GPU: the launch's zeroing, then the side stream forks (its waits read this
    launch's count), the kernel and its sums run on, and each span's fn runs on the side stream after a one-thread
    kernel that waits for `walked` frames, or for the main stream's end of the loop (walked None); the main stream
    then waits for the side's end. Recorded as a branch of the graph when capturing."""
    cp, main = be.xp, be.xp.cuda.get_current_stream()
    if getattr(be, "side", None) is None:
        be.side = cp.cuda.Stream(non_blocking=True)
    fork, end, done = (cp.cuda.Event(disable_timing=True) for _ in range(3))
    be.launch(launch[:1])
    fork.record(main)
    be.launch(launch[1:])
    end.record(main)
    be.side.wait_event(fork)
    bar, groups = launch.walked
    wait = be.raw("rg_persist_walked", WALKED_SOURCE)
    with be.side:
        for walked, fn in spans:
            if walked is None:
                be.side.wait_event(end)
            else:
                wait((1,), (1,), (bar, numpy.int32(groups), numpy.uint32(walked)))
            fn()
    done.record(be.side)
    main.wait_event(done)
