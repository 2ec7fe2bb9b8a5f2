"""Head-wise linear ops (block-diagonal weights): the builder, the plan's batched GEMMs, and every CPU mode
against the same cell written with full block-diagonal matrices, by finite differences too."""
import numpy as np
import pytest

from numerics import close
from rnngraph import Cell, RnnGraphError, build_schedule, nn
from rnngraph.ir.ops import OpKind
from rnngraph.plan.items import Gemm, head_wise
from rnngraph.plan.schedule import schedule_flops
from test_gradcheck import gradcheck


def block_diag(blocks):
    """[k, o, i] blocks -> the [k·o, k·i] matrix with them on its diagonal."""
    k, o, i = blocks.shape
    out = np.zeros((k * o, k * i), blocks.dtype)
    for h in range(k):
        out[h * o:(h + 1) * o, h * i:(h + 1) * i] = blocks[h]
    return out


def head_cell(D, H, bias=True, heads=4, full=False):
    """h = tanh(W·x + b + R·h + Q·h + V·x): R and Q block-diagonal over `heads` heads, V over 2; full=True writes
    the same cell with full matrices (parameters R_full, ...), which block_diag fills."""
    c = Cell("full_cell" if full else "head_cell")
    x, h = c.input("x", D), c.state("h", H)

    def lin(v, name, k):
        return c.linear(v, name + ("_full" if full else ""), H, heads=1 if full else k)
    a = c.linear(x, "W", H, bias="b") + lin(h, "R", heads) + lin(h, "Q", heads)
    c.output(c.bind(h, c.tanh(a + lin(x, "V", 2)), name="h"))
    return c.build()


def test_the_builder_stores_a_head_wise_weight_as_its_blocks():
    cell = head_cell(6, 8)
    assert cell.params["R"] == (4, 2, 2) and cell.params["V"] == (2, 4, 3) and cell.params["W"] == (8, 6)
    (lin,) = [n for n in cell.graph if cell.op(n).kind is OpKind.HEAD_LINEAR and cell.reads(n)[1][0] == "R"]
    assert cell.op(lin).attrs == (4,) and cell.op(lin).size == 8


@pytest.mark.parametrize("size, out, why", [(6, 8, "its input has 6 features, not a multiple of 4"),
                                             (8, 6, "out_features has 6 features, not a multiple of 4")])
def test_heads_must_divide_both_sizes(size, out, why):
    c = Cell("bad")
    x = c.input("x", size)
    with pytest.raises(RnnGraphError, match=f"^linear 'R' in cell 'bad' has 4 heads but {why}; pick heads"):
        c.linear(x, "R", out, heads=4)
    with pytest.raises(RnnGraphError, match="heads of linear 'R' in cell 'bad' must be a positive integer"):
        c.linear(x, "R", out, heads=0)


def test_a_parameter_used_as_full_and_head_wise_is_a_shape_mismatch():
    c = Cell("both")
    x = c.input("x", 8)
    c.linear(x, "R", 8)
    with pytest.raises(RnnGraphError, match=r"shape mismatch for parameter 'R': declared \[8, 8\], now used as \[2, 4, 4\]"):
        c.linear(x, "R", 8, heads=2)


def test_head_wise_linears_on_one_operand_merge_into_one_batched_gemm():
    s = build_schedule(head_cell(6, 8))
    (gemm,) = s.loop[0]
    assert (gemm.operand, gemm.delay, gemm.weights, gemm.sizes, gemm.heads) == ("h", 1, ("R", "Q"), (8, 8), 4)
    assert head_wise(gemm) and head_wise(s.forward[1].items[0]) and not head_wise(s.pre[0])
    pre = [it for it in s.pre if isinstance(it, Gemm)]
    assert [(it.weights, it.heads) for it in pre] == [(("W",), 1), (("V",), 2)]    # full and 2 heads: apart
    assert "    stage 0: gemm   head_linear3, head_linear5 = h@t-1 · [R; Q]ᵀ per head (4 heads)   -> [16]" in str(s)
    assert s.summary()["param_grad_reductions"][0] == "dR; dQ <- gemm over T"


def test_head_wise_flops_are_the_blocks_only():
    """Per row and frame, R·h costs 2·8·8/4 forward: a quarter of the full matrix's."""
    heads, full = (schedule_flops(build_schedule(head_cell(6, 8, full=f))) for f in (False, True))
    assert full["forward"]["per_frame"] - heads["forward"]["per_frame"] == 2 * (2 * 8 * 8) * 3 // 4


