"""The sections of docs/performance.md on whole models and newer cells: the char-LM through rnngraph.torch
against torch.nn.LSTM (`rnngraph bench --model`), the head-wise cells, and a long sequence's memory."""
from __future__ import annotations

from ..errors import RnnGraphError
from ..ir.loading import load_cell
from ..plan.schedule import build_schedule
from ..run.workspace import stored_bytes
from .report_data import Findings, Results, num, pair, ratio, record, source, table, times


def charlm(results: Results, findings: Findings) -> str:
    doc = results.bench("charlm")
    st, rows = doc["settings"], []
    for precision in st["precisions"]:
        for B in st["B"]:
            torch_, ours = (_step(doc, B=B, precision=precision, impl=i) for i in ("torch", "default"))
            rows.append([B, precision, num(torch_["ms_per_step"]), num(ours["ms_per_step"]),
                         times(ours["ms_per_step"] / torch_["ms_per_step"]),
                         f"yes ({ours['loss_diff']:.1e})" if ours["losses_agree"] else f"no ({ours['loss_diff']:.1e})"])
            findings.compare("A whole model through PyTorch", f"the char-LM at B = {B} in {precision}",
                             {"train_ms": ours["ms_per_step"]}, {"train_ms": torch_["ms_per_step"]}, "torch.nn.LSTM")
    (T,), (H,) = st["T"], st["H"]
    return f"""## A whole model through PyTorch

A PyTorch character-level model as users train it: Embedding, {st['layers']} LSTM layers of H = {H}, Linear,
cross-entropy, `clip_grad_norm_` and AdamW, T = {T}, steps pipelined (no synchronisation between them), with
`torch.nn.LSTM` (cuDNN) against `rnngraph.torch.LSTM` as it ships (graph mode on CUDA), from the same weights on
the same batches; bf16 is `torch.autocast("cuda", dtype=torch.bfloat16)` on both sides. Milliseconds a step.

{table(["B", "precision", "torch.nn.LSTM", "rnngraph.torch.LSTM", "rnngraph ÷ torch", "losses agree (max rel diff)"],
       rows)}

{source(doc)}

At B = 1 the recurrence is bound by latency and rnngraph's persistent loop wins; in float32 at B = 32 and 128 each
frame is a cuBLAS GEMM and a fused kernel, and cuDNN's float32 kernels are faster at B = 128. Under autocast
rnngraph runs the layer in bfloat16 (its half-precision path), cuDNN in bfloat16 as well."""


def _step(doc: dict, **match) -> dict:
    """The one record of a model bench matching `match` (its time is ms_per_step, not forward_ms / train_ms)."""
    got = [r for r in doc["records"] if all(r.get(k) == v for k, v in match.items())]
    if len(got) != 1 or "ms_per_step" not in got[0]:
        raise RnnGraphError(f"{doc['path']} holds {len(got)} measured steps with {match}; expected one")
    return got[0]


def heads(results: Results, findings: Findings) -> str:
    doc = results.bench("heads")
    rows = []
    for B in doc["settings"]["B"]:
        for cell in doc["settings"]["cells"]:
            g, e = (record(doc, cell=cell, B=B, impl=i) for i in ("graph", "torch_eager"))
            c = record(doc, cell=cell, B=B, impl="cudnn@float16")
            rows.append([cell, B, g and g["loop_strategy"], pair(g), pair(e), pair(c), times(ratio(e, g))])
            if c is not None:
                findings.compare("Heads", f"{cell} (B = {B}, T = 1024, H = 768, bfloat16)", g, c, "cuDNN float16")
        findings.compare("Heads", f"sLSTM in 12 heads against cuDNN's single-head LSTM of the same size, B = {B}",
                         record(doc, cell="slstm", B=B, impl="graph"), record(doc, cell="lstm", B=B, impl="cudnn@float16"),
                         "cuDNN float16 LSTM")
    B0, B1 = doc["settings"]["B"][0], doc["settings"]["B"][-1]
    growth = record(doc, cell="slstm", B=B1, impl="graph")["train_ms"] / record(doc, cell="slstm", B=B0, impl="graph")["train_ms"]
    return f"""## Heads

xLSTM's sLSTM and the multi-head LSTM in 12 heads of 64 (H = 768, T = 1024, bfloat16), against the same cells
written as a PyTorch loop and, for the plain LSTM of that size, cuDNN in float16 (cuDNN has no head-wise cells).

{table(["cell", "B", "loop", "rnngraph graph mode", "torch eager loop", "cuDNN float16", "eager ÷ rnngraph, training"], rows)}

{source(doc)}

The head-wise cells run the per-head persistent loop: a block owns a head and some of the rows (sequences never
read one another, heads never read one another), so no block waits for another, and each of its threads sums one
(weight row, batch row) pair. On CUDA cores a block takes the fewest rows whose blocks all fit on the GPU at once:
at B = 16, 2 rows (96 blocks). From B = 32 in half precision it takes 16 rows on tensor cores (`mma.sync`; 48 blocks
at B = 64). These choices come from measuring 1, 2, 4 and 8 rows and tensor cores at B = 16, and 8 rows and
tensor cores at B = 64 (`RNNGRAPH_PERSISTENT_ROWS` sets the rows). The sLSTM training step at B = {B1} takes
{growth:.1f}× the B = {B0} one, for {B1 // B0}× the rows. cuDNN's single-head LSTM of the same size is faster than
rnngraph's sLSTM at both batch sizes."""


def memory(results: Results, findings: Findings) -> str:
    doc = results.bench("memory")
    r = doc["records"][0]
    every = stored_bytes(build_schedule(load_cell("lstm", r["H"], r["H"])), r["T"], r["B"], "float32") / 1e9
    done = "so the backward recomputes each chunk's forward" if r["recomputed"] else "yet it stored them"
    return f"""## Long sequences

One training step of an LSTM layer (H = {r['H']}, B = {r['B']}, T = {r['T']:,}, float32) in graph mode. Storing
every value and its gradient would take {every:.0f} GB, more than `RNNGRAPH_STORE_BYTES`, {done}. The
device memory peaks at {r['peak_gb']:.1f} GB, of which x, y and their gradients are
{r['inputs_outputs_gradients_gb']:.1f} GB; the rest is one chunk's workspace, the states at the chunks'
boundaries and the memory pool's slack. The step takes {r['seconds']:.1f} s.

{source(doc)}"""
