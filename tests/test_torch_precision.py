"""What rnngraph.torch reads from torch's settings, on the CPU: the default mode (graph on CUDA, staged here),
the TF32 rule (cuDNN's RNN flag for the cells torch runs through cuDNN, the matmul flag for every other
cell; torch's newer fp32_precision settings and its older flags alike), and that TF32 never applies off CUDA."""
import pytest

torch = pytest.importorskip("torch")
import rnngraph.torch as rt  # noqa: E402
from rnngraph import RnnGraphError  # noqa: E402
from rnngraph.run.backends import cpu_backend  # noqa: E402
from rnngraph.torch.precision import tf32_allowed  # noqa: E402
from torch_cases import F64, mgu_cell, randn  # noqa: E402

LEVELS = ("", "cudnn", "cudnn.rnn", "cudnn.conv", "cuda.matmul")    # parents first: setting one sets its children


def _level(path):
    module = torch.backends
    for part in filter(None, path.split(".")):
        module = getattr(module, part)
    return module


@pytest.fixture(autouse=True)
def restore_precision():
    if not hasattr(torch.backends.cudnn, "rnn"):
        pytest.skip("torch has no fp32_precision settings")
    kept = [(p, _level(p).fp32_precision) for p in LEVELS]
    yield
    for p, v in kept:
        _level(p).fp32_precision = v


def test_older_flags():
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = True
    assert not tf32_allowed("lstm") and not tf32_allowed("gru") and tf32_allowed("test_user_mgu")
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    assert tf32_allowed("lstm") and tf32_allowed("lstm_proj") and tf32_allowed("rnn_relu")
    assert not tf32_allowed("test_user_mgu")


def test_float32_matmul_precision():
    torch.set_float32_matmul_precision("high")
    assert tf32_allowed("mgu")
    torch.set_float32_matmul_precision("highest")
    assert not tf32_allowed("mgu")


def test_newer_settings_and_their_inheritance():
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert not tf32_allowed("lstm") and tf32_allowed("min_gru")
    torch.backends.cudnn.rnn.fp32_precision = "tf32"
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert tf32_allowed("lstm") and not tf32_allowed("min_gru")
    torch.backends.cudnn.fp32_precision = "tf32"            # the CUDA-wide level ...
    torch.backends.cudnn.rnn.fp32_precision = "none"       # ... which 'none' inherits
    torch.backends.cuda.matmul.fp32_precision = "none"
    assert tf32_allowed("lstm") and tf32_allowed("min_gru")
    torch.backends.cudnn.fp32_precision = "none"
    torch.backends.fp32_precision = "ieee"                 # the generic level, the last one asked
    assert not tf32_allowed("lstm") and not tf32_allowed("min_gru")


def test_off_cuda_tf32_never_applies():
    torch.backends.cudnn.fp32_precision = "tf32"
    model = rt.LSTM(3, 4)
    model(torch.zeros(2, 1, 3))
    assert list(model._engines) == [(torch.device("cpu"), torch.float32, False)]


def test_the_default_mode_is_staged_on_the_cpu_and_graph_asks_for_cuda():
    model = rt.Recurrent(mgu_cell, 3, 4, dtype=F64)
    assert model.mode is None and "mode" not in repr(model)
    model(randn(2, 1, 3, seed=1))
    (engine,) = model._engines.values()
    assert engine.mode == "staged" and engine.backend_name == cpu_backend()     # the compiled CPU backend where it runs
    graph = rt.GRU(3, 4, mode="graph", dtype=F64)
    graph(randn(2, 1, 3, seed=1))
    assert next(iter(graph._engines.values())).mode == "staged" and "mode='graph'" in repr(graph)
    with pytest.raises(RnnGraphError, match=r"unknown mode 'fast'; choose None \(graph on CUDA, staged on the "
                                            r"CPU\) or one of naive, staged, graph"):
        rt.LSTM(3, 4, mode="fast")
