"""Issue 12: randomly generated linear-diagonal cells, h = a ⊙ h@t-d + b written in different algebraic forms.

Each seed draws a cell (input 3, hidden 4, one state h read d ∈ {1, 2, 3} frames back): a coefficient a
and an offset b, each a random state-free expression from a small menu, joined in one of the operand
orders of ORDERS (the gated form (1-z)⊙h + z⊙n and c.diag(h, "w") among them), with a random output
that reads h. The planner must classify h
as linear_diagonal and admit scan, elementwise and stages; 'scan' and 'elementwise' must then equal
'stages' in float64 (values, final states and every gradient; ragged lengths, and a run in chunks that
carries the state). Near misses - the same generator with a or b made to read the state through some
path, or an update that is not a ⊙ s + b - must not be linear_diagonal, and asking them for 'scan' is
one clear error."""
import numpy as np
import pytest

from rnngraph import Cell, RnnGraphError, build_schedule
from rnngraph.nn.recurrent import Recurrent
from test_classify import classes
from test_loops import agree, layers

D, H = 3, 4
SEEDS = range(40)
T = 15
ALL = ("scan", "elementwise", "stages")

# Operand orders of the update h = a ⊙ h@t-d + b, seed by seed in turn: (the product, b first in the add).
ORDERS = {
    "a*h + b": ("a*h", False),
    "h*a + b": ("h*a", False),
    "b + a*h": ("a*h", True),
    "b + h*a": ("h*a", True),
    "(1-z)*h + z*n": ("a*h", False),            # the gated form: a = 1 - z, b = z ⊙ n
    "diag(h, w) + b": ("diag", False),          # a a learned vector w, through c.diag(h, "w")
    "b + diag(h, w)": ("diag", True),
}
# Not generated: forms that are mathematically a ⊙ h@t-d + b with a, b state-free, but that the classifier
# does not recognise (it looks for exactly p = m + b, m = a ⊙ p@t-d: one add and one product on the
# recurrence). Each is classified 'elementwise' today (admits elementwise, stages; not scan):
#   a*h - b (a sub)                    0.5*h + b (a scale, no product)      h + b (a = 1: no product)
#   -(a*h) + b (a scale on the cycle)  (a*h + b) + b2, b + (a*h + b2)       a*(h + b) (product outside the add)
#   a1*(a2*h) + b, diag(h, w)*a + b (two products on the cycle)             a*identity(h) + b
#   identity(a*h + b)                  h + z*(n - h), h - z*h + z*n (the gated form written otherwise)
#   a*h (b = 0: no add)

# Ways to spoil a linear form (near misses), with the class h must get instead.
SPOIL_A = {   # a reads the state
    "a ⊙ σ(u ⊙ h@t-k)": "elementwise",
    "a ⊙ σ(U·h@t-k)": "general",
}
SPOIL_B = {   # b reads the state
    "b ⊙ tanh(h@t-k)": "elementwise",
    "b + v ⊙ h@t-k, k ≠ d": "elementwise",   # a second-order linear recurrence: not a ⊙ s + b
    "b + V·h@t-k": "general",
    "b from another state g": "elementwise",  # g = tanh(Wx + U·g@t-1) (general) is state-dependent
}
SPOIL_UPDATE = {   # the update is not a ⊙ s + b
    "a ⊙ h ⊙ h + b": "elementwise",
    "a ⊙ tanh(h) + b": "elementwise",
    "tanh(a ⊙ h + b)": "elementwise",
    "a ⊙ relu(h) + b": "elementwise",
}
SPOILS = {**SPOIL_A, **SPOIL_B, **SPOIL_UPDATE}


