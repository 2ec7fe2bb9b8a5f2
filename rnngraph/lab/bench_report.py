"""What `rnngraph bench` prints: the header saying where it ran, and the table of medians with each
implementation's time over cuDNN's and over the torch eager loop's."""
from __future__ import annotations


def header(info: dict) -> str:
    """The lines above the table: version, date, commit, device, CUDA and library versions, TF32."""
    cuda = (f"CUDA runtime {info.get('cuda_runtime') or '-'}, driver {info.get('cuda_driver') or '-'}"
            + (f", cuDNN {info['cudnn']}" if info.get("cudnn") else ""))
    libs = "  ".join(f"{k} {info.get(k) or '-'}" for k in ("python", "numpy", "networkx", "cupy", "torch"))
    tf32 = "on" if info["tf32"] else "off"
    tt = " ".join(f"{k}={v}" for k, v in info.get("torch_allow_tf32", {}).items()) or "-"
    lines = [f"rnngraph {info['rnngraph']} bench  {info['date']}  commit {info.get('commit') or 'unknown'}",
             f"device: {info['device']}" + (f" ({info['gpu_memory_gib']} GiB)" if info.get("gpu_memory_gib") else ""),
             f"{cuda}", libs, f"TF32 {tf32} (torch allow_tf32: {tt}; CUPY_TF32={info['cupy_tf32']}; "
             "rnngraph's own cuBLAS sgemm calls: default math mode, no TF32)"]
    if info.get("cpu"):
        lines.append(f"CPU: {info['cpu']}")
    if info.get("gpu_problem"):
        lines.append(f"no GPU for rnngraph: {info['gpu_problem']}; naive and staged run on the CPU")
    return "\n".join(lines)


def format_table(results: list) -> str:
    """Per configuration, each implementation's forward and training-step median ms, its first call's
    seconds (rnngraph: kernels built, graphs recorded; torch.compile: compiling) and its time over
    cuDNN's (on the CPU: torch.nn's, torch_cpu) and over the torch eager loop's (< 1: faster); speed-ups over
    naive; what failed or was skipped."""
    lib = "cudnn" if any(r["impl"] == "cudnn" and "forward_ms" in r for r in results) or \
        not any(r["impl"] == "torch_cpu" and "forward_ms" in r for r in results) else "torch_cpu"   # torch's library
    head = ("cell", "T", "B", "H", "impl", "backend", "fwd ms", "train ms", "first s", f"fwd/{lib}", f"train/{lib}",
            "fwd/eager", "train/eager")
    rows, notes, skipped, groups = [], [], {}, {}
    for r in results:
        groups.setdefault((r["cell"], r["T"], r["B"], r["H"], r["D"], r["layers"], r["dtype"]), []).append(r)
    for (cell, T, B, H, *_), rs in groups.items():
        ran = {_label(r): r for r in rs if "forward_ms" in r}
        for r in rs:
            if "skipped" in r or "error" in r:
                why = r.get("skipped") or f"failed: {r['error']}"
                skipped.setdefault((r["impl"], why), {})[cell] = None
                continue
            first = r.get("first_s", r.get("compile_s"))
            cols = [r["backend"], _ms(r["forward_ms"]), _ms(r["train_ms"]), "-" if first is None else f"{first:.2f}"]
            cols += [_ratio(r, ran.get(ref), w) if ref != r["impl"] else ""
                     for ref in (lib, "torch_eager") for w in ("forward", "train")]
            rows.append([cell, str(T), str(B), str(H), _label(r), *cols])
            if r.get("eager_loop") == "graph interpreter":
                notes.append(f"{cell}: the torch eager loop interprets the cell graph (no hand-written step)")
        for mode in (k for k in ran if k.split(":")[0] in ("staged", "graph")):
            if "naive" in ran:
                speed = ", ".join(f"{w} {_ratio(ran['naive'], ran[mode], w)}" for w in ("forward", "train"))
                notes.append(f"{cell} B={B} H={H}: speed-up of {mode} over naive: {speed}")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(x).rjust(w) if k > 4 else str(x).ljust(w) for k, (x, w) in enumerate(zip(row, widths)))
             for row in [head, *rows]]
    lines += notes + ["ratios: this implementation's time / the reference's (< 1 is faster)"]
    lines += [f"skipped {impl} for {', '.join(cells)}: {why}" for (impl, why), cells in skipped.items()]
    gpu = sorted({impl for impl, why in skipped if why.startswith("needs")})
    if gpu:
        lines.append(f"GPU rows were skipped ({', '.join(gpu)}): no usable GPU here")
    return "\n".join(lines)


def _label(r) -> str:
    """An implementation's name, with the loop strategy where rnngraph ran one other than stages."""
    loop = r.get("loop_strategy", "stages")
    return r["impl"] if loop == "stages" else f"{r['impl']}:{loop}"


def _ms(v):
    return "-" if v is None else f"{v:.3f}"


def _ratio(r, ref, w):
    a, b = r.get(f"{w}_ms"), (ref or {}).get(f"{w}_ms")
    return f"{a / b:.2f}x" if a and b else "-"
