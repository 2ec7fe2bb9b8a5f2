"""The recurrent layers: equivalence with torch, naive == staged, truncated BPTT, variable lengths,
state dicts, dropout and initialisation."""
import random

import numpy as np
import pytest

from numerics import needs_torch, torch
from rnngraph import CELLS, Cell, nn
from rnngraph.arrays import dropout_mask

F64 = dict(dtype="float64")


def assert_rel(a, b, tol, what=""):
    """max |a - b| <= tol · max |b| (both arrays; b the reference)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    err = np.abs(a - b).max(initial=0.0)
    assert err <= tol * max(np.abs(b).max(initial=0.0), 1e-300), f"{what}: max error {err:.3e}"


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


def pack(layer, parts):
    return tuple(parts) if len(layer.state_names) > 1 else parts[0]


# -- torch equivalence (skipped without torch; the lambdas read torch only when called) ---------
TORCH = {"lstm": lambda *a, **k: torch.nn.LSTM(*a, **k), "gru": lambda *a, **k: torch.nn.GRU(*a, **k),
         "rnn_tanh": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="tanh", **k),
         "rnn_relu": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="relu", **k)}
OURS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": lambda *a, **k: nn.RNN(*a, nonlinearity="tanh", **k),
        "rnn_relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k)}

#          L  bidir  batch_first T  B  D  H  bias   h0
CONFIGS = [(1, False, False,      5, 3, 4, 6, True, True),
           (2, True, False,       4, 2, 3, 5, True, True),
           (3, False, True,       3, 2, 5, 4, True, True),
           (3, True, True,        4, 3, 2, 3, False, True),
           (1, True, True,        1, 1, 3, 2, True, True),     # T = 1, B = 1
           (2, False, False,      6, 1, 7, 5, True, False)]    # B = 1, zero initial state


def run_pair(kind, L, bidir, bf, T, B, D, H, bias, with_h0, lengths=None, seed=0):
    """Same weights, inputs and upstream gradients through torch and rnngraph; returns both results."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    rng = np.random.default_rng(seed)
    tm = TORCH[kind](D, H, L, bias=bias, batch_first=bf, bidirectional=bidir).double()
    ours = OURS[kind](D, H, L, bias=bias, batch_first=bf, bidirectional=bidir, **F64)
    ours.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    K, nd = L * (2 if bidir else 1), 2 if bidir else 1
    x = rng.standard_normal((B, T, D) if bf else (T, B, D))
    n_states = 2 if kind == "lstm" else 1
    state = [rng.standard_normal((K, B, H)) for _ in range(n_states)] if with_h0 else None
    gy = rng.standard_normal((B, T, nd * H) if bf else (T, B, nd * H))
    gs = [rng.standard_normal((K, B, H)) for _ in range(n_states)]

    xt = torch.tensor(x, requires_grad=True)
    st = [torch.tensor(s, requires_grad=True) for s in state] if with_h0 else None
    inp = xt if lengths is None else pack_padded_sequence(xt, torch.tensor(lengths), batch_first=bf,
                                                          enforce_sorted=False)
    out, sn = tm(inp, None if st is None else (tuple(st) if n_states > 1 else st[0]))
    if lengths is not None:
        out, _ = pad_packed_sequence(out, batch_first=bf, total_length=T)
    sn = as_tuple(sn)
    loss = (out * torch.tensor(gy)).sum() + sum((a * torch.tensor(g)).sum() for a, g in zip(sn, gs))
    loss.backward()
    ref = dict(y=out.detach().numpy(), states=[s.detach().numpy() for s in sn], gx=xt.grad.numpy(),
               g0=[s.grad.numpy() for s in st] if st else None,
               grads={k: p.grad.numpy() for k, p in tm.named_parameters()})

    y, sn = ours(x, None if state is None else pack(ours, state), lengths=lengths)
    gx, g0, grads = ours.backward(gy, pack(ours, gs))
    got = dict(y=y, states=list(as_tuple(sn)), gx=gx, g0=list(as_tuple(g0)), grads=grads)
    return got, ref


def assert_matches_torch(got, ref, tol=1e-10):
    assert_rel(got["y"], ref["y"], tol, "y")
    for k, (a, b) in enumerate(zip(got["states"], ref["states"])):
        assert_rel(a, b, tol, f"final state {k}")
    assert_rel(got["gx"], ref["gx"], tol, "grad x")
    if ref["g0"] is not None:
        for k, (a, b) in enumerate(zip(got["g0"], ref["g0"])):
            assert_rel(a, b, tol, f"grad of initial state {k}")
    assert set(got["grads"]) == set(ref["grads"])
    for name, b in ref["grads"].items():
        assert_rel(got["grads"][name], b, tol, f"grad {name}")