class Gen:
    """Draws the pieces of one cell from rng; every parameter gets its own name."""

    def __init__(self, rng, c, x):
        self.rng, self.c, self.x, self.k = rng, c, x, 0
        self.shared = None if rng.random() < 0.5 else 0     # slices of one shared projection, or linears
        self.log = []

    def name(self, stem):
        self.k += 1
        return f"{stem}{self.k}"

    def pick(self, menu):
        key = list(menu)[self.rng.integers(len(menu))]
        self.log.append(key)
        return key, menu[key]

    def pre(self):
        """A fresh state-free pre-activation [H]: W·x (+ bias), or the next slice of one projection."""
        c = self.c
        if self.shared is not None:
            if self.shared == 0:
                self.proj = c.linear(self.x, "W_shared", 8 * H, bias="b_shared")
            self.shared += 1
            return c.slice(self.proj, (self.shared - 1) * H, self.shared * H)
        bias = self.name("b") if self.rng.random() < 0.5 else None
        return c.linear(self.x, self.name("W"), H, bias=bias)

    def coefficient(self, vector=True):
        """a (or the gate z), state-free; a learned vector too where `vector` (not for z: the cell
        graph rejects 1 - w, an op that reads only parameters)."""
        c = self.c
        menu = {
            "σ(Wx)": lambda: c.sigmoid(self.pre()),
            "1 - σ(Wx)": lambda: 1 - c.sigmoid(self.pre()),
            "σ(Wx) ⊙ σ(Vx)": lambda: c.sigmoid(self.pre()) * c.sigmoid(self.pre()),
            "σ(Wx) / 2": lambda: c.sigmoid(self.pre()) * 0.5,
            "tanh(Wx)": lambda: c.tanh(self.pre()),
            "σ(W·tanh(Vx))": lambda: c.sigmoid(c.linear(c.tanh(self.pre()), self.name("W"), H)),
            "w (learned vector)": lambda: "w",          # a parameter node (made below)
        }
        if not vector:
            del menu["w (learned vector)"]
        return self.pick(menu)[1]()

    def offset(self, constant=True):
        """b (or the candidate n), state-free; a learned vector too where `constant` (not where a is one,
        which would leave the cell without a path from its input)."""
        c = self.c
        menu = {
            "tanh(Wx)": lambda: c.tanh(self.pre()),
            "Wx": lambda: self.pre(),
            "σ(Wx) ⊙ tanh(Vx)": lambda: c.sigmoid(self.pre()) * c.tanh(self.pre()),
            "relu(Wx)": lambda: c.relu(self.pre()),
            "softplus(Wx)": lambda: c.apply("softplus", self.pre()),
            "v ⊙ tanh(Wx)": lambda: c.diag(c.tanh(self.pre()), self.name("v")),
            "Wx - Vx": lambda: self.pre() - self.pre(),
            "tanh(Wx) + c": lambda: c.bias(c.tanh(self.pre()), self.name("c")),
            "c (learned vector)": lambda: c.param(self.name("c"), (H,)),
        }
        if not constant:
            del menu["c (learned vector)"]
        return self.pick(menu)[1]()


def random_cell(seed, spoil=None):
    """(cell, d, names of a, b and the product, description): a random linear-diagonal cell, or with
    `spoil` one of SPOILS applied to it."""
    rng = np.random.default_rng(seed)
    c = Cell(f"random{seed}")
    x, h = c.input("x", D), c.state("h", H)
    g = Gen(rng, c, x)
    d = int(rng.integers(1, 4))
    k = int(rng.integers(1, 4))                # the delay at which a spoiler reads h (d too)
    k2 = d % 3 + 1                             # one that is not d
    hd = h.ago(d)
    if spoil == "b from another state g":
        gs = c.state("g", H)
        c.bind(gs, c.tanh(g.pre() + c.linear(gs, "U_g", H)), name="g")

    def spoil_a(a):
        if spoil == "a ⊙ σ(u ⊙ h@t-k)":
            return a * c.sigmoid(c.diag(h.ago(k), "u_spoil"))
        if spoil == "a ⊙ σ(U·h@t-k)":
            return a * c.sigmoid(c.linear(h.ago(k), "U_spoil", H))
        return a

    def spoil_b(b):
        if spoil == "b ⊙ tanh(h@t-k)":
            return b * c.tanh(h.ago(k))
        if spoil == "b + v ⊙ h@t-k, k ≠ d":
            return b + c.diag(h.ago(k2), "v_spoil")
        if spoil == "b + V·h@t-k":
            return b + c.linear(h.ago(k), "V_spoil", H)
        if spoil == "b from another state g":
            return b * c.sigmoid(c.diag("g", "u_g"))
        return b

    hs = {"a ⊙ h ⊙ h + b": lambda: hd * hd, "a ⊙ tanh(h) + b": lambda: c.tanh(hd),
          "a ⊙ relu(h) + b": lambda: c.relu(hd)}.get(spoil, lambda: hd)()
    order = list(ORDERS)[seed % len(ORDERS)]
    g.log.insert(0, order)
    product, b_first = ORDERS[order]
    if product == "diag" and spoil in SPOIL_A:     # a spoilt a is no parameter: written w ⊙ σ(..) ⊙ h
        product, a = "a*h", "w"
        g.log[0] += " (as (w ⊙ σ(..)) ⊙ h)"
    elif product == "diag":
        a = None
    else:
        a = g.coefficient(vector=order != "(1-z)*h + z*n")
    if order == "(1-z)*h + z*n":
        a, b = 1 - a, a * g.offset()
    else:
        b = g.offset(constant=a not in ("w", None))
    if a is not None:
        a = spoil_a(c.param(g.name("w"), (H,)) if a == "w" else a)
    b = spoil_b(b)
    m = c.diag(hs, g.name("w")) if product == "diag" else a * hs if product == "a*h" else hs * a
    update = b + m if b_first else m + b
    if spoil == "tanh(a ⊙ h + b)":
        update = c.tanh(update)
    hn = c.bind(h, update, name="h")
    out = g.pick({"h": lambda: hn,
                  "tanh(h) ⊙ σ(Wx)": lambda: c.tanh(hn) * c.sigmoid(g.pre()),
                  "w ⊙ h + Wx": lambda: c.diag(hn, "w_out") + g.pre(),
                  "h + h@t-1": lambda: hn + h.ago(1)})[1]()
    c.output(out)
    names = (a.name if a is not None else None, b.name, m.name)
    spoilt = f" | spoilt: {spoil} (k={k2 if 'k ≠ d' in spoil else k})" if spoil else ""
    return c.build(), d, names, " | ".join(g.log) + f" | d={d}" + spoilt


