"""The sections of docs/performance.md: each stored measurement's table, its source (file, command, machine,
date) and what the numbers mean, in the present tense; lab/report.py renders and checks the page."""
from __future__ import annotations

import re
import shlex

from .figures import NAMES, headline_table
from .report import Findings, Results, headline, loop, num, pair, ratio, record, source, table, times

GENERATED = ("<!-- Rendered by `rnngraph report` from experiments/results; edit rnngraph/lab/report_page.py, "
             "not this file. -->")
IMPL_NAMES = {"naive": "naive", "staged": "staged", "graph": "graph", "cudnn": "cuDNN"}
INTRO = """# Performance

Every number on this page comes from a file in `experiments/results/`, named under its table with the
command that made it, the machine and the date; `rnngraph report` renders the page from those files
(nothing is measured), and a test checks that the page and the files agree. Times are medians in
milliseconds of a forward pass and of a training step (forward and backward with input and weight
gradients), taken with CUDA events after warm-up calls, float32 with TF32 off, one layer, T = 100 frames
and H = D = 512 unless a table says otherwise. A ratio below 1× means rnngraph is faster."""


def render_page(results: Results) -> str:
    findings = Findings()
    top = headline(results, findings)
    sections = [s(results, findings) for s in SECTIONS]
    return "\n\n".join([GENERATED, INTRO, "## Headline\n\n" + top, _slower(findings), _HOW, *sections,
                        _NOT_MEASURED]) + "\n"


def _slower(findings: Findings) -> str:
    lines = [f"- {what} ([{section}](#{section.lower().replace(' ', '-')}))" for section, what in findings.slower]
    return ("## Where rnngraph is slower\n\nIn the stored measurements rnngraph is slower than its peer here:\n\n"
            + "\n".join(dict.fromkeys(lines)))


_HOW = """## How to measure

```bash
rnngraph bench --cell lstm,mgu -T 100 -B 1,64 --impls graph,cudnn,torch_eager --json bench.json
rnngraph experiment single_stream_speedup --out experiments/results
rnngraph figures
rnngraph report --check
```

`rnngraph bench` times each (cell, T, B, H) and implementation in one process and prints a table of
medians with each time over cuDNN's and over the torch eager loop's; `--json FILE` also writes every
measurement with the machine, the exact command and the date. `--impls` takes `naive`, `staged` and
`graph` (rnngraph's modes), `cudnn` (torch's `nn.LSTM`/`GRU`/`RNN`), `torch_eager` (the same cell
written step by step in PyTorch), `torch_compile` (that loop through `torch.compile`, mode
"reduce-overhead" on CUDA, its compile time reported as `first s` and left out of the timings),
`rnngraph_torch` (the `rnngraph.torch` module through autograd) and `jax_scan` (JAX's
`lax.associative_scan`, for the linear-diagonal cells); `impl@dtype` runs one in another precision, e.g.
`cudnn@float16`. `--loop` times several loop strategies. rnngraph's own first call (kernels built,
graphs recorded) is the `first s` column. `rnngraph experiment NAME` runs one of the evaluation
experiments (`experiments/README.md` lists them) and writes its JSON results; `rnngraph figures`
redraws every figure and `rnngraph report` this page from the stored files. `bench` times each call
from an idle GPU to its end, so host time spent before the first kernel counts in full."""


def _cudnn_spread(results: Results) -> str:
    """cuDNN's LSTM forward at B = 1 in every stored file that has it: how much the reference itself moves."""
    seen = []
    for name in ("targets", "torch", "half"):
        doc = results.bench(name)
        impl = "cudnn@float32" if name == "half" else "cudnn"
        r = record(doc, cell="lstm", B=1, impl=impl)
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
the built-in MGU, written as the README's cell). In this file graph mode runs every loop as `stages`: the
persistent loop's numbers are under [The persistent loop](#the-persistent-loop).

{table(head, rows)}

{source(doc)}

cuDNN's own time moves from run to run: its LSTM forward at B = 1 is {_cudnn_spread(results)}. The eager
`staged` mode is bound by the host and is the noisiest column."""


def hidden_size(results: Results, findings: Findings) -> str:
    doc, base = results.bench("sweep"), results.bench("targets")
    rows = []
    for H in sorted({*doc["settings"]["H"], 512}):
        d = doc if H in doc["settings"]["H"] else base
        g, c = record(d, cell="lstm", B=1, H=H, impl="graph"), record(d, cell="lstm", B=1, H=H, impl="cudnn")
        rows.append([H, pair(g), pair(c), f"{times(ratio(g, c, 'forward'))} / {times(ratio(g, c))}"])
        findings.compare("Hidden size", f"LSTM at H = {H}, B = 1, graph mode (`stages`)", g, c, "cuDNN")
    return f"""## Hidden size

