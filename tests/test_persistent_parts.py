"""experiments/persistent_parts.py's cuts: each variant of a persistent kernel compiles for sm_90 (NVRTC) and takes
out what it names, at its call sites, not in the helpers' definitions (the timing itself is a GPU probe)."""
import importlib.util
from pathlib import Path

import ml_dtypes
import pytest

from rnngraph.ir.loading import load_cell
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends.cuda.persistent import runner

from nvrtc import nvrtc_compile

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "persistent_parts.py"
H200 = dict(sms=132, smem=227 * 1024)


def _script():
    spec = importlib.util.spec_from_file_location("persistent_parts", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("B, dtype", [(16, ml_dtypes.bfloat16), (1, "float32")])
def test_every_cut_compiles_and_takes_out_its_calls(B, dtype, monkeypatch):
    mod = _script()
    cell = load_cell("lstm", 64, 64)
    sched = build_schedule(cell, loop="persistent")
    loops = [it for sec in (*sched.forward, *sched.backward) for it in sec.items if hasattr(it, "reverse")]
    assert len(loops) == 2
    made = {}
    try:
        for name, edits in mod.VARIANTS.items():
            monkeypatch.setattr(runner, "persistent_kernel", mod.cut(edits))
            runner._KERNELS.clear()
            for lp in loops:
                k = runner.chosen(cell, lp, B, dtype, **H200)
                nvrtc_compile(k.source, k.name)
                body = k.source[k.source.index('extern "C"'):]
                assert not any(a in body for a, _ in edits), name       # every call the cut names is gone
                made[name, lp.reverse] = body
    finally:
        runner._KERNELS.clear()         # no cut kernel stays where later tests would find it
    for reverse in (False, True):      # each cut changes the kernel as generated (where it has such calls)
        changed = {n for n in mod.VARIANTS if made[n, reverse] != made["as generated", reverse]}
        assert {"no staging" if B > 1 else "no barrier", "all three"} <= changed, (reverse, changed)
