"""docs/performance.md as `rnngraph report` renders it: the page's frame (introduction, where rnngraph is slower,
how to measure, what is not measured) around the bench sections (report_bench.py) and the sections of the
evaluation experiments and the stored training runs."""
from __future__ import annotations

import re
import shlex

from .figures import NAMES, headline_table
from .report_bench import against_cudnn, half, headline, loops, norm, persistent, through_torch
from .report_models import charlm, cpu, heads, memory, word_lm
from .report_shapes import shapes
from .report_tensor import tf32, wider
from .report_data import Findings, Results, best_val, num, per_frame, record, rel, seconds, source, table

GENERATED = ("<!-- Rendered by `rnngraph report` from experiments/results; edit rnngraph/lab/report_*.py, "
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
    lines = [f"- {what} ([{section}](#{re.sub(r'[^a-z0-9 -]', '', section.lower()).replace(' ', '-')}))"
             for section, what in findings.slower]
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
        rows.append([T, *(per_frame(r) for r in got.values())])
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

`{rel(doc['path'])}`: `rnngraph experiment schedule_stats --out experiments/results`.

![Schedule statistics](../figures/schedule_stats.png)"""


def _lanes(results: Results) -> str:
    doc = results.experiment("cuda_lanes")
    series = list(dict.fromkeys((r["cell"], r["lanes"]) for r in doc["records"]))
    rows = []
    for impl in ("graph", "staged"):
        for L in sorted({r["layers"] for r in doc["records"]}):
            rows.append([impl, L, *(per_frame(record(doc, impl=impl, layers=L, cell=c, lanes=k)) for c, k in series)])
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
    cpu, demo, reference = runs["cpu_default"], runs["demo"], runs["demo_numpy"]
    compiled, numpy_ = _demo(demo), _demo(reference)        # (seconds, validation bpc)
    log = cpu["log"]
    ends = [k for k, v in enumerate(log["val_bpc"]) if v == v]
    epochs = [[f"{log['step'][k]:.0f}", f"{log['epoch'][k]:.0f}", f"{log['bpc'][k]:.3f}", f"{log['val_bpc'][k]:.3f}",
               f"{log['frames_per_s'][k]:,.0f}", f"{log['elapsed_s'][k]:.0f} s"] for k in ends]
    gpu = [[f"`{n}`", f"{best_val(r)[0]:.3f} ({best_val(r)[1]:.0f}) / {r['log']['val_bpc'][-1]:.3f}", f"{seconds(r):.0f} s",
            f"{_chars(r):,.0f}"] for n, r in runs.items() if n.startswith("gpu")]
    return f"""## Training

The default `rnngraph train` (an LSTM, 1 layer × 256, 32 streams × bptt 32, 2 epochs) on the CPU, at the epoch ends:

{table(["step", "epoch", "train bpc", "validation bpc", "frames/s (that step)", "elapsed"], epochs)}

{_run_source(results, cpu)}

![Training curves of the default run](../figures/training_cpu_default.png)

`rnngraph demo` takes {compiled[0]} s on a 2-core machine, training for 1,000 steps to a validation bpc of
{compiled[1]}: {_run_source(results, demo)} On the numpy reference engine it takes {numpy_[0]} s
({int(numpy_[0]) / int(compiled[0]):.2f}× as long) to a validation bpc of {numpy_[1]}:
{_run_source(results, reference)}

Runs on a GPU (3 layers, 64 streams × bptt 128, Adam 2e-3 with a cosine schedule); each stored run's command,
machine and date are in `{rel(results.root / "training_runs.json")}`:

{table(["run", "validation bpc: best (epoch) / last", "training time", "characters/s"], gpu)}

{chr(10).join(f"- `{n}`: {_run_source(results, r)}" for n, r in runs.items() if n.startswith("gpu"))}

The bundled corpus is small enough that more capacity overfits rather than helps: the 3 × 1024 model's best
validation bpc comes early and its last is worse.

![Training curves of the 3 × 1024 run](../figures/training_h200_3x1024.png)"""


def _demo(run: dict) -> tuple:
    """(seconds, validation bpc) from the demo's stored output."""
    out = run["path"].read_text()
    return re.search(r"rnngraph demo: done in (\d+) s", out)[1], re.search(r"validation bpc (\d\.\d{3}) after", out)[1]


def _chars(run: dict) -> float:
    """Characters a second over the whole run (streams × bptt a step)."""
    args = shlex.split(run["command"])
    streams, bptt = (int(args[args.index(o) + 1]) for o in ("--streams", "--bptt"))
    return run["log"]["step"][-1] * streams * bptt / seconds(run)


def _run_source(results: Results, run: dict) -> str:
    return f"`{rel(run['path'])}`: `{run['command']}` on {run['machine']}, {run['date']}."


_NOT_MEASURED = """## Not measured

These are not among the stored measurements:

- training on two or more GPUs, and so its speed-up over one (the ranks' logic is tested on the CPU and on one
  GPU; see [Training](training.md#several-gpus-or-processes));
- the persistent loop's cost per frame as a slope over T (`experiments/persistent_frames.py` measures it),
  and the LSTM with the persistent loop against torch.compile;
- the LSTM by hidden size (H = 128 to 2048) with the current loop strategies;
- the host time of a training step through `rnngraph.torch` against the raw layer, synced and pipelined
  (`experiments/profile_torch_step.py`);
- the compiled CPU backend at B = 64, H = 512 against torch.compile and the torch eager loop (`rnngraph bench
  --impls staged,torch_compile,torch_eager` on a machine without a GPU times them)."""

SECTIONS = [against_cudnn, persistent, half, wider, tf32, loops, norm, through_torch, charlm, heads, cpu, word_lm,
            memory, shapes, experiments, training]
