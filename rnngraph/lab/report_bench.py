"""The sections of docs/performance.md read from `rnngraph bench` files (the headline table, rnngraph against
cuDNN, torch eager, torch.compile and JAX), each table with its source and what the numbers mean."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.loading import load_cell
from ..plan.schedule import build_schedule
from ..run.backends.cuda.persistent.phases import MAX_ROWS
from ..run.backends.cuda.persistent.runner import (AUTO_SPLIT_ROWS, AUTO_TENSOR_CORE_ROWS, GROUP_FEWEST, GROUP_ROWS,
                                                   RESIDENT_ROWS, SPLIT_FROM, TENSOR_CORES_FROM)
from ..run.settings import default_store_limit
from ..run.workspace import stored_bytes
from .figures import NAMES
from .report_data import (Findings, Results, best_val, loop, num, pair, per_frame, ran, ratio, record, seconds,
                          slope, source, table, times)


@dataclass(frozen=True)
class Row:
    label: str
    file: str
    ours: dict
    peer: dict
    peer_name: str


HEADLINE = [
    Row("LSTM, B = 1", "targets", dict(cell="lstm", B=1, impl="graph"), dict(cell="lstm", B=1, impl="cudnn"), "cuDNN"),
    Row("LSTM, B = 64", "targets", dict(cell="lstm", B=64, impl="graph"), dict(cell="lstm", B=64, impl="cudnn"),
        "cuDNN"),
    Row("LSTM, B = 16, bfloat16", "tensor_cores", dict(B=16, impl="graph", loop="auto"),
        dict(B=16, impl="cudnn@float16"), "cuDNN, float16"),
    Row("LSTM, B = 64, bfloat16", "tensor_cores", dict(B=64, impl="graph", loop="auto"),
        dict(B=64, impl="cudnn@float16"), "cuDNN, float16"),
    Row("MGU (a user cell), B = 1", "targets", dict(cell="mgu", B=1, impl="graph"),
        dict(cell="mgu", B=1, impl="torch_eager"), "torch eager loop"),
    Row("LayerNorm-LSTM, B = 1", "norm", dict(impl="graph"), dict(impl="torch_compile"), "torch.compile"),
    Row("minGRU, B = 1, T = 4096", "scan_long", dict(cell="min_gru", T=4096, impl="graph"),
        dict(cell="min_gru", T=4096, impl="jax_scan"), "JAX associative scan"),
    Row("minGRU, B = 1", "loops_t100", dict(cell="min_gru", impl="graph", loop_strategy="scan"),
        dict(cell="min_gru", impl="jax_scan"), "JAX associative scan"),
    Row("sLSTM, 12 heads of 64, B = 16, T = 1024, H = 768, bfloat16", "heads_b16", dict(cell="slstm", impl="graph"),
        dict(cell="lstm", impl="cudnn@float16"), "cuDNN float16, an LSTM of one head"),
]


def headline(results: Results, findings: Findings | None = None) -> str:
    """The headline table: rnngraph against cuDNN, torch eager, torch.compile and JAX, each row with its source."""
    files = list(dict.fromkeys(row.file for row in HEADLINE))
    rows = []
    for row in HEADLINE:
        doc = results.bench(row.file)
        ours, peer = record(doc, **row.ours), record(doc, **row.peer)
        rows.append([row.label, f"{pair(ours)} ({loop(ours)})", row.peer_name, pair(peer),
                     f"{times(ratio(ours, peer, 'forward'))} / {times(ratio(ours, peer))}",
                     str(files.index(row.file) + 1)])
        if findings is not None:
            findings.compare("headline", row.label, ours, peer, row.peer_name)
    head = ["workload", "rnngraph, ms (loop)", "peer", "peer, ms", "rnngraph ÷ peer", "source"]
    notes = "\n".join(f"{k + 1}. {source(results.bench(f))}" for k, f in enumerate(files))
    return (table(head, rows) + "\n\nMilliseconds, forward / training step (forward and backward with input and "
            "weight gradients), medians; T = 100, H = 512, float32 with TF32 off and one layer unless the row "
            "says otherwise; below 1× rnngraph is faster. Sources:\n\n" + notes)



def _cudnn_spread(results: Results) -> str:
    """cuDNN's LSTM forward at B = 1 in every stored file that has it: how much the reference itself moves."""
    seen = []
    for name, impl in (("targets", "cudnn"), ("torch", "cudnn"), ("tensor_cores", "cudnn@float32")):
        r = record(results.bench(name), cell="lstm", B=1, impl=impl)
        seen.append(f"{num(r['forward_ms'])} ms in `{name}.json`")
    return ", ".join(seen)


