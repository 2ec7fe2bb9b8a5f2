"""The sections of docs/performance.md on whole models and newer cells: the char-LM through rnngraph.torch against
torch.nn.LSTM (`rnngraph bench --model`), the head-wise cells, the compiled CPU backend against torch on the CPU, a
word-level model through rnngraph.torch on the CPU and a long sequence's memory (calls of many shapes:
report_shapes.py)."""
from __future__ import annotations

import re

from ..errors import RnnGraphError
from ..ir.loading import load_cell
from ..plan.schedule import build_schedule
from ..run.workspace import stored_bytes
from .report_data import Findings, Results, num, pair, ratio, record, slope, source, table, times


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
    doc, b1, b16 = results.bench("heads"), results.bench("heads_b1"), results.bench("heads_b16")
    ours = lambda cell, B: record(doc, cell=cell, B=B, impl="graph")
    cudnn = {B: record(doc, cell="lstm", B=B, impl="cudnn@float16") for B in doc["settings"]["B"]}
    rows, later = [], b16["machine"]["date"] > doc["machine"]["date"]   # B = 16 measured again, later: its findings
    for B in doc["settings"]["B"]:
        for cell in doc["settings"]["cells"]:
            g, e, f = (record(doc, cell=cell, B=B, impl=i) for i in ("graph", "torch_eager", "flashrnn_cuda"))
            c = record(doc, cell=cell, B=B, impl="cudnn@float16")
            rows.append([cell, B, g and g["loop_strategy"], pair(g), pair(f), pair(e), pair(c), times(ratio(f, g)),
                         times(ratio(e, g))])
            if later and B == 16:
                continue
            if c is not None:
                findings.compare("Heads", f"{cell} (B = {B}, T = 1024, H = 768, bfloat16)", g, c, "cuDNN float16")
            findings.compare("Heads", f"{cell} (B = {B}, T = 1024, H = 768, bfloat16)", g, f, "FlashRNN (cuda)")
        if not (later and B == 16):
            findings.compare("Heads", f"sLSTM in 12 heads against cuDNN's single-head LSTM of the same size, B = {B}",
                             ours("slstm", B), cudnn[B], "cuDNN float16 LSTM")
    per_cell = [[c, *map(num, slope(b1, cell=c))] for c in b1["settings"]["cells"]]
    lstm16 = record(b16, cell="lstm", impl="cudnn@float16")
    at16 = [[c, r["loop_strategy"], pair(r), num(r["forward_ms"] * 1e3 / r["T"]), pair(lstm16),
             f"{times(ratio(r, lstm16, 'forward'))} / {times(ratio(r, lstm16))}"]
            for c in ("slstm", "mh_lstm", "lstm") for r in [record(b16, cell=c, impl="graph")]]
    for c, *_ in at16:
        findings.compare("Heads", f"{c} at B = 16 against cuDNN's single-head LSTM of the same size",
                         record(b16, cell=c, impl="graph"), lstm16, "cuDNN float16 LSTM")
    plain = record(b16, cell="lstm", impl="graph")
    B0, B1 = doc["settings"]["B"][0], doc["settings"]["B"][-1]
    growth = ours("slstm", B1)["train_ms"] / ours("slstm", B0)["train_ms"]
    against = {name: " and ".join(f"{times(ratio(ours(name, B), c))} its time at B = {B}" for B, c in cudnn.items())
               for name in ("slstm", "mh_lstm")}
    fused = next((r.get("error") or r.get("skipped") for r in doc["records"] if r["impl"] == "flashrnn"
                  and record(doc, cell=r["cell"], B=r["B"], impl="flashrnn") is None), None)
    fused = (f"FlashRNN's fused kernels (`--impls flashrnn`, its `cuda_fused` backend) did not build on this machine "
             f"(`{fused}`: FlashRNN builds a helper extension, `gpu_info2`, that reads `cudaDeviceProp.clockRate`, a "
             "field CUDA 13 removed), so only its `cuda` backend is in the table.\n\n") if fused else ""
    again = ("B = 16 is measured again below, in a later run (the dates and commits are in the sources); the summary "
             "of\nwhere rnngraph is slower takes B = 16 from that run.\n\n") if later else ""
    return f"""## Heads

xLSTM's sLSTM and the multi-head LSTM in 12 heads of 64 (H = 768, T = 1024, bfloat16), against the same cells
in FlashRNN (its `cuda` backend: a GEMM and a pointwise kernel a frame) and written as a PyTorch loop, and, for the
plain LSTM of that size, cuDNN in float16 (cuDNN has no head-wise cells). FlashRNN's sLSTM is its own variant (a
log-sigmoid forget gate): the same work, not the same numbers. `--impls torch_compile` times that PyTorch loop
through `torch.compile` too, but it compiles the loop unrolled, so its compile grows with T; at T = 1024 it is not in
this table.

{table(["cell", "B", "loop", "rnngraph graph mode", "FlashRNN (cuda)", "torch eager loop", "cuDNN float16",
        "FlashRNN ÷ rnngraph, training", "eager ÷ rnngraph, training"], rows)}

{source(doc)}

{again}{fused}The head-wise cells run the per-head persistent loop: a block owns a head and some of the rows (sequences never
read one another, heads never read one another), so no block waits for another. On CUDA cores a block takes the
fewest rows whose blocks all fit on the GPU at once: at B = 16, 2 rows (96 blocks), each thread summing both rows
against one weight row. From B = 32 in half precision it takes 16 rows on tensor cores (`mma.sync`; 48 blocks at
B = 64). These choices come from measuring 1, 2, 4 and 8 rows and tensor cores at B = 16, and 8 rows and tensor
cores at B = 64 (`RNNGRAPH_PERSISTENT_ROWS` sets the rows). The sLSTM training step at B = {B1} takes
{growth:.1f}× the B = {B0} one, for {B1 // B0}× the rows. Against cuDNN's single-head LSTM of the same size,
rnngraph's sLSTM training step takes {against["slstm"]}; the multi-head LSTM's takes {against["mh_lstm"]}.

Their forward runs in warp roles: in each block, eight warps sum the heads' GEMM (on tensor cores in half
precision), others run the elements and as many again store the elements' values (8, 4 and 4 warps at B = 16),
meeting at named barriers, so a frame waits only for the GEMM and the elements' arithmetic ([On a GPU](gpu.md#the-persistent-kernel)). Measured
again in one process at B = 16 against
cuDNN float16's single-head LSTM of the same size (the forward's µs a frame: the whole forward, the input GEMM
included, over T):

{table(["cell", "loop", "rnngraph graph mode, ms", "forward µs a frame", "cuDNN float16 LSTM, ms",
        "rnngraph ÷ cuDNN"], at16)}

{source(b16)}

The last row is the plain LSTM of the same size (FlashRNN's own benchmark shape): the persistent kernel of full
matrices ({plain["gpu_loop"].split(", on ")[0].removeprefix("persistent (").rstrip(")")}), whose training step takes
{times(ratio(plain, lstm16))} cuDNN float16's. Its forward frame waits for every block's h (tagged words, no grid
barrier), its backward frame for a grid barrier and the whole 4H-wide gate gradient staged from L2 in each block,
where the head-wise cells' blocks wait for no one.

This forward's time moves between processes on the same GPU: five runs of its kernels on one day gave the sLSTM's
forward 0.83 to 1.02 ms (0.81 to 0.99 µs a frame), so compare within a run. In bfloat16 the kernels compile with
fast math ([Half precision](half.md#on-the-gpu)), which takes about 0.1 µs off this forward's frame.

At B = 1 (H = 512 in 8 heads of 64, bfloat16, one block a head) a frame costs, as the slope from T = 100 to 1000:

{table(["cell", "forward µs a frame", "training step µs a frame"], per_cell)}

{source(b1)}"""


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