def same_parameters(head_layer, full_layer):
    """Copies the head layer's parameters into the full one, each head-wise weight as its block-diagonal matrix."""
    for name, p in head_layer.parameters().items():
        stem, suffix = name.split("_l", 1)
        full = full_layer.parameters().get(name)
        if full is None:
            full = full_layer.parameters()[f"{stem}_full_l{suffix}"]
            full[...] = block_diag(p)
        else:
            full[...] = p


def run(layer, x, state, lengths, gy, gh):
    y, hn = layer(x, state, lengths)
    gx, g0, grads = layer.backward(gy, gh)
    return y.copy(), hn.copy(), gx.copy(), g0.copy(), {k: v.copy() for k, v in grads.items()}


@pytest.mark.parametrize("mode, loop", [("naive", "stages"), ("staged", "stages"), ("staged", "persistent")])
def test_every_cpu_mode_matches_the_block_diagonal_cell(mode, loop):
    """Values, finals and gradients, two layers both ways, ragged: the head-wise weights' gradients are the
    diagonal blocks of the full matrices' gradients."""
    opts = dict(num_layers=2, bidirectional=True, dtype="float64", mode=mode, loop=loop)
    heads = nn.Recurrent(head_cell, 6, 8, seed=3, **opts)
    full = nn.Recurrent(lambda D, H, bias=True: head_cell(D, H, bias, full=True), 6, 8, **opts)
    same_parameters(heads, full)
    rng = np.random.default_rng(0)
    x, h0 = rng.standard_normal((7, 3, 6)), rng.standard_normal((4, 3, 8))
    gy, gh = rng.standard_normal((7, 3, 16)), rng.standard_normal((4, 3, 8))
    lengths = np.array([7, 4, 1])
    a, b = run(heads, x, h0, lengths, gy, gh), run(full, x, h0, lengths, gy, gh)
    for u, v in zip(a[:4], b[:4]):
        close(u, v, 1e-12)
    for name, g in a[4].items():
        stem, suffix = name.split("_l", 1)
        if name in b[4]:
            close(g, b[4][name], 1e-12)
        else:
            k = g.shape[0]
            blocks = b[4][f"{stem}_full_l{suffix}"].reshape(k, g.shape[1], k, g.shape[2])
            close(g, np.stack([blocks[h, :, h] for h in range(k)]), 1e-12)


@pytest.mark.parametrize("mode", ["naive", "staged"])
def test_head_wise_gradients_match_central_differences(mode):
    assert gradcheck(nn.Recurrent(head_cell, 6, 8, dtype="float64", mode=mode, seed=1), T=6) >= 5


def test_a_weight_shared_by_two_head_wise_ops():
    """One head-wise weight read by two linear ops of one merged GEMM: its gradient adds both blocks."""
    def shared(D, H, bias=True):
        c = Cell("shared")
        x, h = c.input("x", D), c.state("h", H)
        u = c.tanh(c.linear(h, "R", H, heads=2) + c.linear(x, "W", H))
        c.output(c.bind(h, c.sigmoid(c.linear(h, "R", H, heads=2)) * u, name="h"))
        return c.build()
    assert gradcheck(nn.Recurrent(shared, 3, 4, dtype="float64", seed=2), T=5) >= 3


# -- the head partition the classifier finds ------------------------------------------------------
def recurrence(update, H):
    """A cell h = update(c, x projected to H, h@t-1)."""
    c = Cell("form")
    x, h = c.input("x", 4), c.state("h", H)
    c.output(c.bind(h, update(c, c.linear(x, "W", H), h), name="h"))
    return c.build()


