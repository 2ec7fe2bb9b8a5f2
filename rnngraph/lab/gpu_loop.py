"""Which loop the GPU runs for a schedule at a batch size and dtype, in words (`rnngraph schedule --batch`, and
what `rnngraph bench` records beside each GPU measurement)."""
from __future__ import annotations


def gpu_loop(schedule, B: int, dtype: str, auto: bool, tf32: bool = False) -> str:
    """Which loop the GPU runs for `schedule` at B rows of dtype (float32 in TF32 where `tf32` allows), and why:
    the strategy, and for 'persistent' whether on tensor cores or CUDA cores (on this machine's GPU where one is
    usable, else on an H200's 132 SMs and 227 KiB of shared memory a block)."""
    if schedule.loop_strategy != "persistent":
        return schedule.loop_strategy + (_in_parts(schedule, B, dtype) if schedule.loop_strategy == "stages" else "")
    from ..run.backends import gpu_problem
    from ..run.backends.cuda.persistent import runner
    if gpu_problem() is None:
        import cupy
        (sms, smem, mma), where = runner.gpu_facts(runner.device(cupy.cuda.Device().id)), "this GPU"
    else:
        (sms, smem, mma), where = (132, 227 * 1024, True), "an H200 (no GPU usable here)"
    loop = schedule.forward[1].items[0]
    ran = runner.gpu_loop(schedule.cell, loop, B, dtype, sms, smem, mma, auto, tf32)
    return f"{ran}{_in_parts(schedule, B, dtype) if ran.startswith('stages') else ''}, on {where}"


def _in_parts(schedule, B: int, dtype: str) -> str:
    """'; ...' where stages' backward runs its per-frame products in float32 parts (run/backends/cuda/split.py)."""
    from ..plan.backward import next_frame_readers
    from ..run.backends.cuda.rows import group_kernel
    from ..run.backends.cuda.split import parts_with
    cell, counts = schedule.cell, []
    for step, reader in next_frame_readers(schedule).items():
        spec = group_kernel(cell, reader.item.nodes, "bwd_atomic" if reader.atomic else "bwd")
        S = parts_with(spec, step.item.operand, B, sum(step.item.sizes), dtype)
        if S:
            counts.append(f"d{step.item.operand}@t-1 in {S} float32 parts")
    return f"; backward products {', '.join(counts)}" if counts else ""
