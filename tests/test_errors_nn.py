"""Every error of the recurrent layers: an RnnGraphError that says expected versus got and, for the
usual mix-ups, what was probably meant."""
import numpy as np
import pytest

from numerics import needs_torch, torch
from rnngraph import Cell, RnnGraphError, RnnGraphWarning, load_cell, nn

T, B, D, H = 5, 3, 4, 6


def raises(fn, *fragments):
    with pytest.raises(RnnGraphError) as e:
        fn()
    for f in fragments:
        assert f in str(e.value), f"{f!r} not in: {e.value}"
    return str(e.value)


def x64(*shape):
    return np.random.default_rng(0).standard_normal(shape or (T, B, D))


# -- inputs -----------------------------------------------------------------------------------
def test_wrong_input_rank():
    layer = nn.LSTM(D, H, dtype="float64")
    raises(lambda: layer(x64(T, D)), "x must be 3-D [T, B, D]", "got 2-D shape [5, 4]", "x[:, None]")
    raises(lambda: nn.GRU(D, H, batch_first=True, dtype="float64")(x64(1, 2, T, D)), "[B, T, D]", "got 4-D")


def test_wrong_feature_size():
    raises(lambda: nn.GRU(D, H, dtype="float64")(x64(T, B, 7)), "x has 7 features", "input_size is 4")
    raises(lambda: nn.GRU(D, H, dtype="float64")(x64(T, D, B)), "features must be the last axis")


def test_dtype_mismatch():
    layer = nn.LSTM(D, H, dtype="float64")
    raises(lambda: layer(x64().astype(np.float32)), "x has dtype float32 but the layer is float64",
           "x.astype('float64')")
    raises(lambda: nn.LSTM(D, H)(x64()), "x has dtype float64 but the layer is float32")
    h0 = np.zeros((1, B, H), np.float32)
    raises(lambda: layer(x64(), (h0, h0.astype(np.float64))), "h0 has dtype float32")


class FakeCupyArray:      # stands in for a cupy.ndarray on a machine without a GPU
    pass


FakeCupyArray.__module__ = "cupy._core.core"


def test_backend_mismatch():
    layer = nn.GRU(D, H, dtype="float64")
    assert layer.backend_name == "numpy"
    raises(lambda: layer(FakeCupyArray()), "runs on the numpy backend", "x.get()", "backend='cupy'")
    raises(lambda: layer([[[0.0] * D]]), "builtins.list", "numpy.asarray")


@needs_torch
def test_backend_mismatch_torch_tensor():
    layer = nn.GRU(D, H, dtype="float64")
    raises(lambda: layer(torch.zeros(T, B, D, dtype=torch.float64)), "torch.Tensor", "x.detach().cpu().numpy()")


def test_lengths_errors():
    layer = nn.GRU(D, H, dtype="float64")
    raises(lambda: layer(x64(), lengths=[5, 2]), "lengths must be 3 integers", "shape [2]")
    raises(lambda: layer(x64(), lengths=[5, 2, 6]), "lengths must lie in [0, T=5]", "max 6")
    raises(lambda: layer(x64(), lengths=np.array([5.0, 2.0, 1.0])), "lengths must be 3 integers", "float64")


# -- states -----------------------------------------------------------------------------------
def test_state_shape_expected_vs_got():
    layer = nn.GRU(D, H, num_layers=2, dtype="float64")
    raises(lambda: layer(x64(), np.zeros((2, B, H + 1))), "h0 must be [num_layers·num_directions, B, 6]",
           "[2, 3, 6]", "got [2, 3, 7]", "last axis must be the state size 6")


def test_bidirectional_h0_batch_first_swapped():
    """The seed complaint: with batch_first=True, a bi-LSTM user passes h0 as [B, 2, H]."""
    layer = nn.LSTM(D, H, bidirectional=True, batch_first=True, dtype="float64")
    h0 = np.zeros((B, 2, H))
    msg = raises(lambda: layer(x64(B, T, D), (h0, h0)), "h0 must be", "whatever batch_first is",
                 "got [3, 2, 6]", "first two axes look swapped", "h0.transpose(1, 0, 2)")
    assert "c0" not in msg          # the first bad state is named, not a generic one


