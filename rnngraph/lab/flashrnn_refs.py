"""The FlashRNN peer of `rnngraph bench` (Pöppel et al. 2024, the `flashrnn` package, imported only here): its
multi-head LSTM and sLSTM at the same sizes, fused ('cuda_fused', impl 'flashrnn') or alternating GEMM and
pointwise kernels ('cuda', impl 'flashrnn_cuda'). FlashRNN compiles its CUDA at first use (the first call's
seconds are its compile time) and needs torch with CUDA.

FlashRNN takes the gates' inputs W·x from outside, so x·W_ihᵀ (one GEMM over all frames, as rnngraph hoists
it) is part of each timed call. Its sLSTM is FlashRNN's own: a log-sigmoid forget gate and a normaliser
clamped at 1 (rnngraph's follows the xLSTM paper's exponential forget gate): the same work, not the same
numbers, so it is timed, not compared.
"""
from __future__ import annotations

FUNCTIONS = {"slstm": ("slstm", 4, 4), "mh_lstm": ("lstm", 4, 2), "lstm": ("lstm", 4, 2)}   # (its name, gates, states)
BACKENDS = {"flashrnn": "cuda_fused", "flashrnn_cuda": "cuda"}


def flashrnn_problem(impl: str, cell) -> str | None:
    """Why FlashRNN's `impl` cannot run `cell` here, in one line, or None."""
    if cell.name not in FUNCTIONS:
        return f"FlashRNN has no such cell here (it runs {', '.join(FUNCTIONS)})"
    try:
        import flashrnn  # noqa: F401
    except ImportError:
        return "flashrnn is not installed (pip install flashrnn, on the machine with the GPU)"
    import torch
    if not torch.cuda.is_available():
        return f"needs torch with CUDA (torch {torch.__version__} sees no GPU)"
    return None


def heads_of(cell) -> int:
    """The heads of a cell's recurrent weights (a head-wise weight [k, H/k, H/k]; 1 for a full matrix)."""
    shapes = [s for n, s in cell.params.items() if n.startswith(("R_", "W_h"))]
    return shapes[0][0] if shapes and len(shapes[0]) == 3 else 1


def flashrnn_fns(cell, impl: str, T: int, B: int, H: int, D: int, dtype: str, seed: int):
    """({"forward": fn, "train": fn}, backend name, "gpu", extra fields) of FlashRNN's `impl` for `cell` (one
    layer): x [T, B, D] -> W·x -> FlashRNN -> h [T, B, H]; a training step backpropagates a fixed grad_y
    into x, W, R and b. One training step runs here, compiling FlashRNN's kernels (its seconds: compile_s)."""
    import time
    from importlib.metadata import version

    import torch
    from flashrnn import flashrnn
    function, G, S = FUNCTIONS[cell.name]
    N = heads_of(cell)
    dev, tdt = torch.device("cuda"), getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape, scale=1.0: (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dev, tdt)
    W = rand(G * H, D, scale=D ** -0.5).requires_grad_()
    R = rand(G, N, H // N, H // N, scale=(H // N) ** -0.5).requires_grad_()
    b = rand(G, N, H // N, scale=0.0).requires_grad_()
    x, gy = rand(T, B, D).requires_grad_(), rand(T, B, H)
    states = torch.zeros(S, B, 1, N, H // N, device=dev, dtype=tdt)

    def run():
        wx = (x.reshape(T * B, D) @ W.t()).view(T, B, G, N, H // N).transpose(0, 1)      # [B, T, G, N, H/N]
        out, _ = flashrnn(wx, R, b, states=states, function=function, backend=BACKENDS[impl])
        return out[0]                                                                     # h: [B, T, N, H/N]

    def forward():
        with torch.no_grad():
            run()

    def train():
        for p in (x, W, R, b):
            p.grad = None
        run().reshape(B, T, H).transpose(0, 1).backward(gy)
    start = time.perf_counter()
    train()
    torch.cuda.synchronize()
    extra = {"heads": N, "compile_s": round(time.perf_counter() - start, 2), "flashrnn": version("flashrnn")}
    return {"forward": forward, "train": train}, f"flashrnn-{BACKENDS[impl]}", "gpu", extra