@needs_torch
@pytest.mark.parametrize("kind", list(TORCH))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "L{}-bi{:d}-bf{:d}-T{}B{}D{}H{}-bias{:d}-h0{:d}".format(*c))
def test_matches_torch(kind, config):
    assert_matches_torch(*run_pair(kind, *config))


@needs_torch
@pytest.mark.parametrize("kind", list(TORCH))
@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_match_torch_packed(kind, batch_first):
    got, ref = run_pair(kind, 2, True, batch_first, 6, 4, 3, 5, True, True, lengths=[6, 2, 1, 4])
    assert_matches_torch(got, ref)


def test_default_dtype_is_float32_and_close_to_float64():
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    l32, l64 = nn.GRU(3, 4, 2), nn.GRU(3, 4, 2, **F64)
    l64.load_state_dict(l32.state_dict())
    y32, h32 = l32(x.astype(np.float32))
    y64, h64 = l64(x)
    assert y32.dtype == h32.dtype == np.float32 and l32.dtype == np.float32
    assert_rel(y32, y64, 1e-5, "float32 vs float64")


# -- naive == staged --------------------------------------------------------------------------
RANDOM_OPS = ("add", "sub", "mul", "scale", "one_minus", "sigmoid", "tanh", "relu", "identity",
              "linear", "concat_slice", "diag")


def random_cell(seed: int):
    """A cell function building a random cell with the public builder: 1-2 states, delays 1-2,
    3-9 ops drawn from RANDOM_OPS. Deterministic in `seed`, so every layer gets the same structure."""
    def fn(D, H, bias=True):
        r = random.Random(seed)
        c = Cell(f"random{seed}")
        x = c.input("x", D)
        states = [c.state(f"s{k}", H) for k in range(r.randint(1, 2))]
        pool = [c.linear(x, "W_x", H, bias="b_x")]
        for s in states:
            pool.append(c.linear(s, f"U_{s.label}", H))
            if r.random() < 0.5:
                pool.append(c.linear(s.ago(2), f"V_{s.label}", H))
        for k in range(r.randint(3, 9)):
            op, a, b = r.choice(RANDOM_OPS), r.choice(pool), r.choice(pool)
            v = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * c.tanh(b),
                 "scale": lambda: a * r.uniform(-2, 2), "one_minus": lambda: 1 - c.sigmoid(a),
                 "sigmoid": lambda: c.sigmoid(a), "tanh": lambda: c.tanh(a), "relu": lambda: c.relu(a),
                 "identity": lambda: c.identity(a), "linear": lambda: c.linear(c.tanh(a), f"W{k}", H),
                 "concat_slice": lambda: c.slice(c.concat(a, b), H // 2, H // 2 + H),
                 "diag": lambda: c.diag(a, f"d{k}")}[op]()
            pool.append(v)
        for i, s in enumerate(states):
            c.bind(s, c.tanh(pool[-1 - i] + pool[0]))
        c.output(c.tanh(pool[-1]) * c.sigmoid(pool[0]), name="y")
        return c.build()
    return fn


def run_both_modes(cell, **kw):
    res = {}
    for mode in ("naive", "staged"):
        rng = np.random.default_rng(1)
        layer = nn.Recurrent(cell, 3, 4, mode=mode, seed=5, **F64, **kw)
        x = rng.standard_normal((5, 3, 3))
        K = layer.num_layers * layer.num_directions
        state = [rng.standard_normal((K, 3, n)) for _, n in layer.cell.states.values()]
        y, sn = layer(x, pack(layer, state), lengths=[5, 3, 4])
        gy = rng.standard_normal(y.shape)
        gs = [rng.standard_normal(s.shape) for s in as_tuple(sn)]
        gx, g0, grads = layer.backward(gy, pack(layer, gs))
        res[mode] = [y, *as_tuple(sn), gx, *as_tuple(g0), *grads.values()]
    for a, b in zip(res["naive"], res["staged"], strict=True):
        assert_rel(a, b, 1e-12, f"{cell} naive vs staged")


@pytest.mark.parametrize("cell", list(CELLS))
def test_naive_equals_staged_builtin(cell):
    run_both_modes(cell, num_layers=2, bidirectional=True)


