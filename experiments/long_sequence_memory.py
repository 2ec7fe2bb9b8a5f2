"""Peak memory of one training step over a long sequence (recomputation keeps it near the inputs', outputs'
and their gradients' size): an LSTM layer in graph mode on the GPU, or staged on the CPU with --cpu.

    python experiments/long_sequence_memory.py                    # H = 512, B = 8, T = 100,000 on the GPU
    python experiments/long_sequence_memory.py --cpu -T 1000000 -H 128 -B 1
"""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rnngraph.nn import Recurrent          # noqa: E402
from rnngraph.lab.bench import machine_info   # noqa: E402
from rnngraph.run.backends import cpu_backend   # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-T", type=int, default=100_000)
    p.add_argument("-B", type=int, default=8)
    p.add_argument("-H", type=int, default=512)
    p.add_argument("--cpu", action="store_true", help="the CPU (staged, the backend auto picks) instead of the GPU (graph mode)")
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    if a.cpu:
        xp, layer = np, Recurrent("lstm", a.H, a.H, backend=cpu_backend())     # the compiled one where it runs
    else:
        import cupy as xp
        layer = Recurrent("lstm", a.H, a.H, backend="cupy", mode="graph")
        xp.get_default_memory_pool().free_all_blocks()
    x = xp.asarray(np.random.default_rng(0).standard_normal((a.T, a.B, a.H), dtype=np.float32) * 0.1)
    start = time.perf_counter()
    y, _ = layer(x)
    gx, _, _ = layer.backward(xp.ones_like(y))
    if not a.cpu:
        xp.cuda.get_current_stream().synchronize()
    seconds = time.perf_counter() - start
    io = 4 * x.nbytes                         # x, y and their gradients
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if a.cpu else \
        xp.get_default_memory_pool().total_bytes()
    out = {"T": a.T, "B": a.B, "H": a.H, "device": "cpu" if a.cpu else "gpu", "recomputed": bool(layer.recomputed),
           "seconds": round(seconds, 3), "peak_gb": round(peak / 1e9, 3),
           "inputs_outputs_gradients_gb": round(io / 1e9, 3), "finite": bool(xp.isfinite(gx).all()),
           "impl": "staged" if a.cpu else "graph", "cell": "lstm", "dtype": "float32"}
    print(json.dumps(out))
    if a.json:                  # as `rnngraph bench --json` writes: machine (with the command), settings, results
        doc = dict(machine=machine_info(), settings=vars(a), results=[out])
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
