"""Which loop the GPU runs for a schedule at a batch size and dtype, in words (`rnngraph schedule --batch`, and
what `rnngraph bench` records beside each GPU measurement)."""
from __future__ import annotations


def gpu_loop(schedule, B: int, dtype: str, auto: bool, tf32: bool = False) -> str:
    """Which loop the GPU runs for `schedule` at B rows of dtype (float32 in TF32 where `tf32` allows), and why:
    the strategy, and for 'persistent' whether on tensor cores or CUDA cores (on this machine's GPU where one is
    usable, else on an H200's 132 SMs and 227 KiB of shared memory a block)."""
    if schedule.loop_strategy != "persistent":
        return schedule.loop_strategy
    from ..run.backends import gpu_problem
    from ..run.backends.cuda.persistent import runner
    if gpu_problem() is None:
        import cupy
        (sms, smem, mma), where = runner.gpu_facts(runner.device(cupy.cuda.Device().id)), "this GPU"
    else:
        (sms, smem, mma), where = (132, 227 * 1024, True), "an H200 (no GPU usable here)"
    loop = schedule.forward[1].items[0]
    return f"{runner.gpu_loop(schedule.cell, loop, B, dtype, sms, smem, mma, auto, tf32)}, on {where}"