@pytest.mark.parametrize("seed", range(12))
def test_naive_equals_staged_random_cells(seed):
    run_both_modes(random_cell(seed), bidirectional=True)


# -- truncated BPTT ---------------------------------------------------------------------------
def _stream(seed=0, T=12, B=2, D=3, H=4):
    rng = np.random.default_rng(seed)
    layer = nn.LSTM(D, H, num_layers=2, **F64)
    x, gy = rng.standard_normal((T, B, D)), rng.standard_normal((T, B, H))
    state = (rng.standard_normal((2, B, H)), rng.standard_normal((2, B, H)))
    return layer, x, gy, state


def test_tbptt_one_chunk_equals_full_bptt():
    layer, x, gy, state = _stream()
    y, sn = layer(x, state)
    full = layer.backward(gy)
    yc, snc = layer(x[0:len(x)], nn.detach(state))
    chunk = layer.backward(gy)
    np.testing.assert_array_equal(y, yc)
    for a, b in zip(sn + full[1] + tuple(full[2].values()), snc + chunk[1] + tuple(chunk[2].values())):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(full[0], chunk[0])


def test_tbptt_states_carry_and_gradient_stops_at_chunk_boundary():
    layer, x, gy, state0 = _stream()
    y_full, sn_full = layer(x, state0)
    K, state, ys, inits = 5, state0, [], []
    for t in range(0, len(x), K):                 # the one-liner loop of truncated BPTT
        inits.append(state)
        y, state = layer(x[t:t + K], nn.detach(state))
        ys.append(y)
    assert_rel(np.concatenate(ys), y_full, 1e-12, "chunked outputs")
    for a, b in zip(state, sn_full):
        assert_rel(a, b, 1e-12, "chunked final state")
    # backward of the last chunk covers that chunk only: a fresh run of the chunk alone agrees
    gx_last, g0_last, grads_last = layer.backward(gy[10:])
    alone = nn.LSTM(3, 4, num_layers=2, **F64).load_state_dict(layer.state_dict())
    alone(x[10:], inits[-1])
    gx_alone, _, grads_alone = alone.backward(gy[10:])
    np.testing.assert_array_equal(gx_last, gx_alone)
    for k in grads_alone:
        np.testing.assert_array_equal(grads_last[k], grads_alone[k])
    # grad_state0 is exactly what crosses the boundary: chaining it back rebuilds full BPTT
    layer(x, state0)
    gx_full, _, grads_full = layer.backward(gy)
    carry, total, gxs = None, {k: 0.0 for k in grads_full}, []
    for k in reversed(range(len(inits))):
        sl = slice(k * K, (k + 1) * K)
        layer(x[sl], inits[k])
        gx, carry, grads = layer.backward(gy[sl], carry)
        gxs.insert(0, gx)
        total = {n: total[n] + grads[n] for n in total}
    assert_rel(np.concatenate(gxs), gx_full, 1e-12, "chained grad x")
    for n in grads_full:
        assert_rel(total[n], grads_full[n], 1e-12, f"chained grad {n}")
    assert not np.allclose(grads_last["weight_hh_l0"], grads_full["weight_hh_l0"])


# -- variable lengths -------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["lstm", "gru", "sru"])
def test_padded_batch_equals_each_sequence_alone(cell):
    rng = np.random.default_rng(3)
    T, B, D, H, lengths = 6, 3, 3, 4, [6, 2, 4]
    layer = nn.Recurrent(cell, D, H, num_layers=2, bidirectional=True, batch_first=True, **F64)
    S = len(layer.state_names)
    x = rng.standard_normal((B, T, D)) * np.where(np.arange(T)[None, :, None] < np.array(lengths)[:, None, None], 1, np.nan)
    h0 = [rng.standard_normal((4, B, H)) for _ in range(S)]
    gy = rng.standard_normal((B, T, 2 * H))
    gs = [rng.standard_normal((4, B, H)) for _ in range(S)]
    y, sn = layer(x, pack(layer, h0), lengths=np.array(lengths))
    gx, g0, grads = layer.backward(gy, pack(layer, gs))
    total = {k: 0.0 for k in grads}
    for b, n in enumerate(lengths):
        yb, snb = layer(x[b:b + 1, :n], pack(layer, [h[:, b:b + 1] for h in h0]))
        gxb, g0b, gb = layer.backward(gy[b:b + 1, :n], pack(layer, [g[:, b:b + 1] for g in gs]))
        assert_rel(y[b, :n], yb[0], 1e-12, "y")
        assert_rel(gx[b, :n], gxb[0], 1e-12, "grad x")
        assert not y[b, n:].any() and not gx[b, n:].any(), "padded frames must be zero"
        for s in range(S):
            assert_rel(as_tuple(sn)[s][:, b], as_tuple(snb)[s][:, 0], 1e-12, "final state")
            assert_rel(as_tuple(g0)[s][:, b], as_tuple(g0b)[s][:, 0], 1e-12, "grad initial state")
        total = {k: total[k] + gb[k] for k in total}
    for k in grads:
        assert_rel(grads[k], total[k], 1e-12, f"grad {k}")


