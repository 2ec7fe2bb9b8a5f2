"""The projected LSTM (proj_size) in float64 on the CPU: rnngraph.torch.LSTM and rnngraph.nn.LSTM equal
torch.nn.LSTM(proj_size=...) in outputs, final states and every gradient (2 layers, bidirectional, packed
input, given states); torch's parameter names and shapes; the cell's exact schedule; gradcheck."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rnngraph.nn as rnn  # noqa: E402
import rnngraph.torch as rt  # noqa: E402
from rnngraph import build_schedule  # noqa: E402
from rnngraph.ir.cells import lstm  # noqa: E402
from torch.nn.utils.rnn import PackedSequence  # noqa: E402
from torch_cases import F64, assert_same, pair, randn, run  # noqa: E402

CONFIGS = [{}, {"num_layers": 2, "bidirectional": True}, {"num_layers": 2, "bias": False, "batch_first": True}]


@pytest.mark.parametrize("config", CONFIGS, ids=["1layer", "2layer_bidir", "2layer_nobias_batch_first"])
def test_names_and_shapes_are_torch_s(config):
    ref, ours = pair("LSTM", 3, 6, proj_size=4, **config)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    assert ours.proj_size == 4 and "proj_size=4" in repr(ours)
    assert [[tuple(p.shape) for p in w] for w in ours.all_weights] == [[tuple(p.shape) for p in w]
                                                                        for w in ref.all_weights]


@pytest.mark.parametrize("config", CONFIGS, ids=["1layer", "2layer_bidir", "2layer_nobias_batch_first"])
def test_equals_torch_in_outputs_states_and_every_gradient(config):
    ref, ours = pair("LSTM", 3, 6, proj_size=4, **config)
    K = config.get("num_layers", 1) * (2 if config.get("bidirectional") else 1)
    x = randn(*((3, 7) if config.get("batch_first") else (7, 3)), 3, seed=1)
    given = (randn(K, 3, 4, seed=2), randn(K, 3, 6, seed=3))          # h0 [K, B, proj], c0 [K, B, hidden]
    for states in ((), given):
        got, y = run(ours, x, states)
        want, y_ref = run(ref, x, states)
        assert y.shape == y_ref.shape == (*x.shape[:2], 4 * (2 if config.get("bidirectional") else 1))
        assert got[1].shape == (K, 3, 4) and got[2].shape == (K, 3, 6)        # h_n projected, c_n not
        assert_same(got, want)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_packed_bidirectional_two_layers_equals_torch(batch_first):
    ref, ours = pair("LSTM", 3, 5, proj_size=2, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = randn(*((4, 6) if batch_first else (6, 4)), 3, seed=1)
    states = (randn(4, 4, 2, seed=2), randn(4, 4, 5, seed=3))
    got, y = run(ours, x, states, torch.tensor([4, 6, 1, 3]), batch_first)
    want, y_ref = run(ref, x, states, torch.tensor([4, 6, 1, 3]), batch_first)
    assert isinstance(y, PackedSequence) and torch.equal(y.batch_sizes, y_ref.batch_sizes)
    assert_same(got, want)


def test_gradcheck_through_inputs_states_and_parameters():
    from test_torch_module import gradcheck_module
    torch.manual_seed(0)
    model = rt.LSTM(2, 4, num_layers=2, bidirectional=True, proj_size=3, dtype=F64)
    gradcheck_module(model, randn(4, 2, 2, seed=1), (randn(4, 2, 3, seed=2), randn(4, 2, 4, seed=3)))


def test_rnngraph_nn_lstm_equals_torch():
    ref = torch.nn.LSTM(3, 6, num_layers=2, bidirectional=True, proj_size=4, dtype=F64)
    ours = rnn.LSTM(3, 6, num_layers=2, bidirectional=True, proj_size=4, dtype="float64")
    ours.load_state_dict(ref.state_dict())
    x, h0, c0 = randn(5, 2, 3, seed=1), randn(4, 2, 4, seed=2), randn(4, 2, 6, seed=3)
    xr = x.clone().requires_grad_()
    yr, (hr, cr) = ref(xr, (h0, c0))
    gy, gh, gc = randn(*yr.shape, seed=4), randn(*hr.shape, seed=5), randn(*cr.shape, seed=6)
    torch.autograd.backward([yr, hr, cr], [gy, gh, gc])
    y, (h, c) = ours(x.numpy(), (h0.numpy(), c0.numpy()))
    gx, _, grads = ours.backward(gy.numpy(), (gh.numpy(), gc.numpy()))
    assert_same([torch.from_numpy(a) for a in (y, h, c, gx)], [yr, hr, cr, xr.grad])
    assert_same([torch.from_numpy(grads[n]) for n, _ in ref.named_parameters()], [p.grad for p in ref.parameters()])


def test_initialisation_follows_torch_s_generator():
    torch.manual_seed(5)
    ref = torch.nn.LSTM(3, 6, 2, proj_size=4, dtype=F64)
    torch.manual_seed(5)
    ours = rt.LSTM(3, 6, 2, proj_size=4, dtype=F64)
    assert_same(list(ours.parameters()), list(ref.parameters()), rtol=0)


def test_the_projected_cell_schedules_the_projection_as_one_more_per_frame_gemm():
    """The projection is a third loop stage (h = W_hr·(o ⊙ tanh c)); the input products stay hoisted (their biases
    added in the loop's gate group)."""
    s = build_schedule(lstm(8, 16, proj_size=4))
    assert [(type(it).__name__, len(it.nodes)) for it in s.pre] == [("Gemm", 4)]
    assert [[(type(it).__name__, len(it.nodes)) for it in st] for st in s.loop] == [
        [("Gemm", 4)], [("Fused", 21)], [("Gemm", 1)]]
    k = s.summary()["kernels_per_frame"]
    assert (k["forward"]["after_merge"], k["backward"]["after_merge"]) == (3, 3)
    assert s.loop[2][0].nodes == ("h",)


def test_proj_size_zero_is_the_plain_lstm():
    plain, zero = lstm(3, 5), lstm(3, 5, proj_size=0)
    assert plain.name == zero.name == "lstm" and lstm(3, 5, proj_size=2).name == "lstm_proj"
    assert list(plain.graph.nodes) == list(zero.graph.nodes)
    assert np.array_equal(rnn.LSTM(3, 5, proj_size=0, dtype="float64").state_dict()["weight_hh_l0"],
                          rnn.LSTM(3, 5, dtype="float64").state_dict()["weight_hh_l0"])


def test_the_projected_cell_s_gpu_kernels_compile():
    """Without a GPU: its persistent loop kernels (forward, backward; every dtype) and its fused groups,
    compiled by NVRTC as the cupy backend would."""
    from nvrtc import nvrtc_compile
    from rnngraph.plan.items import Fused
    from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel
    from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
    from rnngraph.run.backends.cuda.persistent.phases import problem
    from rnngraph.run.backends.cuda.source import CTYPES
    cell = lstm(8, 64, proj_size=16)
    s = build_schedule(cell, loop="persistent")
    loops = (s.forward[1].items[0], next(sec for sec in s.backward if sec.name == "loop").items[0])
    for lp in loops:
        assert problem(cell, lp) is None
        for dtype, B in (("float32", 1), ("float64", 8), ("bfloat16", 2), ("float16", 2)):
            k = persistent_kernel(cell, lp, CTYPES[dtype], B, 132)
            nvrtc_compile(k.source, k.name)
    groups = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    for group in groups:
        for spec in (fused_forward_kernel(cell, group.nodes), fused_backward_kernel(cell, group.nodes, set(cell.params))):
            nvrtc_compile(*reversed(spec.source("float")))