def test_state_batch_equals_time_means_batch_first_flipped():
    layer = nn.GRU(D, H, dtype="float64")         # batch_first=False, but x is really [B, T, D]
    raises(lambda: layer(x64(B, T, D), np.zeros((1, B, H))), "equals the time length of x",
           "build the layer with batch_first=True")
    bf = nn.GRU(D, H, batch_first=True, dtype="float64")   # batch_first=True, but x is really [T, B, D]
    raises(lambda: bf(x64(T, B, D), np.zeros((1, B, H))), "batch_first=False")


def test_wrong_number_of_layers_times_directions():
    bi = nn.LSTM(D, H, num_layers=2, bidirectional=True, dtype="float64")
    h = np.zeros((2, B, H))
    raises(lambda: bi(x64(), (h, h)), "holds 2 layer·direction slices", "2·2 = 4",
           "one slice per layer and direction")
    uni = nn.GRU(D, H, num_layers=2, dtype="float64")
    raises(lambda: uni(x64(), np.zeros((4, B, H))), "did you mean bidirectional=True?")


def test_state_structure_errors():
    lstm = nn.LSTM(D, H, dtype="float64")
    raises(lambda: lstm(x64(), np.zeros((1, B, H))), "LSTM takes its state as a tuple (h0, c0)")
    raises(lambda: lstm(x64(), (np.zeros((1, B, H)),)), "takes 2 state array(s) (h0, c0)", "tuple of 1")
    raises(lambda: lstm(x64(), (np.zeros((1, B, H)), np.zeros((B, H)))), "c0 must be",
           "add the leading layers·directions axis")
    gru = nn.GRU(D, H, dtype="float64")
    y, h = gru(x64())
    raises(lambda: gru.backward(y, (h, h)), "grad_h_n")


def test_backward_errors():
    layer = nn.GRU(D, H, dtype="float64")
    raises(lambda: layer.backward(np.zeros((T, B, H))), "backward() called before")
    y, _ = layer(x64())
    raises(lambda: layer.backward(np.zeros((T, B, H + 1))), "grad_y must have the shape of the output y",
           "[5, 3, 6]")
    raises(lambda: layer.backward(np.zeros((T, B, H), np.float32)), "grad_y has dtype float32")
    raises(lambda: layer.backward(y, np.zeros((1, B, H + 1))), "grad_h_n must be")


# -- state dicts ------------------------------------------------------------------------------
def test_load_state_dict_lists_every_problem_by_name():
    layer = nn.LSTM(D, H, num_layers=2, dtype="float64")
    sd = layer.state_dict()
    del sd["weight_hh_l1"], sd["bias_ih_l0"]
    sd["weight_ih_l0"] = np.zeros((4 * H, D + 1))
    sd["weight_ih_l0_reverse"] = np.zeros((4 * H, D))
    sd["bogus"] = np.zeros(1)
    raises(lambda: layer.load_state_dict(sd), "missing keys: bias_ih_l0, weight_hh_l1",
           "unexpected keys: weight_ih_l0_reverse, bogus", "weight_ih_l0: expected [24, 4], got [24, 5]")
    before = layer.state_dict()["weight_hh_l0"]
    layer.load_state_dict({"weight_hh_l0": before + 1}, strict=False)   # non-strict: partial loads
    np.testing.assert_array_equal(layer.state_dict()["weight_hh_l0"], before + 1)


@needs_torch
def test_torch_state_dict_loads_as_tensors_or_numpy():
    tm = torch.nn.GRU(D, H, 2, bidirectional=True)
    a, b = nn.GRU(D, H, 2, bidirectional=True), nn.GRU(D, H, 2, bidirectional=True)
    a.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    b.load_state_dict(tm.state_dict())
    for k, v in tm.state_dict().items():
        np.testing.assert_array_equal(a.state_dict()[k], v.numpy())
        np.testing.assert_array_equal(b.state_dict()[k], v.numpy())