def test_zero_length_sequence_keeps_its_initial_state():
    layer = nn.GRU(2, 3, bidirectional=True, **F64)
    rng = np.random.default_rng(0)
    x, h0, gh = rng.standard_normal((4, 2, 2)), rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 2, 3))
    y, h = layer(x, h0, lengths=[4, 0])
    gx, g0, _ = layer.backward(np.ones_like(y), gh)
    np.testing.assert_array_equal(h[:, 1], h0[:, 1])
    np.testing.assert_array_equal(g0[:, 1], gh[:, 1])
    assert not y[:, 1].any() and not gx[:, 1].any()


# -- parameters, state dicts, modes, init -----------------------------------------------------
@needs_torch
@pytest.mark.parametrize("kind", list(TORCH))
def test_state_dict_names_shapes_and_order_match_torch(kind):
    tm = TORCH[kind](3, 5, 2, bidirectional=True, bias=False)
    ours = OURS[kind](3, 5, 2, bidirectional=True, bias=False)
    assert [(k, tuple(v.shape)) for k, v in tm.state_dict().items()] == \
           [(k, v.shape) for k, v in ours.state_dict().items()]
    assert list(ours.parameters()) == list(ours.state_dict())


def test_user_cell_names_and_roundtrip():
    a = nn.Recurrent("sru", 3, 4, num_layers=2, bidirectional=True, **F64)
    assert {"W_l0", "W_f_l0", "b_f_l0", "v_f_l1_reverse"} <= set(a.state_dict())
    b = nn.Recurrent("peephole_lstm", 3, 4)
    assert b.state_dict()["weight_peephole_l0"].shape == (12,)
    c = nn.Recurrent("sru", 3, 4, num_layers=2, bidirectional=True, seed=9, **F64).load_state_dict(a.state_dict())
    x = np.random.default_rng(0).standard_normal((4, 2, 3))
    np.testing.assert_array_equal(a(x)[0], c(x)[0])
    sd = a.state_dict()
    sd["W_l0"][...] = 7                            # state_dict returns copies
    assert not (a.parameters()["W_l0"] == 7).any()


def test_grads_keyed_like_parameters():
    layer = nn.LSTM(3, 4, num_layers=2, bidirectional=True, **F64)
    y, _ = layer(np.ones((2, 1, 3)))
    _, _, grads = layer.backward(np.ones_like(y))
    assert list(grads) == list(layer.parameters()) == list(layer.grads)
    assert all(grads[k].shape == p.shape for k, p in layer.parameters().items())


def test_dropout_only_in_training_and_seeded():
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    a = nn.LSTM(3, 4, num_layers=3, dropout=0.5, seed=1, **F64)
    b = nn.LSTM(3, 4, num_layers=3, dropout=0.5, seed=1, **F64)
    plain = nn.LSTM(3, 4, num_layers=3, **F64).load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a(x)[0], b(x)[0])            # same seed, same masks, bit-identical
    assert not np.allclose(a(x)[0], plain(x)[0])
    a.eval()
    np.testing.assert_array_equal(a(x)[0], plain(x)[0])
    assert a.train() is a and a.training


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_rate_independence_and_key(p):
    """Masks are 0 or 1/(1-p); the drop rate, a neighbour's and the next mask's agreement all match
    independent Bernoulli(p) draws within 5 standard deviations; one key per mask from the generator."""
    rng = np.random.default_rng(3)
    m = dropout_mask(rng, (64, 33, 51), p, np, np.float32)                # odd size: the last hash half unused
    assert m.shape == (64, 33, 51) and m.dtype == np.float32
    assert set(np.unique(m).tolist()) == {0.0, np.float32(1 / (1 - p))}
    drop, n = (m == 0).ravel(), m.size
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(drop.mean() - p) < 5 * sd
    both = (drop[:-1] & drop[1:]).mean()                                # neighbours, incl. the two halves of a hash
    assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / n)
    nxt = (dropout_mask(rng, m.shape, p, np, np.float32) == 0).ravel()
    assert abs((drop & nxt).mean() - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / n)
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    same = dropout_mask(a, (7, 5), p, np, np.float64), dropout_mask(b, (7, 5), p, np, np.float64)
    np.testing.assert_array_equal(*same)
    c = np.random.default_rng(9)
    c.integers(0, 2**63)                                                 # a mask takes exactly one draw
    assert a.integers(0, 2**63) == c.integers(0, 2**63)