The LSTM at B = 1 in graph mode (`stages`) against cuDNN, by hidden size.

{table(["H", "graph", "cuDNN", "graph ÷ cuDNN"], rows)}

{source(doc)} The H = 512 row is from `targets.json` (above).

At H = 128 cuDNN's forward is faster: at that size it appears to run a persistent kernel, one launch for all
frames, against one launch a frame here. At H = 2048 W_hh (64 MB in float32) no longer fits the H200's 60 MB
L2 cache, so each frame reads it from DRAM, for rnngraph as for cuDNN."""


def persistent(results: Results, findings: Findings) -> str:
    rows, docs = [], [results.bench(n) for n in ("persistent_b8", "persistent_h1024")]
    for doc in docs:
        (B,), (H,) = doc["settings"]["B"], doc["settings"]["H"]
        p, s = (record(doc, impl="graph", loop_strategy=v) for v in ("persistent", "stages"))
        c = record(doc, impl="cudnn")
        rows.append([f"{B}, {H}", f"**{pair(p)}**", pair(s), pair(c), times(ratio(p, c, "forward")), times(ratio(p, c)),
                     times(ratio(s, p))])
        findings.compare("The persistent loop", f"LSTM at B = {B}, H = {H}, persistent", p, c, "cuDNN")
    head = ["B, H", "persistent", "stages", "cuDNN", "persistent ÷ cuDNN, forward", "training",
            "stages ÷ persistent, training"]
    return f"""## The persistent loop