# -- non-finite values ------------------------------------------------------------------------
def test_check_finite_names_what_is_not_finite():
    layer = nn.GRU(D, H, dtype="float64")
    x = x64()
    x[2, 1, 3] = np.nan
    y, _ = layer(x)                                  # off by default
    layer.check_finite = True
    raises(lambda: layer(x), "x is not finite: 1 NaN and 0 inf among 60 values; first at index (2, 1, 3)")
    raises(lambda: layer(x64(), np.full((1, B, H), np.inf)), "h0 is not finite", "0 NaN and 18 inf")
    y, _ = layer(x64())
    g = np.zeros_like(y)
    g[0, 0, 0] = np.inf
    raises(lambda: layer.backward(g), "grad_y is not finite")
    layer.parameters()["weight_hh_l0"][0, 0] = np.nan
    raises(lambda: layer(x64()), "layer 0 stored a value that is not finite: parameter 'W_hr' is not finite")


def test_check_finite_names_the_first_op_that_overflowed():
    """A float16 overflow that the gates' saturation hides from the output is still found, at its op and
    frame, in its layer and direction."""
    layer = nn.LSTM(D, H, num_layers=2, bidirectional=True, dtype="float16")
    x = np.ones((T, B, D), "float16")
    x[3] = 300.0                                     # frame 3 only
    layer.parameters()["weight_ih_l0_reverse"][...] = 100.0
    with np.errstate(over="ignore"):
        y, _ = layer(x)
        assert np.isfinite(y).all()                  # σ(inf) = 1: the output alone shows nothing
        layer.check_finite = True
        msg = raises(lambda: layer(x), "layer 0 (reverse direction, time-reversed frames) stored a value that is "
                     "not finite: op 'linear1' (linear) at frame", "float16 holds at most 65504")
    assert f"at frame {T - 1 - 3};" in msg


def test_check_finite_helper_for_losses_and_gradients():
    raises(lambda: nn.check_finite("loss", float("nan")), "loss is not finite: 1 NaN")
    a = np.ones(3)
    assert nn.check_finite("grad", a) is a
    assert nn.check_finite("loss", 0.5) == 0.5


# -- construction -----------------------------------------------------------------------------
def test_construction_errors():
    raises(lambda: nn.RNN(D, H, nonlinearity="gelu"), "unknown nonlinearity 'gelu'", "'tanh' or 'relu'")
    raises(lambda: nn.GRU(D, H, dropout=1.0), "dropout must be a probability in [0, 1)")
    raises(lambda: nn.GRU(D, 0), "hidden_size must be a positive integer")
    raises(lambda: nn.GRU(D, H, dtype="int32"), "dtype must be one of")
    raises(lambda: nn.GRU(D, H, mode="fast"), "unknown mode 'fast'")
    raises(lambda: nn.GRU(D, H, backend="tpu"), "unknown backend 'tpu'")
    raises(lambda: nn.GRU(D, H, init="xavier"), "unknown init 'xavier'")
    raises(lambda: nn.Recurrent("nope", D, H), "unknown cell 'nope'")
    with pytest.warns(RnnGraphWarning, match="dropout acts between stacked layers"):
        nn.GRU(D, H, dropout=0.2)


def test_cell_graph_must_fit_each_layer():
    cell = load_cell("gru", D, H)
    nn.Recurrent(cell, D, H)                         # one layer: fine
    raises(lambda: nn.Recurrent(cell, D, H, num_layers=2), "layer 1's input", "is 6",
           "pass a cell function or name")
    raises(lambda: nn.Recurrent(cell, D + 1, H), "takes input 'x' of 4 features but input_size is 5")

    def two_inputs(d, h):
        c = Cell("two")
        x, u, s = c.input("x", d), c.input("u", d), c.state("h", h)
        c.output(c.bind(s, c.tanh(c.linear(x, "W", h) + c.linear(u, "V", h) + c.linear(s, "U", h)), name="h"))
        return c.build()
    raises(lambda: nn.Recurrent(two_inputs, D, H), "one input and one output", "['x', 'u']")
