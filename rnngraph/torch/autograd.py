"""The bridge: zero-copy views between torch tensors and rnngraph's arrays, and the autograd Function
whose forward is an rnngraph layer's forward and whose backward is its BPTT.

CPU tensors are numpy views (Tensor.numpy()); CUDA tensors are cupy views of their memory (made from its
address on the way in, through DLPack on the way out), and the layer's kernels and graph replays run on
torch's current CUDA stream (a cupy stream wrapping it), so nothing synchronises the device or goes
through the host.
"""
from __future__ import annotations

import contextlib
import copy
import itertools

import numpy as np
import torch

from ..arrays import dtype_name, float_dtype
from ..errors import RnnGraphError

SECOND_ORDER = ("rnngraph.torch: second-order gradients (backward with create_graph=True, or a gradient of a "
                "gradient) are not supported: rnngraph's BPTT is not itself differentiable; take first-order "
                "gradients only")
_SERIAL = itertools.count(1)


def to_array(t: torch.Tensor):
    """A numpy (CPU) or cupy (CUDA) array sharing t's memory (t detached; strides kept)."""
    t = t.detach()
    if t.device.type == "cpu":
        if t.dtype == torch.bfloat16:       # numpy has no bfloat16: the same bits, as ml_dtypes' type
            return t.view(torch.int16).numpy().view(float_dtype("bfloat16", half=True))
        return t.numpy()
    if t.device.type == "cuda":
        return _cupy_view(t)
    raise RnnGraphError(f"rnngraph.torch runs on CPU and CUDA tensors; got one on {t.device}")


def _cupy_view(t: torch.Tensor):
    """t's memory as a cupy array, made from its address, shape and strides (the memory keeps t alive):
    a few µs, where cupy.from_dlpack costs ~20 µs of host time per call."""
    import cupy
    dtype = float_dtype(_NUMPY[t.dtype], half=True) if t.dtype in _NUMPY else None
    if dtype is None or t.numel() == 0:
        return cupy.from_dlpack(t)
    item = t.element_size()
    extent = (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * item
    memory = cupy.cuda.UnownedMemory(t.data_ptr(), extent, t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(memory, 0),
                        tuple(s * item for s in t.stride()))


_NUMPY = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def to_tensor(a, device: torch.device) -> torch.Tensor:
    """A tensor sharing the memory of rnngraph's array `a` (numpy on the CPU, cupy on `device`)."""
    bf16 = dtype_name(a.dtype) == "bfloat16"     # crosses as its bits (int16): DLPack and numpy may not know it
    if device.type != "cpu":
        return torch.from_dlpack(a.view("int16")).view(torch.bfloat16) if bf16 else torch.from_dlpack(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(a)


@contextlib.contextmanager
def on_stream(device: torch.device):
    """cupy's current device and stream are torch's for `device` inside (nothing to do on the CPU)."""
    if device.type != "cuda":
        yield
        return
    import cupy
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index), _cupy_stream(cupy, index):
        yield


_STREAMS: dict = {}       # (device index, torch stream pointer) -> the cupy stream object wrapping it
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)    # 0.1 µs, against 5 µs for current_stream()


def _cupy_stream(cupy, index: int):
    """A cupy stream for torch's current stream on device `index`, made once: Stream.from_external where
    torch's stream speaks the CUDA stream protocol (cupy ≥ 14 deprecates ExternalStream), else ExternalStream."""
    key = (index, _RAW_STREAM(index) if _RAW_STREAM else torch.cuda.current_stream(index).cuda_stream)
    if key[1] == 0:         # torch's default stream is the legacy default stream, cupy's null stream: using
        return cupy.cuda.Stream.null    # that object lets DLPack see one stream (no event per conversion)
    if key not in _STREAMS:
        stream = torch.cuda.current_stream(index)
        if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
            _STREAMS[key] = cupy.cuda.Stream.from_external(stream)
        else:
            _STREAMS[key] = cupy.cuda.ExternalStream(stream.cuda_stream, index)
    return _STREAMS[key]