def cpu(results: Results, findings: Findings) -> str:
    doc = results.bench("cpu")
    rows = []
    for cell in doc["settings"]["cells"]:
        for B in doc["settings"]["B"]:
            ours, nn, eager, compiled = (record(doc, cell=cell, B=B, impl=i, optional=True)
                                         for i in ("staged", "torch_cpu", "torch_eager", "torch_compile"))
            rows.append([cell, B, f"**{pair(ours)}**", pair(nn), pair(eager), pair(compiled), times(ratio(ours, nn)),
                         times(ratio(ours, compiled))])
            findings.compare("On the CPU", f"{cell} on the CPU at B = {B}", ours, nn, "torch.nn.LSTM's (oneDNN)")
            findings.compare("On the CPU", f"{cell} on the CPU at B = {B}", ours, compiled, "torch.compile's")
    m, B = doc["metadata"], max(doc["settings"]["B"])
    ours, nn = (record(doc, cell="lstm", B=B, impl=i) for i in ("staged", "torch_cpu"))
    shapes, sources = [], []
    for name in ("cpu_b64", "cpu_small"):       # one shape each
        other = results.bench(name)
        (T2,), (B2,), (H2,) = (other["settings"][k] for k in ("T", "B", "H"))
        ours2, nn2 = (record(other, cell="lstm", B=B2, impl=i) for i in ("staged", "torch_cpu"))
        findings.compare("On the CPU", f"lstm on the CPU at T = {T2}, B = {B2}, H = {H2}", ours2, nn2,
                         "torch.nn.LSTM's (oneDNN)")
        shapes.append([f"{T2}, {B2}, {H2}", pair(ours2), pair(nn2), times(ratio(ours2, nn2)),
                       times(ratio(ours2, nn2, "forward"))])
        sources.append(source(other))
    first = results.bench("cpu_first_call")
    calls = {(r["cell"], r["cache"]): r for r in first["records"]}
    first_rows = [[cell, f"{calls[cell, 'cold']['first_s']:.2f}", f"{calls[cell, 'warm']['first_s']:.2f}",
                   num(calls[cell, "warm"]["train_ms"])] for cell in dict.fromkeys(c for c, _ in calls)]
    T3, B3, H3 = (first["settings"][k] for k in ("T", "B", "H"))
    return f"""## On the CPU

The compiled CPU backend (what `backend="auto"` runs without a GPU: each direction's loop one compiled function,
the merged GEMMs in MKL on rnngraph's threads, [Layers](layers.md#the-cpu-backends-threads)) against torch on the
same CPU: `torch.nn.LSTM` (oneDNN's fused RNN), and
the cell written as a torch eager loop and through `torch.compile`; float32, T = {doc['settings']['T'][0]}, H = {doc['settings']['H'][0]}, one
process, on a 2-core machine like the project's CI machine ({m['device']}; {_libraries(m['cpu'])}), shared with
other work: torch's own training step has varied by up to 2× between runs there, so compare within a row.

{table(["cell", "B", "rnngraph, compiled CPU", "torch.nn.LSTM", "torch eager loop", "torch.compile",
        "÷ torch.nn.LSTM, training", "÷ torch.compile, training"], rows)}

{source(doc)}

The LSTM at other sizes, against torch.nn.LSTM only:

{table(["T, B, H", "rnngraph, compiled CPU", "torch.nn.LSTM", "÷ torch.nn.LSTM, training", "forward"], shapes)}

{(2 * chr(10)).join(sources)}

A process's first call compiles the generated functions with numba, or loads them from the disk cache
(`$RNNGRAPH_CACHE/cpu-kernels`, [Layers](layers.md#options)); its first training step, in seconds (workspaces, functions
and one step), at T = {T3}, B = {B3}, H = {H3}, each in a fresh process on {first['metadata']['device']}:

{table(["cell", "first call, empty cache", "first call, warm cache", "training step after, ms"], first_rows)}

{source(first)}

Each thread of a loop packs its per-frame weights once a call with MKL's packed GEMM, as oneDNN packs them
once for its fused RNN; at B = {B} rnngraph's forward still takes {times(ratio(ours, nn, "forward"))} oneDNN's, whose cell
passes run inside its GEMMs. The backward keeps each gate's gradient in one buffer, which both GEMMs, both
biases' sums and the weights' gradients read in place ([Reading a schedule](schedule.md#gradients-that-are-one-another)).
The rest of the step is mostly MKL's GEMMs. The command unsets `OPENBLAS_CORETYPE`, which this machine's environment sets to Haswell
kernels (half the SkylakeX kernels' speed for the hoisted GEMM; numpy's own products still run in OpenBLAS)."""