def test_init_uniform_orthogonal_and_custom():
    layer = nn.LSTM(3, 16, num_layers=2)
    assert all(np.abs(p).max() <= 0.25 for p in layer.parameters().values())
    orth = nn.LSTM(3, 16, num_layers=2, init="orthogonal", **F64)
    w = orth.parameters()["weight_hh_l1"]
    for k in range(4):
        blk = w[16 * k:16 * (k + 1)]
        np.testing.assert_allclose(blk @ blk.T, np.eye(16), atol=1e-12)
    wi = orth.parameters()["weight_ih_l0"][:16]                  # [16, 3]: orthonormal columns
    np.testing.assert_allclose(wi.T @ wi, np.eye(3), atol=1e-12)
    assert not orth.parameters()["bias_ih_l0"].any()
    ones = nn.GRU(2, 3, init=lambda layer: [p.fill(1) for p in layer.parameters().values()])
    assert all((p == 1).all() for p in ones.parameters().values())


def test_returned_arrays_are_not_workspace_views():
    layer = nn.GRU(2, 3, **F64)
    x = np.random.default_rng(0).standard_normal((4, 2, 2))
    y1, h1 = layer(x)
    gx1, g01, _ = layer.backward(np.ones_like(y1), np.ones_like(h1))
    keep = [a.copy() for a in (y1, h1, gx1, g01)]
    layer(x * 2)
    layer.backward(np.ones_like(y1) * 3, np.ones_like(h1))
    for a, b in zip((y1, h1, gx1, g01), keep):
        np.testing.assert_array_equal(a, b)


def test_backend_name_and_repr():
    layer = nn.RNN(2, 3, nonlinearity="relu", bidirectional=True)
    assert layer.backend_name == "numpy"
    assert repr(layer) == "RNN(2, 3, bidirectional=True, backend=numpy, dtype=float32, mode=staged)"
    assert "cell=sru" in repr(nn.Recurrent("sru", 2, 3))


# -- GPU: the same layer on cupy --------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cupy_layer_matches_numpy(cell, mode):
    import cupy
    rng = np.random.default_rng(0)
    kw = dict(num_layers=2, bidirectional=True, dropout=0.3, batch_first=True, seed=4, **F64)
    cpu = nn.Recurrent(cell, 3, 5, **kw)
    gpu = nn.Recurrent(cell, 3, 5, backend="cupy", mode=mode, **kw).load_state_dict(cpu.state_dict())
    assert gpu.backend_name == "cupy"
    x, lengths = rng.standard_normal((4, 6, 3)), [6, 2, 5, 1]
    state = tuple(rng.standard_normal((4, 4, 5)) for _ in cpu.state_names)
    gy = rng.standard_normal((4, 6, 10))
    for step in range(2):                          # the second call replays recorded loops in 'graph' mode
        y, sn = cpu(x, pack(cpu, state), lengths=lengths)
        gx, g0, grads = cpu.backward(gy)
        yg, sng = gpu(cupy.asarray(x), pack(gpu, [cupy.asarray(s) for s in state]), lengths=lengths)
        gxg, g0g, gradsg = gpu.backward(cupy.asarray(gy))
        for a, b in zip([y, *as_tuple(sn), gx, *as_tuple(g0), *grads.values()],
                        [yg, *as_tuple(sng), gxg, *as_tuple(g0g), *gradsg.values()], strict=True):
            assert_rel(cupy.asnumpy(b), a, 1e-10, f"{cell} {mode} step {step}")
    np.testing.assert_array_equal(gpu.state_dict()["weight_hh_l1"], cpu.state_dict()["weight_hh_l1"])
    with pytest.raises(Exception, match="runs on the numpy backend"):
        cpu(cupy.asarray(x))
