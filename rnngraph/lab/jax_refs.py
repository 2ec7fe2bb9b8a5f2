"""The JAX peer of `rnngraph bench`: linear-diagonal built-ins as `lax.associative_scan` under `jit`.

A researcher who writes minGRU, minLSTM or a QRNN in JAX computes the gates from x in one einsum, then
scans s_t = a_t ⊙ s_{t-1} + b_t over time with the combine (a1, b1) ∘ (a2, b2) = (a1·a2, a2·b1 + b2).
This module is that program, timed like every other implementation (JAX is imported only here).
"""
from __future__ import annotations

import numpy as np


def _min_gru(jnp, jax, u):            # u: [T, B, 2, H] -> (a, b, output from the states)
    z = jax.nn.sigmoid(u[:, :, 0])
    return 1 - z, z * u[:, :, 1], lambda s: s


def _min_lstm(jnp, jax, u):           # f' = f / (f + i), written as σ(log f − log i)
    f = jax.nn.sigmoid(jax.nn.softplus(-u[:, :, 1]) - jax.nn.softplus(-u[:, :, 0]))
    return f, (1 - f) * u[:, :, 2], lambda s: s


def _qrnn(jnp, jax, u):
    f, o = jax.nn.sigmoid(u[:, :, 1]), jax.nn.sigmoid(u[:, :, 2])
    return f, (1 - f) * jnp.tanh(u[:, :, 0]), lambda s: o * s


CELLS = {"min_gru": (2, _min_gru), "min_lstm": (3, _min_lstm), "qrnn": (3, _qrnn)}   # name -> (gates, rule)


def jax_problem() -> str | None:
    """None when jax imports, else why not."""
    try:
        import jax  # noqa: F401
    except Exception as e:
        return f"jax is not importable ({type(e).__name__}: {e})"
    return None


def jax_forward(name: str, H: int):
    """forward(p, x): y [T, B, H] of the built-in `name` from x [T, B, D], with p = {"W": [G·H, D], "b": [G·H]}
    laid out as rnngraph's weight_ih and bias_ih (gates stacked along rows); the state starts at zero."""
    import jax
    import jax.numpy as jnp
    gates, rule = CELLS[name]

    def forward(p, x):
        T, B = x.shape[:2]
        u = (jnp.einsum("tbd,gd->tbg", x, p["W"]) + p["b"]).reshape(T, B, gates, H)
        a, b, out = rule(jnp, jax, u)
        _, s = jax.lax.associative_scan(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), (a, b), axis=0)
        return out(s)
    return forward


def jax_fns(name: str, T: int, B: int, H: int, D: int, dtype: str, seed: int, tf32: bool):
    """({"forward": fn, "train": fn}, backend name, "gpu" | "cpu", extra fields) for the built-in `name`:
    forward under jit; a training step is jit(grad) of Σ y ⊙ gy with respect to the weights and x."""
    import jax
    import jax.numpy as jnp
    gates, forward = CELLS[name][0], jax_forward(name, H)
    rng = np.random.default_rng(seed)
    params = {"W": jnp.asarray(rng.uniform(-1, 1, (gates * H, D)) / np.sqrt(H), dtype=dtype),     # [G·H, D]
              "b": jnp.asarray(rng.uniform(-1, 1, (gates * H,)) / np.sqrt(H), dtype=dtype)}       # [G·H]
    x = jnp.asarray(rng.standard_normal((T, B, D)), dtype=dtype)                                  # [T, B, D]
    gy = jnp.asarray(rng.standard_normal((T, B, H)), dtype=dtype)                                 # [T, B, H]

    fwd = jax.jit(forward)
    step = jax.jit(jax.grad(lambda p, x: (forward(p, x) * gy).sum(), argnums=(0, 1)))
    precision = "default" if tf32 else "highest"

    def run(fn):
        with jax.default_matmul_precision(precision):
            jax.block_until_ready(fn(params, x))
    device = "gpu" if jax.devices()[0].platform == "gpu" else "cpu"
    return {"forward": lambda: run(fwd), "train": lambda: run(step)}, f"jax-{device}", device, \
        {"jax_matmul_precision": precision}
