import sys
import numpy as np, cupy as cp, ml_dtypes
_Raw = cp.RawKernel
cp.RawKernel = lambda code, name, **kw: _Raw(code, name, options=("-lineinfo",), **kw)
from rnngraph.nn.recurrent import Recurrent
cell, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = {"heads": 12} if cell != "lstm" else {}
layer = Recurrent(cell, 768, 768, dtype="bfloat16", mode="graph", loop="persistent", backend="cupy", **kw)
x = cp.asarray(np.random.default_rng(0).standard_normal((T, B, 768)).astype(ml_dtypes.bfloat16))
for _ in range(3):
    y, _ = layer(x); layer.backward(cp.ones_like(y))
cp.cuda.Device().synchronize()
print(layer.loop_strategy, layer.loop_note)