def word_lm(results: Results, findings: Findings) -> str:
    doc = results.bench("word_lm")
    st, runs = doc["settings"], {r["engine"]: r for r in doc["records"]}
    names = {"torch": "torch.nn.LSTM", "rnngraph_cpu": "rnngraph.torch.LSTM (compiled CPU backend)",
             "rnngraph_numpy": "rnngraph.torch.LSTM on the numpy reference engine"}
    nn = runs["torch"]
    rows = [[names[e], num(r["s_per_epoch"]), num(r["ms_per_window"]), times(r["s_per_epoch"] / nn["s_per_epoch"]),
             f"{r['first_loss']:.4f} → {r['last_loss']:.4f}"] for e, r in runs.items()]
    ours = runs["rnngraph_cpu"]
    findings.compare("A word-level model on the CPU", "the word-level model on the CPU, a window",
                     {"train_ms": ours["ms_per_window"]}, {"train_ms": nn["ms_per_window"]}, "torch.nn.LSTM")
    return f"""## A word-level model on the CPU

An ordinary word-level language model written for `torch.nn.LSTM` (the bundled text, its {st['vocab']:,} most
frequent words, an embedding, {st['layers']} LSTM layers of {st['hidden']}, a linear decoder, cross-entropy;
{st['batch']} streams, BPTT {st['bptt']}, plain SGD with gradient clipping, the states carried across windows), trained
for one epoch of {nn['windows']} windows with `torch.nn.LSTM` and with `rnngraph.torch.LSTM` swapped in, from the same
weights, in one process on the 2-core machine of the section above ({_libraries(doc['metadata']['cpu'])}).

{table(["engine", "seconds an epoch", "ms a window", "÷ torch.nn.LSTM", "loss: first → mean of the last 20"], rows)}

{source(doc)}

The losses differ only by rounding order: the same model learns the same way through either layer. The engines
train one after another, so a change in the machine's load between them moves the ratio; compare several runs
before reading much into a few percent."""


def _libraries(cpu: str) -> str:
    """The bench's CPU line without the BLAS library's file name (its hash suffix reads like a commit)."""
    return re.sub(r" \S+\.so\b", "", cpu)