def against_cudnn(results: Results, findings: Findings) -> str:
    doc = results.bench("targets")
    rows = []
    for cell in doc["settings"]["cells"]:
        for B in doc["settings"]["B"]:
            got = {i: record(doc, cell=cell, B=B, impl=i) for i in doc["settings"]["impls"]}
            rows.append([f"{NAMES.get(cell, cell)}, {B}", *(pair(got[i]) for i in ("naive", "staged")),
                         f"**{pair(got['graph'])}** ({loop(got['graph'])})", pair(got["cudnn"]),
                         pair(got["torch_eager"]), times(ratio(got["graph"], got["cudnn"])),
                         times(ratio(got["torch_eager"], got["graph"])), times(ratio(got["naive"], got["graph"]))])
            findings.compare("Against cuDNN and torch", f"{NAMES.get(cell, cell)} at B = {B}, graph mode",
                             got["graph"], got["cudnn"], "cuDNN")
    head = ["cell, B", "naive", "staged", "graph (loop)", "cuDNN", "torch eager loop", "graph ÷ cuDNN, training",
            "eager ÷ graph, training", "naive ÷ graph, training"]
    return f"""## Against cuDNN and torch

rnngraph's three modes against cuDNN and against the same cell written as a PyTorch loop on the GPU (`mgu` is
the built-in MGU, written as the README's cell). Each mode runs the loop strategy `auto` picks, named in
brackets.

{table(head, rows)}

{source(doc)}

cuDNN's own time moves from run to run: its LSTM forward at B = 1 is {_cudnn_spread(results)}. The eager
`staged` mode is bound by the host and is the noisiest column."""


def persistent(results: Results, findings: Findings) -> str:
    doc = results.bench("persistent_h1024")
    (B,), (H,) = doc["settings"]["B"], doc["settings"]["H"]
    p, s = (record(doc, impl="graph", loop_strategy=v) for v in ("persistent", "stages"))
    c = record(doc, impl="cudnn")
    rows = [[f"{B}, {H}", f"**{pair(p)}**", pair(s), pair(c), times(ratio(p, c, "forward")), times(ratio(p, c)),
             times(ratio(s, p))]]
    findings.compare("The persistent loop", f"LSTM at B = {B}, H = {H}, persistent", p, c, "cuDNN")
    head = ["B, H", "persistent", "stages", "cuDNN", "persistent ÷ cuDNN, forward", "training",
            "stages ÷ persistent, training"]
    return f"""## The persistent loop

The LSTM in graph mode with the loop as one persistent kernel a direction ([On a GPU](gpu.md#the-persistent-kernel)),
against the same loop run frame by frame and against cuDNN, in float32. At H = 512 and B = 1 the persistent loop is
what `auto` runs in [Against cuDNN and torch](#against-cudnn-and-torch); its batch sizes up to 256, in bfloat16
on tensor cores, are under [Half precision and tensor cores](#half-precision-and-tensor-cores).

{table(head, rows)}

{source(doc)}

The backward waits on a grid barrier each frame and then stages all 4H gate gradients from L2. In float32 a block
takes at most 8 rows (its accumulators live in registers); beyond B = 8 the batch splits into groups of rows, each
on its own blocks ([Half precision and tensor cores](#half-precision-and-tensor-cores))."""


