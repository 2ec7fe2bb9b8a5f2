"""Training a half-precision model on the CPU (train/mixed.py): float32 master weights, the recurrence in
bfloat16 or float16, loss scaling for float16 with skipped steps counted; it learns like float32, resumes
bit for bit, and samples from its checkpoint."""
import numpy as np
import pytest

from rnngraph.lab.cli import main
from rnngraph.train.loop import Trainer, train
from test_train import QUIET, tiny

pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_learns_like_float32(small_text, tmp_path, dtype):
    full = train(tiny(small_text, tmp_path / "f32", max_steps=60), **QUIET)
    half = train(tiny(small_text, tmp_path / dtype, max_steps=60, dtype=dtype), **QUIET)
    t = Trainer(tiny(small_text, tmp_path / "probe", dtype=dtype), **QUIET)
    assert t.lm.rnn.dtype.name == dtype and t.lm.dense.dtype.name == "float32"
    assert all(m.dtype == np.float32 for m in t.precision.masters.values())
    assert abs(half.val_bpc - full.val_bpc) < 0.1, (half.val_bpc, full.val_bpc)


def test_float16_skips_overflowing_steps_and_lowers_the_scale(small_text, tmp_path):
    t = Trainer(tiny(small_text, tmp_path, max_steps=6, dtype="float16"), echo=lambda *a: None)
    t.precision.scale = 2.0 ** 40                    # the first gradients overflow float16
    before = {k: m.copy() for k, m in t.precision.masters.items()}
    row = t.train_step()
    assert row["grad_norm"] == float("inf") and t.precision.skipped == 1 and t.precision.scale == 2.0 ** 39
    assert all(np.array_equal(before[k], m) for k, m in t.precision.masters.items())   # no update
    norms = [t.train_step()["grad_norm"] for _ in range(40)]
    assert np.isfinite(norms).sum() >= 10                    # scaled down far enough, it trains
    assert t.precision.skipped == 1 + norms.count(float("inf")) and t.precision.scale <= 2.0 ** 30


def test_half_resumes_bit_for_bit_and_samples(small_text, tmp_path):
    kw = dict(dtype="bfloat16", checkpoint_every=10)
    full = train(tiny(small_text, tmp_path / "full", max_steps=30, **kw), **QUIET)
    train(tiny(small_text, tmp_path / "cut", max_steps=12, **kw), **QUIET)
    resumed = train(tiny(small_text, tmp_path / "cut", max_steps=30, **kw), resume=tmp_path / "cut" / "checkpoint.npz",
                    **QUIET)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history]
    assert main(["sample", str(tmp_path / "full" / "checkpoint.npz"), "--length", "40", "--seed", "1"]) == 0
