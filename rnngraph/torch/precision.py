"""Which precision a layer computes in, read from torch's own settings: the autocast dtype (as torch casts the
inputs of its RNNs under autocast) and whether float32 matrix products may use TF32 (as torch would allow
for the same layer).

TF32: torch.nn.LSTM, GRU and RNN run cuDNN on CUDA, whose RNNs follow cuDNN's flag
(torch.backends.cudnn.rnn.fp32_precision, the older torch.backends.cudnn.allow_tf32: on by default), so
rnngraph.torch's LSTM, GRU, RNN and the cells follow that one; any other cell's torch equivalent is a loop of
matrix products, which follows the matmul flag (torch.backends.cuda.matmul.fp32_precision, the older
torch.backends.cuda.matmul.allow_tf32 or torch.set_float32_matmul_precision: off by default).
"""
from __future__ import annotations

import torch

CUDNN_CELLS = ("lstm", "lstm_proj", "gru", "rnn_tanh", "rnn_relu")   # the cells torch runs through cuDNN's RNN


def compute_dtype(device: torch.device, param_dtype: torch.dtype) -> torch.dtype:
    """The dtype a layer whose parameters are `param_dtype` computes in on `device`: the autocast dtype
    where autocast is on for that device type and the parameters are not float64 (autocast leaves float64
    alone), else the parameters' own."""
    kind = device.type
    if param_dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return param_dtype


def autocast_input(t, dtype: torch.dtype):
    """t cast to the compute dtype as autocast casts an op's inputs (a differentiable cast; float64 and None
    are left alone, so a mismatch is reported as one)."""
    if t is None or t.dtype in (dtype, torch.float64):
        return t
    return t.to(dtype)


def tf32_allowed(cell_name: str) -> bool:
    """Whether torch would compute a float32 layer of this cell in TF32 on CUDA now (see the module's text)."""
    if cell_name in CUDNN_CELLS:
        return _resolved(("cudnn.rnn", "cudnn", ""), lambda: torch.backends.cudnn.allow_tf32)
    return _resolved(("cuda.matmul", "cudnn", ""), lambda: torch.get_float32_matmul_precision() != "highest")


def _resolved(levels: tuple, legacy) -> bool:
    """torch's fp32_precision settings (torch ≥ 2.9) from the most specific level to the generic one
    (torch.backends.fp32_precision), the first that is not 'none' deciding; where torch has none of them,
    its older flag (`legacy()`). 'cudnn' is torch's CUDA-wide level (backend 'cuda', op 'all')."""
    found = False
    for path in levels:
        module = torch.backends
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
        value = getattr(module, "fp32_precision", None)
        found = found or value is not None
        if value not in (None, "none"):
            return value == "tf32"
    return False if found else bool(legacy())