The LSTM in graph mode with the loop as one persistent kernel a direction ([On a GPU](gpu.md#the-persistent-kernel)),
against the same loop run frame by frame and against cuDNN, in float32.

{table(head, rows)}

{chr(10).join(source(d) for d in docs)}

The backward waits on a grid barrier each frame and then stages all 4H gate gradients from L2. At B = 8 the
kernel keeps a grid barrier before each GEMM (eight tagged words a thread are slower than the barrier) and runs
its GEMVs on CUDA cores; the kernel takes at most B = 8, since its accumulators live in registers. The LSTM at
B = 1, H = 512 in float32 is not among the stored files; in bfloat16 it heads [Half precision](#half-precision)."""


def loops(results: Results, findings: Findings) -> str:
    rows, docs = [], [results.bench(n) for n in ("loops_t100", "loops_t4096")]
    for doc in docs:
        for cell in doc["settings"]["cells"]:
            for B in doc["settings"]["B"]:
                (T,) = doc["settings"]["T"]
                got = {v: record(doc, cell=cell, B=B, impl="graph", loop_strategy=v)
                       for v in ("stages", "elementwise", "scan") if _admits(doc, cell, v)}
                jax = record(doc, cell=cell, B=B, impl="jax_scan")
                best = min(got, key=lambda v: got[v]["train_ms"])
                rows.append([NAMES.get(cell, cell), f"{T}, {B}",
                             *(pair(got.get(v)) if v != best else f"**{pair(got[v])}**"
                               for v in ("stages", "elementwise", "scan")), pair(jax)])
                findings.compare("Loop strategies against JAX", f"{NAMES.get(cell, cell)} at T = {T}, B = {B}, "
                                 f"graph mode (`{best}`)", got[best], jax, "JAX")
    scan = results.experiment("scan")
    Ts = sorted({r["T"] for r in scan["records"]})
    per_frame = [[T, *(_us(record(scan, T=T, impl="graph", loop=v)) for v in ("stages", "elementwise", "scan")),
                  _us(record(scan, T=T, impl="jax_scan"))] for T in Ts]
    return f"""## Loop strategies against JAX

Cells with a linear-diagonal or elementwise state in graph mode, each loop strategy they admit, against JAX's
`lax.associative_scan` under `jit` (JAX has the linear-diagonal cells only); the fastest training step of
rnngraph's in bold.

{table(["cell", "T, B", "stages", "elementwise", "scan", "JAX"], rows)}

{chr(10).join(source(d) for d in docs)}

At T = 100 a training step is bound by host work, not by the GPU: issuing one graph-mode step takes Python and
CuPy calls around four graph replays (the input in; the states, the gradients and PyTorch-layout gradients out)
while the GPU waits, where JAX dispatches one compiled program. The same floor caps the elementwise loop's gain
over `stages` at T = 100. At B = 64 both are bound by the hoisted GEMMs, and rnngraph adds full-size copies (the
input gradient, the output gradient).

The cost per frame (µs, forward / training step) of minGRU against T, from the `scan` experiment:

{table(["T", "stages", "elementwise", "scan", "JAX"], per_frame)}

{source(scan)}

![Cost per frame of each loop strategy against sequence length](../figures/scan.png)

`stages` stays flat per frame, the elementwise loop falls as one thread walks every frame (its backward kernel
is bound by latency), and the scan falls furthest."""


def _admits(doc: dict, cell: str, strategy: str) -> bool:
    return any(r["cell"] == cell and loop(r) == strategy and "skipped" not in r for r in doc["records"]) \
        or strategy == "stages"


def _us(r: dict | None) -> str:
    return "–" if r is None else f"{num(1e3 * r['forward_ms'] / r['T'])} / {num(1e3 * r['train_ms'] / r['T'])}"


def half(results: Results, findings: Findings) -> str:
    rows, docs = [], [results.bench(n) for n in ("half", "half_h2048")]
    for doc in docs:
        for B in doc["settings"]["B"]:
            for H in doc["settings"]["H"]:
                g = record(doc, B=B, H=H, impl="graph")
                c32, c16 = (record(doc, B=B, H=H, impl=f"cudnn@{d}") for d in ("float32", "float16"))
                rows.append([f"{B}, {H}", pair(g), loop(g), pair(c32), pair(c16), times(ratio(g, c32)), times(ratio(g, c16))])
                findings.compare("Half precision", f"bfloat16 LSTM at B = {B}, H = {H} (`{loop(g)}`)", g, c16,
                                 "cuDNN float16")
    runs = results.training()
    b16, f32 = runs["gpu_bfloat16"], runs["gpu_float32"]
    return f"""## Half precision

The LSTM in bfloat16, graph mode, against cuDNN in float32 and in float16 in the same process.

{table(["B, H", "rnngraph bfloat16", "loop", "cuDNN float32", "cuDNN float16", "÷ cuDNN float32, training",
        "÷ cuDNN float16, training"], rows)}

{chr(10).join(source(d) for d in docs)}

cuDNN's float16 LSTM is a persistent kernel on tensor cores; rnngraph's persistent kernel runs its GEMVs on
CUDA cores and keeps a grid barrier per GEMM at B = 8, and at B = 64 each frame is a `GemmEx` and a fused kernel.
At B = 1 the loop is bound by latency, not bandwidth, so half precision saves little there.

The 3 × 512 char-LM of [Training](#training) trains in bfloat16 to a validation bpc of {_best(b16)[0]:.3f} in
{_seconds(b16):.0f} s, against {_best(f32)[0]:.3f} in {_seconds(f32):.0f} s in float32: {_seconds(f32) / _seconds(b16):.2f}×
faster, within run-to-run noise of the same bpc. Its first step takes longer (compiling the half kernels).

![Training curves in bfloat16 and float32](../figures/training_h200_bf16.png)"""


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


def experiments(results: Results, findings: Findings) -> str:
    single = results.experiment("single_stream_speedup")
    for r in single["records"]:
        if r["impl"] == "graph":
            findings.compare("Evaluation experiments", f"{NAMES.get(r['cell'], r['cell'])} at H = {r['H']}, B = 1, "
                             "graph mode (`stages`)", r, record(single, cell=r["cell"], H=r["H"], impl="cudnn"), "cuDNN")
    return f"""## Evaluation experiments

### Speed-up at one stream

Graph mode against naive and against cuDNN at B = 1 (ratios above 1 mean graph mode is faster).

{headline_table(single).split(chr(10) + chr(10))[0]}

{source(single)}

![Speed-up over naive at one stream](../figures/single_stream_speedup.png)

### Throughput against streams

{_throughput(results, findings)}

### Sequence length

{_sequence(results, findings)}

### Stage breakdown

{_breakdown(results)}

### Schedule statistics

{_stats(results)}

### CUDA-stream lanes

{_lanes(results)}"""


def _throughput(results: Results, findings: Findings) -> str:
    doc = results.experiment("multi_stream_throughput")
    impls = list(dict.fromkeys(r["impl"] for r in doc["records"]))
    rows = []
    for B in sorted({r["B"] for r in doc["records"]}):
        got = {i: record(doc, B=B, impl=i) for i in impls}
        rows.append([B, *("–" if r is None else f"{1e3 * B * r['T'] / r['train_ms']:,.0f}" for r in got.values())])
        findings.compare("Evaluation experiments", f"LSTM training at B = {B}, graph mode (`stages`)", got["graph"],
                         got["cudnn"], "cuDNN")
    return f"""Training frames per second of the LSTM (H = 512, T = 100) against the number of parallel streams B.

{table(["B", *(IMPL_NAMES[i] for i in impls)], rows)}

{source(doc)}

![Training throughput against parallel streams](../figures/multi_stream_throughput.png)"""


def _sequence(results: Results, findings: Findings) -> str:
    doc = results.experiment("sequence_length")
    impls = list(dict.fromkeys(r["impl"] for r in doc["records"]))
    rows = []
    for T in sorted({r["T"] for r in doc["records"]}):
        got = {i: record(doc, optional=True, T=T, impl=i) for i in impls}
        rows.append([T, *(_us(r) for r in got.values())])
        findings.compare("Evaluation experiments", f"LSTM at T = {T}, B = 1, graph mode (`stages`)", got["graph"],
                         got["cudnn"], "cuDNN")
    return f"""The LSTM's cost per frame (µs, forward / training step) at B = 1 against T: flat means a constant cost per
frame, and once-per-sequence work shows at small T.

{table(["T", *(IMPL_NAMES[i] for i in impls)], rows)}

{source(doc)}

![Cost per frame against sequence length](../figures/sequence_length.png)"""


def _breakdown(results: Results) -> str:
    doc = results.experiment("stage_breakdown")
    parts = ("hoisted", "per_frame_gemm", "fused_elementwise", "launch_overhead")
    rows = [[f"{NAMES.get(r['cell'], r['cell'])}, {r['H']}", num(r["total_us_per_frame"]), num(r["replay_us_per_frame"]),
             *(num(r["parts_us_per_frame"][p]) for p in parts)] for r in doc["records"]]
    return f"""A frame's forward time (µs) in eager `staged` mode and in graph replay, and its parts, each part measured as
the full run minus a run without it (at B = 1, T = 100); a negative part is noise (the run without it measured
slower).

{table(["cell, H", "staged", "graph replay", "hoisted", "per-frame GEMM", "fused elementwise", "launch and host"], rows)}

{source(doc)}

![Stage breakdown](../figures/stage_breakdown.png)"""


def _stats(results: Results) -> str:
    doc = results.experiment("schedule_stats")
    rows = [[NAMES.get(r["cell"], r["cell"]), r["stages_per_frame"],
             "{before_merge} → {after_merge}".format(**r["kernels_per_frame"]["forward"]),
             "{before_merge} → {after_merge}".format(**r["kernels_per_frame"]["backward"]),
             f"{100 * r['hoisted_flop_fraction']['forward']:.0f}% / {100 * r['hoisted_flop_fraction']['training']:.0f}%"]
            for r in doc["records"]]
    r0 = doc["records"][0]
    return f"""What the planner makes of each built-in cell (D = {r0['D']}, H = {r0['H']}): stages per frame, kernels per frame
before and after merging, and the share of FLOPs hoisted out of the loop. This is analysis, not timing: the same
on every machine.

{table(["cell", "stages", "forward kernels a frame", "backward kernels a frame", "FLOPs hoisted, forward / training"], rows)}

`{results.relative(doc['path'])}`: `rnngraph experiment schedule_stats --out experiments/results`.

![Schedule statistics](../figures/schedule_stats.png)"""


def _lanes(results: Results) -> str:
    doc = results.experiment("cuda_lanes")
    series = list(dict.fromkeys((r["cell"], r["lanes"]) for r in doc["records"]))
    rows = []
    for impl in ("graph", "staged"):
        for L in sorted({r["layers"] for r in doc["records"]}):
            rows.append([impl, L, *(_us(record(doc, impl=impl, layers=L, cell=c, lanes=k)) for c, k in series)])
    head = ["mode", "layers", *(f"{'stacked LSTM' if c == 'lstm' else 'wavefront'}, {k} lane{'s' * (k > 1)}"
                                for c, k in series)]
    return f"""Several LSTM layers at B = 1, H = 512: stacked (each layer's loop after the one below) on one stream, against the
wavefront cell (layer l+1 reads layer l one frame back, so every layer's GEMM shares a stage) on 1, 2 and 4
CUDA-stream lanes; µs per frame, forward / training step.

{table(head, rows)}

{source(doc)}

Lanes pay in graph mode, where the wavefront's independent GEMMs overlap; in eager `staged` mode the events
cost more than the overlap wins, which is why lanes are off by default.

![CUDA-stream lanes](../figures/cuda_lanes.png)"""


def training(results: Results, findings: Findings) -> str:
    runs = results.training()
    cpu, demo = runs["cpu_default"], runs["demo"]
    log = cpu["log"]
    ends = [k for k, v in enumerate(log["val_bpc"]) if v == v]
    epochs = [[f"{log['step'][k]:.0f}", f"{log['epoch'][k]:.0f}", f"{log['bpc'][k]:.3f}", f"{log['val_bpc'][k]:.3f}",
               f"{log['frames_per_s'][k]:,.0f}", f"{log['elapsed_s'][k]:.0f} s"] for k in ends]
    gpu = [[f"`{n}`", f"{_best(r)[0]:.3f} ({_best(r)[1]:.0f}) / {r['log']['val_bpc'][-1]:.3f}", f"{_seconds(r):.0f} s",
            f"{_chars(r):,.0f}"] for n, r in runs.items() if n.startswith("gpu")]
    return f"""## Training

The default `rnngraph train` (an LSTM, 1 layer × 256, 32 streams × bptt 32, 2 epochs) on the CPU, at the epoch ends:

{table(["step", "epoch", "train bpc", "validation bpc", "frames/s (that step)", "elapsed"], epochs)}

{_run_source(results, cpu)}

![Training curves of the default run](../figures/training_cpu_default.png)

`rnngraph demo` takes {_demo(demo)[0]} s on the same machine, training for 1,000 steps to a validation bpc of
{_demo(demo)[1]}: {_run_source(results, demo)}

Runs on a GPU (3 layers, 64 streams × bptt 128, Adam 2e-3 with a cosine schedule); each stored run's command,
machine and date are in `{results.relative(results.root / "training_runs.json")}`:

{table(["run", "validation bpc: best (epoch) / last", "training time", "characters/s"], gpu)}

{chr(10).join(f"- `{n}`: {_run_source(results, r)}" for n, r in runs.items() if n.startswith("gpu"))}

The bundled corpus is small enough that more capacity overfits rather than helps: the 3 × 1024 model's best
validation bpc comes early and its last is worse.

![Training curves of the 3 × 1024 run](../figures/training_h200_3x1024.png)"""


def _demo(run: dict) -> tuple:
    """(seconds, validation bpc) from the demo's stored output."""
    out = run["path"].read_text()
    return re.search(r"rnngraph demo: done in (\d+) s", out)[1], re.search(r"validation bpc (\d\.\d{3}) after", out)[1]


def _best(run: dict) -> tuple:
    log = run["log"]
    k = min((k for k, v in enumerate(log["val_bpc"]) if v == v), key=lambda k: log["val_bpc"][k])
    return log["val_bpc"][k], log["epoch"][k]


def _seconds(run: dict) -> float:
    return float(run["log"]["elapsed_s"][-1])


def _chars(run: dict) -> float:
    """Characters a second over the whole run (streams × bptt a step)."""
    args = shlex.split(run["command"])
    streams, bptt = (int(args[args.index(o) + 1]) for o in ("--streams", "--bptt"))
    return run["log"]["step"][-1] * streams * bptt / _seconds(run)


def _run_source(results: Results, run: dict) -> str:
    return f"`{results.relative(run['path'])}`: `{run['command']}` on {run['machine']}, {run['date']}."


_NOT_MEASURED = """## Not measured

These are not among the stored measurements:

- training on two or more GPUs, and so its speed-up over one (the ranks' logic is tested on the CPU and on one
  GPU; see [Training](training.md#several-gpus-or-processes));
- the persistent loop's cost per frame as a slope over T (`experiments/persistent_frames.py` measures it),
  and the float32 LSTM at B = 1, H = 512 with the persistent loop against cuDNN and torch.compile;
- graph mode fed calls of many random shapes: recordings, memory and time per call as the calls go
  (`experiments/graph_shapes_probe.py`), and the cost of chunks of time at a fixed long T;
- the host time of a training step through `rnngraph.torch` against the raw layer, synced and pipelined
  (`experiments/profile_torch_step.py`)."""

SECTIONS = [against_cudnn, hidden_size, persistent, loops, half, norm, through_torch, experiments, training]
