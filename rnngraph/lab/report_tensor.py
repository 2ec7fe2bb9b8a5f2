"""The sections of docs/performance.md on the tensor-core persistent loop beyond the H = 512 LSTM in half precision:
wider LSTMs, GRU and MGU (bfloat16 against cuDNN float16), and float32 in TF32 (against cuDNN with TF32 allowed
on both sides, and both with TF32 off)."""
from __future__ import annotations

from ..run.backends.cuda.persistent.runner import SPLIT_FROM, TENSOR_CORES_FROM
from .report_bench import auto_rows
from .report_data import Findings, Results, num, pair, ran, ratio, record, source, table, times

WIDER = "Wider LSTMs, GRU and MGU"
TF32 = "float32 in TF32"


def wider(results: Results, findings: Findings) -> str:
    wide, cells = results.bench("wide"), results.bench("gru_b64")
    rows, lost, gaps = [], [], []   # lost: where the persistent kernel 'auto' ran trained slower than stages here
    for H in wide["settings"]["H"]:
        for B in wide["settings"]["B"]:
            auto, c = record(wide, H=H, B=B, impl="graph", loop="auto"), record(wide, H=H, B=B, impl="cudnn@float16")
            stages = record(wide, H=H, B=B, impl="graph", loop="stages")
            gaps.append((f"H = {H}, B = {B}", ratio(auto, c)))
            rows.append([H, B, f"**{pair(auto)}** ({ran(auto)})", pair(stages), pair(c), times(gaps[-1][1])])
            findings.compare(WIDER, f"bfloat16 LSTM at H = {H}, B = {B}", auto, c, "cuDNN float16")
            if ran(auto) != "stages" and (ratio(auto, stages) or 0) > 1:
                lost.append(f"H = {H}, B = {B} ({num(auto['train_ms'])} against {num(stages['train_ms'])} ms)")
    lstm = record(cells, cell="lstm", impl="graph", loop="auto")
    per_cell = []
    for cell in cells["settings"]["cells"]:
        auto = record(cells, cell=cell, impl="graph", loop="auto")
        c = record(cells, cell=cell, impl="cudnn@float16", optional=True)
        per_cell.append([cell, f"**{pair(auto)}** ({ran(auto)})", pair(record(cells, cell=cell, impl="graph",
                                                                               loop="stages")),
                         pair(c), times(ratio(auto, c)), times(ratio(auto, lstm))])
        findings.compare(WIDER, f"bfloat16 {cell} at B = 64", auto, c, f"cuDNN float16's {cell}")
    return f"""## {WIDER}

The LSTM in bfloat16 at H = 768 and 1024 as `auto` runs it, against `stages` and cuDNN float16 (T = 100):

{table(["H", "B", "rnngraph `auto` (loop)", "rnngraph `stages`", "cuDNN float16", "`auto` ÷ cuDNN, training"], rows)}

{source(wide)}

`auto` runs the tensor-core persistent kernel up to {auto_rows()}, where it measured about as fast as
`stages` or faster, and `stages` beyond (the measurements are beside the table in
`run/backends/cuda/persistent/runner.py`). {_lost(lost)}{_against(gaps)}

GRU and MGU (a user cell) at B = 64, H = 512, bfloat16, against cuDNN float16's GRU (cuDNN has no MGU) and the LSTM:

{table(["cell", "rnngraph `auto` (loop)", "rnngraph `stages`", "cuDNN float16", "`auto` ÷ cuDNN", "÷ the LSTM"],
       per_cell)}

{source(cells)}"""


def _against(gaps: list) -> str:
    """gaps [(configuration, auto's training step ÷ cuDNN float16's)] in words: where auto is faster, then the rest."""
    won, rest = [g for g in gaps if g[1] < 1], [r for _, r in gaps if r >= 1]
    span = f"{min(rest):.2f}–{max(rest):.2f}×" if len(rest) > 1 else f"{rest[0]:.2f}×" if rest else ""
    if not won:
        return f"At these widths neither loop reaches cuDNN float16: its training step takes {span} cuDNN's here."
    faster = ", ".join(f"{r:.2f}× cuDNN float16's time at {where}" for where, r in won)
    return f"`auto`'s training step takes {faster}" + (f", and {span} elsewhere here." if rest else ".")


def _lost(lost: list) -> str:
    return f"In this run `stages` trained faster where `auto` ran the persistent kernel at {', '.join(lost)}. " \
        if lost else ""


def tf32(results: Results, findings: Findings) -> str:
    doc, off = results.bench("tf32"), results.bench("tensor_cores")
    rows = []
    for B in doc["settings"]["B"]:
        auto, c = record(doc, B=B, impl="graph", loop="auto"), record(doc, B=B, impl="cudnn")
        auto_off, c_off = record(off, B=B, impl="graph@float32", loop="auto"), record(off, B=B, impl="cudnn@float32")
        rows.append([B, f"**{pair(auto)}** ({ran(auto)})", pair(record(doc, B=B, impl="graph", loop="persistent")),
                     pair(c), times(ratio(auto, c)), f"{pair(auto_off)} ({ran(auto_off)})", pair(c_off),
                     times(ratio(auto_off, c_off))])
        findings.compare(TF32, f"float32 LSTM in TF32 at B = {B}", auto, c, "cuDNN's in TF32")
    return f"""## {TF32}

With TF32 allowed (`torch.backends.cudnn.allow_tf32`, which `rnngraph.torch.LSTM` follows as `torch.nn.LSTM` does;
`get_backend("cupy", "graph", tf32=True)`; `rnngraph bench --tf32`) float32 runs the persistent loop on tensor cores
from B = {TENSOR_CORES_FROM}: `mma.sync` m16n8k8 with the weights rounded to TF32 once and each frame's x as it enters the
MMA (to nearest), float32 sums. An output then differs from float32's by up to about 2⁻¹⁰ of the sum of its
products' sizes; the GPU tests bound each array of a training step within 4 · 2⁻¹⁰ of the float64 reference. The
LSTM, T = 100, H = 512, against cuDNN with TF32 allowed in the same process, and with TF32 off (from the table
above).

With TF32 off, from {auto_rows(SPLIT_FROM)} float32 runs on
tensor cores in 3xTF32: the weights stay float32, and each operand is split as it enters the MMA into its TF32
rounding (big) and the TF32 rounding of the rest (small); three MMAs add small·big, big·small and big·big. A product
is then within about 3 · 2⁻²² of its exact value, where float32's own rounding of it is 2⁻²⁴, and the sums are
float32's: the GPU tests bound every array of a training step within 1e-5 of the float64 reference, as on CUDA
cores, where TF32's err by more. `RNNGRAPH_PERSISTENT_TENSOR_CORES=0` keeps float32 on CUDA cores.

{table(["B", "rnngraph TF32 `auto` (loop)", "rnngraph TF32 `persistent`", "cuDNN TF32", "÷ cuDNN",
        "rnngraph float32, TF32 off", "cuDNN float32, TF32 off", "÷ cuDNN"], rows)}

{source(doc)}"""
