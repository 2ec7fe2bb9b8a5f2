"""Experiment: the compiled CPU backend's first call, with its disk cache empty (numba compiles every generated
function) and warm (a second process loads them): each cell's `rnngraph bench` run twice in fresh processes
sharing one new RNNGRAPH_CACHE, its first training step's seconds (first_s: workspaces, kernels, one step) and
its training step's milliseconds after warm-up. A measurement, not a test:

    python experiments/cpu_first_call.py [--cells lstm,mgu] [-T 100] [-B 32] [-H 256]
                                         [--json FILE] (docs/performance.md reads results/bench/cpu_first_call.json)

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset in the child processes, as the CPU bench commands unset them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout, installed or not


def first_call(cell: str, T: int, B: int, H: int, cache: Path) -> dict:
    """One `rnngraph bench` process of `cell` on the compiled CPU backend with RNNGRAPH_CACHE=cache: its record."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(RNNGRAPH_CACHE=str(cache), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    out = cache.parent / f"{cell}.json"
    subprocess.run([sys.executable, "-m", "rnngraph", "bench", "--cell", cell, "-T", str(T), "-B", str(B), "-H", str(H),
                    "--impls", "staged", "--repeats", "5", "--json", str(out), "--overwrite"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    (record,) = json.loads(out.read_text())["results"]
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="lstm,mgu")
    ap.add_argument("-T", type=int, default=100)
    ap.add_argument("-B", type=int, default=32)
    ap.add_argument("-H", type=int, default=256)
    ap.add_argument("--json", metavar="FILE", help="also write the machine, the settings and each process's times here")
    args = ap.parse_args(argv)
    from rnngraph.lab.bench import machine_info
    results = []
    for cell in args.cells.split(","):
        with tempfile.TemporaryDirectory(prefix="rnngraph_first_call_") as tmp:
            cache = Path(tmp) / "cache"
            for state in ("cold", "warm"):
                r = first_call(cell, args.T, args.B, args.H, cache)
                results.append({"cell": cell, "cache": state, "first_s": r["first_s"], "train_ms": r["train_ms"],
                                "backend": r["backend"], "T": args.T, "B": args.B, "H": args.H})
                print(f"{cell:>6} {state}: first call {r['first_s']:.2f} s, then {r['train_ms']:.1f} ms a training "
                      f"step ({r['backend']})", flush=True)
    if args.json:
        doc = {"machine": machine_info(), "settings": vars(args), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
