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