@pytest.mark.parametrize("seed", SEEDS)
def test_random_linear_forms_are_classified_and_every_loop_agrees(seed):
    cell, d, (a, b, m), what = random_cell(seed)
    sched = build_schedule(cell)
    sc = sched.state_classes["h"]
    assert (sc.kind, sc.delay) == ("linear_diagonal", d), (what, sc.why)
    assert (sc.m, sc.b) == (m, b), what
    assert sc.a == a if a else sc.a in cell.params, what       # a is None: h ⊙ w written with c.diag
    assert sched.loop_strategies == ALL and sched.loop_strategy == "scan", what
    x = np.random.default_rng(100 + seed).standard_normal((T, 3, D))
    for loop in ("scan", "elementwise"):
        ref, other = layers(cell, loop, D)
        agree(ref, other, [x], np.array([T, T - 5, 2]), loop)
        agree(ref, other, [x[:4], x[4:6], x[6:7], x[7:]], None, loop)     # chunks shorter than d too


def test_the_generator_covers_every_menu_item():
    seen = set()
    for seed in SEEDS:
        seen.update(random_cell(seed)[3].split(" | "))
    menus = [*ORDERS, "σ(Wx)", "1 - σ(Wx)", "σ(Wx) ⊙ σ(Vx)", "σ(Wx) / 2", "tanh(Wx)", "σ(W·tanh(Vx))",
             "w (learned vector)", "Wx", "σ(Wx) ⊙ tanh(Vx)", "relu(Wx)", "softplus(Wx)", "v ⊙ tanh(Wx)",
             "Wx - Vx", "tanh(Wx) + c", "c (learned vector)",
             "h", "tanh(h) ⊙ σ(Wx)", "w ⊙ h + Wx", "h + h@t-1", "d=1", "d=2", "d=3"]
    assert not set(menus) - seen, set(menus) - seen


NEAR = [(s, 4 * i + j) for i, s in enumerate(SPOILS) for j in range(4)]     # 4 bases each, all different


@pytest.mark.parametrize("spoil, seed", NEAR, ids=[f"{s}-{seed}" for s, seed in NEAR])
def test_near_misses_are_not_linear_diagonal(spoil, seed):
    cell, _, _, what = random_cell(seed, spoil)
    kinds = classes(cell)
    assert kinds["h"] == SPOILS[spoil], (what, kinds)
    admits = (("elementwise",) if set(kinds.values()) == {"elementwise"} else ()) + \
        (("persistent",) if "general" in kinds.values() else ()) + ("stages",)     # a general state: persistent too
    assert build_schedule(cell).loop_strategies == admits, what
    with pytest.raises(RnnGraphError, match="does not admit loop strategy 'scan'"):
        build_schedule(cell, loop="scan")
    with pytest.raises(RnnGraphError, match="does not admit loop strategy 'scan'"):
        Recurrent(cell, D, H, loop="scan")
    if "elementwise" in admits:         # and it runs: elementwise equals stages
        ref, other = layers(cell, "elementwise", D)
        x = np.random.default_rng(200 + seed).standard_normal((9, 3, D))
        agree(ref, other, [x], np.array([9, 4, 1]), "elementwise")