def loops(results: Results, findings: Findings) -> str:
    rows, docs = [], [results.bench(n) for n in ("loops_t100", "scan_long")]
    for doc in docs:
        st = doc["settings"]
        for cell, T, B in ((c, T, B) for c in st["cells"] for T in st["T"] for B in st["B"]):
            got = {v: record(doc, optional=True, cell=cell, T=T, B=B, impl="graph", loop_strategy=v)
                   for v in ("stages", "elementwise", "scan") if _admits(doc, cell, v)}
            got = {v: r for v, r in got.items() if r is not None}
            jax = record(doc, cell=cell, T=T, B=B, impl="jax_scan")
            best = min(got, key=lambda v: got[v]["train_ms"])
            rows.append([NAMES.get(cell, cell), f"{T}, {B}", *(pair(got.get(v)) if v != best else f"**{pair(got[v])}**"
                                                              for v in ("stages", "elementwise", "scan")), pair(jax)])
            findings.compare("Loop strategies against JAX", f"{NAMES.get(cell, cell)} at T = {T}, B = {B}, "
                             f"graph mode (`{best}`)", got[best], jax, "JAX")
    long = docs[1]
    T_long, r_long = max(long["settings"]["T"]), {}
    for impl in ("graph", "jax_scan"):
        r_long[impl] = record(long, cell="min_gru", T=T_long, B=1, impl=impl)

    def each(T: int) -> str:        # every cell's training step ÷ JAX's at T
        return ", ".join(f"{times(ratio(*(record(long, cell=c, T=T, B=1, impl=i) for i in ('graph', 'jax_scan'))))} "
                         f"({NAMES.get(c, c)})" for c in long["settings"]["cells"])
    gb = stored_bytes(build_schedule(load_cell("min_gru", r_long["graph"]["D"], r_long["graph"]["H"])), T_long, 1,
                      "float32") / 1e9
    limit = default_store_limit(int(long["metadata"]["gpu_memory_gib"] * 2 ** 30)) / 1e9
    kept = "within" if gb <= limit else "beyond"
    fwd, train = (r_long["graph"][k] / r_long["jax_scan"][k] for k in ("forward_ms", "train_ms"))
    scan = results.experiment("scan")
    Ts = sorted({r["T"] for r in scan["records"]})
    frames = [[T, *(per_frame(record(scan, T=T, impl="graph", loop=v)) for v in ("stages", "elementwise", "scan")),
                  per_frame(record(scan, T=T, impl="jax_scan"))] for T in Ts]
    return f"""## Loop strategies against JAX

Cells with a linear-diagonal or elementwise state in graph mode, each loop strategy they admit, against JAX's
`lax.associative_scan` under `jit` (JAX has the linear-diagonal cells only); the fastest training step of
rnngraph's in bold. At T = 4096 and {T_long:,} graph mode runs the scan with its default chunks (whole calls for the
scan). At T = {T_long:,} minGRU's call stores {gb:.1f} GB, {kept} the default `RNNGRAPH_STORE_BYTES` on this GPU
({limit:.1f} GB, a sixteenth of its memory), so its backward {"reads the stored values" if kept == "within" else
"recomputes its chunks' forward"} ([Layers](layers.md)).

{table(["cell", "T, B", "stages", "elementwise", "scan", "JAX"], rows)}

{chr(10).join(source(d) for d in docs)}

At T = 100 a training step is bound by host work, not by the GPU: issuing one graph-mode step takes Python and
CuPy calls around four graph replays (the input in; the states, the gradients and PyTorch-layout gradients out)
while the GPU waits, where JAX dispatches one compiled program. The same floor caps the elementwise loop's gain
over `stages` at T = 100. At T = {T_long:,} minGRU's scan takes {times(fwd)} JAX's time forward and
{times(train)} a training step; the training step of each cell takes {each(T_long)} JAX's at T = {T_long:,}, and
{each(min(long["settings"]["T"]))} at T = {min(long["settings"]["T"]):,}. At the longest T both spend most of a step
in the same cuBLAS float32 GEMMs (the gates' input products, the input gradients and the weight gradients over all
frames); what differs is the elementwise and scan work around them, which `experiments/kernel_profile.py`
times kernel by kernel under Nsight Compute.

The cost per frame (µs, forward / training step) of minGRU against T, from the `scan` experiment:

{table(["T", "stages", "elementwise", "scan", "JAX"], frames)}

{source(scan)}

![Cost per frame of each loop strategy against sequence length](../figures/scan.png)

`stages` stays flat per frame, the elementwise loop falls as one thread walks every frame (its backward kernel
is bound by latency), and the scan falls furthest. The T = 100 row, the experiment's first configuration in a
fresh process, is slower than the bench's numbers above for every implementation."""


def _admits(doc: dict, cell: str, strategy: str) -> bool:
    return any(r["cell"] == cell and loop(r) == strategy and "skipped" not in r for r in doc["records"]) \
        or strategy == "stages"