class RecurrentFunction(torch.autograd.Function):
    """apply(engine, lengths, step, names, x, *states, *params) -> (y, *final states): one state entry (a
    tensor or None) per cell state, then the parameters named `names` (the engine's names). engine: an
    rnngraph.nn.Recurrent running on the parameters' memory, or on a copy in its own dtype (bind);
    lengths: host ints [B] or None; step: x is one frame [B, D] and runs as engine.step."""

    @staticmethod
    def forward(ctx, engine, lengths, step, names, x, *rest):
        n_states = len(engine.state_names)
        states, params = rest[:n_states], rest[n_states:]
        ctx.set_materialize_grads(False)
        ctx.engine, ctx.lengths, ctx.step, ctx.names = engine, lengths, step, names
        ctx.training = engine.training
        masks = engine.training and engine.dropout > 0 and engine.num_layers > 1
        ctx.rng = copy.deepcopy(engine.rng.bit_generator.state) if masks else None   # to redraw this call's masks
        ctx.serial = engine.torch_serial = next(_SERIAL)
        ctx.save_for_backward(x, *(s for s in states if s is not None), *params)
        ctx.given = tuple(s is not None for s in states)
        with on_stream(x.device):
            bind(engine, dict(zip(names, params)))
            y, fin = _run(engine, x, states, lengths, step)
        fins = fin if isinstance(fin, tuple) else (fin,)
        return (to_tensor(y, x.device), *(to_tensor(f, x.device) for f in fins))

    @staticmethod
    def backward(ctx, gy, *g_finals):
        if torch.is_grad_enabled():
            raise RuntimeError(SECOND_ORDER)
        engine, (x, *saved) = ctx.engine, ctx.saved_tensors
        given = iter(saved[:sum(ctx.given)])
        states = tuple(next(given) if g else None for g in ctx.given)
        params = saved[sum(ctx.given):]
        with on_stream(x.device):
            # another call ran since, or a backward in chunks spent this call's stored values (retain_graph):
            if engine.torch_serial != ctx.serial or engine.spent:   # this call's forward again,
                bind(engine, dict(zip(ctx.names, params)))      # on this call's parameters
                later, mode = engine.rng.bit_generator.state, engine.training
                if ctx.rng is not None:
                    engine.rng.bit_generator.state = ctx.rng
                engine.train(ctx.training)
                _run(engine, x, states, ctx.lengths, ctx.step)
                engine.rng.bit_generator.state = later
                engine.train(mode)
                engine.torch_serial = ctx.serial
            gx, g0 = engine.backward_flat(None if gy is None else to_array(gy), _state(g_finals))
        dev = x.device
        g0 = g0 if isinstance(g0, tuple) else (g0,)
        g_states = tuple(to_tensor(g, dev) if given else None for g, given in zip(g0, ctx.given))
        flat = to_tensor(engine.grad_flat, dev).to(params[0].dtype)   # one conversion for every parameter (a
        shapes = engine.parameters()                                    # cast back: autocast), then torch views
        views = dict(zip(shapes, (t.view(a.shape) for t, a in zip(flat.split([a.size for a in shapes.values()]),
                                                                    shapes.values()))))
        return (None, None, None, None, to_tensor(gx, dev), *g_states, *(views[n] for n in ctx.names))


def _run(engine, x, states, lengths, step: bool):
    """The engine's forward of x (tensors in, arrays out): a call over its frames, or one step."""
    if step:
        return engine.step(to_array(x), _state(states))
    return engine(to_array(x), _state(states), lengths)


def bind(engine, params: dict):
    """Makes the engine run on these parameter tensors: in place where they have its dtype (a no-op when it
    already does), else (under autocast) on a copy in its dtype, one buffer the engine keeps (so recorded
    graphs stay valid), refilled from them now by one multi-tensor copy."""
    if next(iter(params.values())).dtype != engine.torch_dtype:
        params = _refill_copy(engine, params)
    bound = tuple(p.data_ptr() for p in params.values())
    if engine.torch_params != bound:
        engine.share_parameters({n: to_array(p) for n, p in params.items()})
        engine.torch_params = bound


def _refill_copy(engine, params: dict) -> dict:
    """name -> the engine's copy of each parameter in its own dtype, filled from `params` (same names)."""
    if engine.torch_copy is None:
        first = next(iter(params.values()))
        flat = torch.empty(sum(p.numel() for p in params.values()), dtype=engine.torch_dtype, device=first.device)
        parts = flat.split([p.numel() for p in params.values()])
        engine.torch_copy = {n: t.view(p.shape) for (n, p), t in zip(params.items(), parts)}
    with torch.no_grad():
        torch._foreach_copy_(list(engine.torch_copy.values()), list(params.values()))
    return engine.torch_copy


def _state(parts: tuple):
    """The engine's state argument from tensors, arrays or None: None, one array, or a tuple in the cell's
    state order."""
    arrays = tuple(to_array(p) if isinstance(p, torch.Tensor) else p for p in parts)
    if all(a is None for a in arrays):
        return None
    return arrays[0] if len(arrays) == 1 else arrays