PARTITIONS = {   # update: the heads of h's recurrence
    "one head-wise linear": (lambda c, a, h: c.tanh(a + c.linear(h, "R", 8, heads=4)), 4),
    "4 and 2 heads": (lambda c, a, h: c.tanh(c.linear(c.tanh(a + c.linear(h, "R", 8, heads=4)), "Q", 8, heads=2)), 2),
    "2 and 4 heads in two branches": (lambda c, a, h: c.tanh(c.linear(h, "R", 8, heads=2) + c.linear(h, "Q", 8, heads=4)
                                                             + a), 2),
    "2 and 4 heads, expanding": (lambda c, a, h: c.linear(c.tanh(c.linear(h, "R", 16, heads=4)), "Q", 8, heads=2) + a, 2),
    "elementwise around the heads": (lambda c, a, h: c.sigmoid(a) * h + c.maximum(c.linear(h, "R", 8, heads=8), a), 8),
    # each of these joins the heads
    "2 and 3 heads": (lambda c, a, h: c.tanh(a + c.linear(c.linear(h, "R", 12, heads=2), "Q", 12, heads=3)), None),
    "a full linear too": (lambda c, a, h: c.tanh(a + c.linear(h, "R", 8, heads=4) + c.linear(h, "U", 8)), None),
    "a full linear after the heads": (lambda c, a, h: c.tanh(c.linear(c.linear(h, "R", 8, heads=4), "U", 8) + a), None),
    "a slice": (lambda c, a, h: c.tanh(a + c.concat(*c.split(c.linear(h, "R", 8, heads=4), 2)[::-1])), None),
    "a row reduction": (lambda c, a, h: c.tanh(a + c.linear(h, "R", 8, heads=4) + c.mean(h)), None),
    "a layer norm": (lambda c, a, h: c.tanh(a + c.layer_norm(c.linear(h, "R", 8, heads=4))), None),
    "no head-wise linear": (lambda c, a, h: c.tanh(a + c.diag(h, "u")), None),
}


@pytest.mark.parametrize("form", PARTITIONS)
def test_the_heads_a_recurrence_keeps_apart(form):
    update, heads = PARTITIONS[form]
    sc = build_schedule(recurrence(update, 12 if form == "2 and 3 heads" else 8)).state_classes["h"]
    assert sc.heads == heads
    assert (f"{heads} heads, each a recurrence of its own" in sc.why) == (heads is not None)


def test_heads_are_per_state():
    """h's recurrence is head-wise; s (a full matrix on itself) joins its own features only; e is elementwise."""
    c = Cell("three")
    x, h, s, e = c.input("x", 4), c.state("h", 8), c.state("s", 8), c.state("e", 8)
    a = c.linear(x, "W", 8)
    c.bind(h, c.tanh(a + c.linear(h, "R", 8, heads=4) + c.linear(s, "V", 8)), name="h")     # reads s: not a cycle
    c.bind(s, c.tanh(c.linear(s, "U", 8) + a), name="s")
    c.output(c.bind(e, c.sigmoid(a) * e + c.tanh(a), name="e") + c.identity("h"), name="y")
    classes = build_schedule(c.build()).state_classes
    assert {k: (v.kind, v.heads) for k, v in classes.items()} == {
        "h": ("general", 4), "s": ("general", None), "e": ("linear_diagonal", None)}


def test_the_schedule_prints_and_dumps_the_heads(capsys):
    from rnngraph.lab.cli import main
    import json
    assert main(["schedule", "test_heads:head_cell", "--input-size", "6", "--hidden-size", "8"]) == 0
    assert ("    state h: general (its recurrence has head-wise linear ops only (head_linear3, head_linear5): "
            "4 heads, each a recurrence of its own)") in capsys.readouterr().out
    assert main(["schedule", "test_heads:head_cell", "--input-size", "6", "--hidden-size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state_classes"]["h"]["heads"] == 4
    assert main(["schedule", "lstm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state_classes"]["h"]["heads"] is None


# -- the GPU's kernels of the frame-by-frame loop ------------------------------------------------------
@pytest.mark.parametrize("cell", ["slstm", "mh_lstm"])
def test_the_head_wise_gemv_and_fused_kernel_reads_each_features_head(cell):
    """The Pair of the recurrent products and the gates: feature f reads W's row f (K/k entries) and x's columns
    of its head f / (H/k); the same source for full matrices reads all of x. Compiled by NVRTC in every type."""
    from nvrtc import nvrtc_compile
    from rnngraph import load_cell
    from rnngraph.plan.items import Pair
    from rnngraph.run.backends.cuda.fused import fused_forward_kernel
    from rnngraph.run.backends.cuda.pair import pair_kernel
    from rnngraph.run.backends.cuda.source import CTYPES
    for heads in (4, 1):
        c = load_cell(cell, 8, 16, heads=heads)
        (pair,) = build_schedule(c, loop="stages").forward[1].items[0].stages[0].items
        assert isinstance(pair, Pair) and pair.gemm.heads == heads
        spec = fused_forward_kernel(c, pair.fused.nodes)
        for ctype in CTYPES.values():
            name, src = pair_kernel(spec, pair.gemm, ctype)
            assert ("const int ha = (f / 4) * gK;" in src and "gA[b * glda + ha + k]" in src) == (heads == 4)
            nvrtc_compile(src, name)