PRECISIONS = (("bfloat16", "graph", "cudnn@bfloat16"), ("float16", "graph@float16", "cudnn@float16"),
              ("float32", "graph@float32", "cudnn@float32"))


def half(results: Results, findings: Findings) -> str:
    doc = results.bench("tensor_cores")
    rows, faster = [], []           # faster: the B where rnngraph's bfloat16 trains faster than cuDNN float16
    c16 = lambda B: record(doc, B=B, impl="cudnn@float16")
    for B in doc["settings"]["B"]:
        row = [B]
        for dtype, ours, peer in PRECISIONS:
            auto, c = record(doc, B=B, impl=ours, loop="auto"), record(doc, B=B, impl=peer)
            row += [f"**{pair(auto)}** ({ran(auto)})", pair(c)]
            findings.compare("Half precision and tensor cores", f"{dtype} LSTM at B = {B} (`auto`: {ran(auto)})",
                             auto, c, f"cuDNN {dtype}")
        auto = record(doc, B=B, impl="graph", loop="auto")
        row += [times(ratio(auto, c16(B))), pair(record(doc, B=B, impl="graph", loop="persistent"))]
        findings.compare("Half precision and tensor cores", f"bfloat16 LSTM at B = {B} (`auto`: {ran(auto)})",
                         auto, c16(B), "cuDNN float16")
        if (ratio(auto, c16(B)) or 1) < 1:
            faster.append(str(B))
        rows.append(row)
    runs = results.training()
    b16, f32 = runs["gpu_bfloat16"], runs["gpu_float32"]
    b64 = results.bench("slope_b64")
    frame = [[name, *map(num, slope(b64, impl, cell="lstm"))]
             for name, impl in (("rnngraph bfloat16 (`auto`)", "graph"), ("cuDNN float16", "cudnn@float16"))]
    head = ["B"] + [h for d, _, _ in PRECISIONS for h in (f"rnngraph {d}, `auto` (loop)", f"cuDNN {d}")] + \
        ["bfloat16 ÷ cuDNN float16, training", "bfloat16 `persistent`"]
    return f"""## Half precision and tensor cores

The LSTM in graph mode as `auto` runs it, in bfloat16, float16 and float32 (TF32 off), against cuDNN in
each precision, all in one process, T = 100, H = 512; the last columns set rnngraph's bfloat16 against
cuDNN's float16 (its fastest LSTM) and show bfloat16 with `loop="persistent"` at every B.

{table(head, rows)}

{source(doc)}

In half precision `auto` runs the persistent loop up to {auto_rows()}: up to B = {TENSOR_CORES_FROM - 1} on CUDA
cores, from B = {TENSOR_CORES_FROM} on tensor cores (`mma.sync` with float32 sums, the rows past B masked, the
weights held in registers where they fit, else in shared memory), from B = {2 * GROUP_FEWEST} in groups of
{GROUP_FEWEST} to {GROUP_ROWS} rows (up to {RESIDENT_ROWS} where that holds the weights in registers), each group on its
own blocks, so that a small batch runs on more SMs
([On a GPU](gpu.md#the-persistent-kernel)). Beyond those it runs `stages`, a `GemmEx` and a fused kernel a frame,
where the persistent kernel measured no faster (the wider LSTMs are in [the next section](#wider-lstms-gru-and-mgu)).
In float32 with TF32 off it runs the persistent loop on CUDA cores below {auto_rows(SPLIT_FROM)}, beyond B =
{MAX_ROWS} in groups of {MAX_ROWS} rows, and from there on tensor cores in 3xTF32 ([float32 in
TF32](#float32-in-tf32)), up to {auto_rows(AUTO_SPLIT_ROWS)}. With TF32 allowed, float32 runs on tensor cores as
half precision does. The persistent backward stages all 4H gate gradients of its group's rows each frame, four times
the values its forward stages.

At B = 64 a frame costs, as the slope from T = 100 to 1000 (the same LSTM, one process):

{table(["", "forward µs a frame", "training step µs a frame"], frame)}

{source(b64)}

In this run rnngraph's bfloat16 training step is faster than cuDNN float16's at B = {", ".join(faster) or "none"}. cuDNN's
float16 LSTM is a persistent kernel on tensor cores. Its small-batch times move between processes, so compare within one
run: at B = 8 they ranged from 0.92 to 1.42 ms over runs of the same day.

The 3 × 512 char-LM of [Training](#training) reaches in bfloat16 a best validation bpc of {best_val(b16)[0]:.3f} in
{seconds(b16):.0f} s, against {best_val(f32)[0]:.3f} in {seconds(f32):.0f} s in float32: {seconds(f32) / seconds(b16):.2f}×
faster, within run-to-run noise of the same bpc. Its first step takes {_first_step(b16):.0f} s (compiling the half
kernels and recording the graphs).

![Training curves in bfloat16 and float32](../figures/training_h200_bf16.png)"""


def auto_rows(table: tuple = AUTO_TENSOR_CORE_ROWS) -> str:
    """'B = 128 at H ≤ 512, ...': a measured table of rows by width (runner.by_width), by default where 'auto' runs
    the tensor-core kernel (runner.AUTO_TENSOR_CORE_ROWS)."""
    return ", ".join(f"B = {rows} at H ≤ {width}" for width, rows in table) + f" (wider cells as H = {table[-1][0]})"


def _first_step(run: dict) -> float:
    return float(run["log"]["elapsed_s"][0])


def norm(results: Results, findings: Findings) -> str:
    doc = results.bench("norm")
    got = {i: record(doc, impl=i) for i in doc["settings"]["impls"]}
    label = {"graph": f"rnngraph graph mode ({loop(got['graph'])})", "torch_eager": "torch eager loop with `F.layer_norm`",
             "torch_compile": "torch.compile (reduce-overhead) of that loop"}
    rows = [[label[i], num(r["forward_ms"]), num(r["train_ms"]), times(ratio(r, got["graph"])),
             _first(r)] for i, r in got.items()]
    for i in ("torch_eager", "torch_compile"):
        findings.compare("LayerNorm cells", "LayerNorm-LSTM at B = 1", got["graph"], got[i], label[i])
    return f"""## LayerNorm cells

The built-in `layernorm_lstm` (a LayerNorm on each gate product and on c) at B = 1.

{table(["", "forward", "training step", "÷ rnngraph, training", "first call or compile, s"], rows)}

{source(doc)}

Each normalisation runs inside a row group: one kernel, one block per row. The LayerNorm cells cannot run the
persistent loop (a row reduction needs every feature, and the persistent kernel splits features over blocks),
and at B = 1 a row group is one block doing the whole row's work."""


def _first(r: dict) -> str:
    """Seconds of rnngraph's first call (kernels built, graphs recorded) or of torch.compile's compiling."""
    first = r.get("first_s", r.get("compile_s"))
    return "–" if first is None else f"{first:.2f}"


def through_torch(results: Results, findings: Findings) -> str:
    doc = results.bench("torch")
    rows = []
    for cell in doc["settings"]["cells"]:
        got = {i: record(doc, cell=cell, impl=i) for i in doc["settings"]["impls"]}
        extra = got["rnngraph_torch"]["train_ms"] - got["graph"]["train_ms"]
        rows.append([NAMES.get(cell, cell), f"{pair(got['graph'])} ({loop(got['graph'])})", pair(got["rnngraph_torch"]),
                     pair(got["cudnn"]), pair(got["torch_eager"]), f"{1e3 * extra:.0f} µs",
                     times(ratio(got["rnngraph_torch"], got["cudnn"]) if got["cudnn"] else None)])
        if got["cudnn"]:
            findings.compare("Through PyTorch", f"{NAMES.get(cell, cell)} through `rnngraph.torch`",
                             got["rnngraph_torch"], got["cudnn"], "cuDNN")
    return f"""## Through PyTorch

The same layer called directly and as an `rnngraph.torch` module, its training step through `loss.backward()`,
at B = 1.

{table(["cell", "graph mode (loop)", "`rnngraph.torch`", "cuDNN", "torch eager loop",
        "module's extra host time a training step", "module ÷ cuDNN, training"], rows)}

{source(doc)}

The module's extra time is host work (torch's autograd machinery and the conversions of inputs, outputs and
gradients), counted in full because `bench` synchronises after every call; a training loop that does not
synchronise each step hides most of it behind the previous step's GPU work."""
