"""Training end to end on the CPU: it learns, resumes bit-exactly, samples, draws its curves, runs the demo,
and every bad input is one clear error (exit status 2, one line)."""
import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.train.charlm import CharLM
from rnngraph.lab.cli import main
from rnngraph.nn.optim import Adam
from rnngraph.train.loop import Trainer, TrainConfig, read_log, train
from rnngraph.lab.curves import draw_training_curves

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(echo=lambda *a: None)


def tiny(small_text, out, **kw):
    """A model and run small enough for seconds: H=32, 4 streams, chunks of 16 frames."""
    base = dict(text=str(small_text), hidden=32, streams=4, bptt=16, epochs=1, lr=1e-2, backend="numpy",
                progress=False, out=str(out))
    return TrainConfig(**{**base, **kw})


def one_line_error(capsys, argv, start):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rnngraph: error: {start}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_tiny_run_lowers_validation_bpc(small_text, tmp_path):
    t = Trainer(tiny(small_text, tmp_path, max_steps=60), **QUIET)
    before = t.validate()
    result = t.run()
    assert before > 5.5                                      # about log2(vocabulary) untrained
    assert result.val_bpc < before - 1.0, (before, result.val_bpc)
    assert result.steps == 60 and len(result.history) == 60
    rows = read_log(tmp_path / "log.csv")
    assert rows["step"].tolist() == list(range(1, 61))
    assert rows["val_bpc"][-1] == pytest.approx(result.val_bpc)
    assert np.array_equal(rows["loss"], read_log(tmp_path / "log.json")["loss"])
    assert all(np.isclose(rows["bpc"], rows["loss"] / math.log(2)))


def test_resume_repeats_the_uninterrupted_run_bit_for_bit(small_text, tmp_path):
    kw = dict(layers=2, dropout=0.1, streams=8, epochs=2, checkpoint_every=25)   # dropout draws random masks
    full = train(tiny(small_text, tmp_path / "full", **kw), **QUIET)
    assert full.steps == 178                                 # two epochs of 89 chunks: states reset at 89
    train(tiny(small_text, tmp_path / "cut", **{**kw, "max_steps": 70}), **QUIET)
    resumed = train(tiny(small_text, tmp_path / "cut", **kw), resume=tmp_path / "cut" / "checkpoint.npz", **QUIET)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history]
    assert [r["grad_norm"] for r in resumed.history] == [r["grad_norm"] for r in full.history]
    assert np.array_equal(read_log(tmp_path / "cut")["loss"], read_log(tmp_path / "full")["loss"])
    assert resumed.val_bpc == full.val_bpc


@pytest.mark.gpu
def test_resume_on_the_gpu_repeats_the_uninterrupted_run(small_text, tmp_path):
    kw = dict(layers=2, dropout=0.1, streams=8, max_steps=40, backend="cupy", mode="graph", dtype="float64")
    full = train(tiny(small_text, tmp_path / "full", **kw), **QUIET)
    train(tiny(small_text, tmp_path / "cut", **{**kw, "max_steps": 15}), **QUIET)
    resumed = train(tiny(small_text, tmp_path / "cut", **kw), resume=tmp_path / "cut" / "checkpoint.npz", **QUIET)
    assert resumed.backend == "cupy" and resumed.steps == 40
    # float64; not bit for bit: vector-parameter gradients are summed with atomicAdd, in a varying order
    np.testing.assert_allclose([r["loss"] for r in resumed.history], [r["loss"] for r in full.history], rtol=1e-10)
    np.testing.assert_allclose(resumed.val_bpc, full.val_bpc, rtol=1e-10)


def test_resume_from_the_command_line_takes_the_checkpoints_settings(small_text, tmp_path, capsys):
    args = ["train", "--text", str(small_text), "--hidden", "32", "--streams", "4", "--bptt", "16",
            "--backend", "numpy", "--out", str(tmp_path), "--no-progress"]
    assert main(args + ["--max-steps", "5"]) == 0
    assert main(["train", "--resume", str(tmp_path / "checkpoint.npz"), "--max-steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "done: 8 steps on numpy" in out
    assert read_log(tmp_path)["step"].tolist() == list(range(1, 9))


def test_a_new_run_does_not_replace_an_existing_checkpoint(small_text, tmp_path, capsys):
    args = ["train", "--text", str(small_text), "--hidden", "16", "--bptt", "16", "--backend", "numpy",
            "--max-steps", "2", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    before = (tmp_path / "checkpoint.npz").read_bytes()
    one_line_error(capsys, args + ["--seed", "1"], f"{tmp_path / 'checkpoint.npz'} already holds a checkpoint; "
                   f"continue it with --resume {tmp_path / 'checkpoint.npz'}, start a new run elsewhere")
    assert (tmp_path / "checkpoint.npz").read_bytes() == before
    assert main(args + ["--seed", "1", "--overwrite"]) == 0
    assert (tmp_path / "checkpoint.npz").read_bytes() != before


def test_resume_with_a_different_model_or_text_is_refused(small_text, tmp_path, capsys):
    train(tiny(small_text, tmp_path, max_steps=3), **QUIET)
    ckpt = str(tmp_path / "checkpoint.npz")
    before = Path(ckpt).read_bytes()
    one_line_error(capsys, ["train", "--resume", ckpt, "--hidden", "64", "--cell", "gru"],
                   f"checkpoint {ckpt} does not match the requested model: --cell gru (the checkpoint has "
                   "lstm); --hidden 64 (the checkpoint has 32); drop these options")
    other = tmp_path / "other.txt"
    other.write_text(small_text.read_text().upper())
    one_line_error(capsys, ["train", "--resume", ckpt, "--text", str(other)],
                   f"the text {other} differs from the one checkpoint {ckpt} was trained on")
    assert Path(ckpt).read_bytes() == before


def test_missing_truncated_and_corrupt_checkpoints_exit_2(small_text, tmp_path, capsys):
    one_line_error(capsys, ["train", "--resume", str(tmp_path / "none.npz")], "checkpoint")
    one_line_error(capsys, ["sample", str(tmp_path / "none.npz")], f"checkpoint {tmp_path / 'none.npz'} not found")
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    ckpt = tmp_path / "checkpoint.npz"
    ckpt.write_bytes(ckpt.read_bytes()[:5000])
    for cmd in (["train", "--resume", str(ckpt)], ["sample", str(ckpt)]):
        one_line_error(capsys, cmd, f"checkpoint {ckpt} is truncated or corrupt")


def test_weights_that_do_not_fit_the_config_are_refused(small_text, tmp_path, capsys):
    from rnngraph import load_cell
    from rnngraph.train import checkpoint as ck
    from rnngraph.ir.cellio import cell_to_dict
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    got = ck.load_checkpoint(tmp_path / "checkpoint.npz")
    model = got.config["model"]                             # a config edited by hand: the cell it stores is bigger
    model["hidden"], model["graphs"] = 48, [cell_to_dict(load_cell("lstm", model["vocab_size"], 48))]
    ck.save_checkpoint(tmp_path / "edited.npz", {k: v for k, v in got.config.items()
                                                  if k not in ("format", "version")}, got.arrays)
    err = one_line_error(capsys, ["sample", str(tmp_path / "edited.npz")],
                         f"checkpoint {tmp_path / 'edited.npz'} does not match its own model config: ")
    assert "0.weight_hh_l0" in err and "48" in err


def test_nan_loss_stops_naming_the_step_and_keeps_the_checkpoint(small_text, tmp_path, monkeypatch):
    real_step, calls = Adam.step, []

    def poisoned(self, grads):                              # the 5th update leaves an inf weight behind
        real_step(self, grads)
        calls.append(1)
        if len(calls) == 5:
            next(iter(self.params.values()))[0, 0] = np.inf

    monkeypatch.setattr(Adam, "step", poisoned)
    cfg = tiny(small_text, tmp_path, checkpoint_every=4, max_steps=20)
    with pytest.raises(RnnGraphError) as e:
        train(cfg, **QUIET)
    ckpt = tmp_path / "checkpoint.npz"
    assert str(e.value).startswith("the training loss is nan at step 6 (epoch 1); stopped before updating "
                                   f"the weights; the last good checkpoint {ckpt} (step 4) is intact")
    monkeypatch.undo()
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    resumed = train(tiny(small_text, tmp_path, checkpoint_every=4, max_steps=6), resume=ckpt, **QUIET)
    assert resumed.steps == 6 and digest != hashlib.sha256(ckpt.read_bytes()).hexdigest()


def test_huge_learning_rate_exits_2_naming_the_step(small_text, tmp_path, capsys):
    err = one_line_error(capsys, ["train", "--text", str(small_text), "--hidden", "32", "--streams", "4",
                                  "--bptt", "16", "--optimizer", "sgd", "--lr", "1e40", "--clip", "0",
                                  "--backend", "numpy", "--out", str(tmp_path)], "the ")
    assert " at step 2 (epoch 1); stopped before updating the weights; no checkpoint was written yet" in err


@pytest.mark.parametrize("option, value, message", [
    ("--bptt", "20000", "--bptt 20000 is larger than the data allows: the training text has 11400 characters"),
    ("--streams", "5000", "--streams 5000 is larger than the data allows: the training text has 11400 "
                          "characters, enough for at most 345 streams of --bptt 32 + 1"),
    ("--cell", "no_such_cell", "unknown cell 'no_such_cell'; built-in cells: lstm"),
    ("--dropout", "1.5", "--dropout must lie in [0, 1), got 1.5"),
])
def test_bad_options_exit_2(option, value, message, small_text, tmp_path, capsys):
    one_line_error(capsys, ["train", "--text", str(small_text), option, value, "--out", str(tmp_path)], message)


def test_empty_and_non_utf8_text_exit_2(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    one_line_error(capsys, ["train", "--text", str(tmp_path / "empty.txt")], "text file")
    one_line_error(capsys, ["train", "--text", str(tmp_path / "latin.txt")],
                   f"text file {tmp_path / 'latin.txt'} is not UTF-8: byte 0xe9 at offset 3 (line 1)")


def test_user_cell_that_fails_to_import_shows_its_own_error(small_text, tmp_path):
    (tmp_path / "brokencell.py").write_text("import numpy\nfrom numpy import no_such_thing\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "rnngraph", "train", "--cell", "brokencell:cell", "--text",
                        str(small_text)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("rnngraph: error: cannot import cell module 'brokencell': ImportError: cannot import "
                        "name 'no_such_thing' from 'numpy' (" + r.stderr.split("from 'numpy' (")[1])
    assert r.stderr.count("\n") == 1


def test_user_cell_trains(small_text, tmp_path, monkeypatch):
    (tmp_path / "mycell.py").write_text(
        "from rnngraph import Cell\n\n"
        "def elman(input_size, hidden_size):\n"
        "    c = Cell('elman')\n"
        "    x, h = c.input('x', input_size), c.state('h', hidden_size)\n"
        "    c.output(c.bind(h, c.tanh(c.linear(x, 'W', hidden_size) + c.linear(h, 'U', hidden_size)), name='h'))\n"
        "    return c.build()\n")
    monkeypatch.chdir(tmp_path)
    result = train(tiny(small_text, tmp_path / "run", cell="mycell:elman", max_steps=3), **QUIET)
    assert result.steps == 3 and math.isfinite(result.history[-1]["loss"])


def test_progress_bar_shows_loss_bpc_and_frames_per_second(small_text, tmp_path, capsys):
    train(tiny(small_text, tmp_path, max_steps=3, progress=True), **QUIET)
    err = capsys.readouterr().err
    assert "loss=" in err and "bpc=" in err and "frames/s=" in err


def test_sample_command_is_deterministic_and_checks_the_prime(small_text, tmp_path, capsys):
    train(tiny(small_text, tmp_path, max_steps=5), **QUIET)
    ckpt = str(tmp_path / "checkpoint.npz")
    outs = []
    for _ in range(2):
        assert main(["sample", ckpt, "--prime", "Ham", "--length", "40", "--backend", "numpy"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("Ham") and len(outs[0]) == 3 + 40 + 1
    assert main(["sample", ckpt, "--length", "20", "--temperature", "0", "--backend", "numpy"]) == 0
    assert len(capsys.readouterr().out) == 21
    one_line_error(capsys, ["sample", ckpt, "--prime", "Ωmega"], "characters 'Ω' are not in the model's vocabulary")


def test_training_curves_figure(small_text, tmp_path):
    for name, lr in (("a", 1e-2), ("b", 3e-3)):
        train(tiny(small_text, tmp_path / name, lr=lr, max_steps=20), **QUIET)
    out = draw_training_curves([tmp_path / "a", tmp_path / "b" / "log.json"], tmp_path / "fig" / "curves.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    with pytest.raises(RnnGraphError, match="cannot read training log"):
        draw_training_curves([tmp_path / "missing"], tmp_path / "x.png")


def test_demo_quick(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quick", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "running on the CPU (numpy backend)" in out
    assert "schedule lstm" in out and "kernels per frame" in out
    assert "3. A sample" in out and "validation bpc" in out
    assert (tmp_path / "rnngraph-demo" / "training_curve.png").stat().st_size > 10_000
    assert (tmp_path / "rnngraph-demo" / "checkpoint.npz").is_file()


def test_charlm_dropout_draws_from_its_saved_generator():
    lm = CharLM({"cell": "lstm", "layers": 2, "hidden": 8, "dropout": 0.5, "dtype": "float32", "vocab_size": 6,
                 "seed": 0}, "numpy")
    ids = np.zeros((4, 3), dtype=np.int32)
    saved = lm.rng_states()
    first = lm(ids)[0]
    lm.set_rng_states(saved)
    assert np.array_equal(lm(ids)[0], first)
    assert not np.array_equal(lm(ids)[0], first)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["staged", "graph"])
def test_gpu_training_follows_the_cpu_run(small_text, tmp_path, mode):
    runs = {}
    for backend, m in (("numpy", "staged"), ("cupy", mode)):
        cfg = tiny(small_text, tmp_path / backend, backend=backend, mode=m, dtype="float64", layers=2, max_steps=12,
                   dropout=0.3)         # the same generator state gives the same masks on both backends
        runs[backend] = train(cfg, **QUIET)
    assert runs["cupy"].backend == "cupy"
    np.testing.assert_allclose([r["loss"] for r in runs["cupy"].history],
                               [r["loss"] for r in runs["numpy"].history], rtol=1e-7)
    from rnngraph.train.sample import generate, load_model
    lm, vocab = load_model(runs["cupy"].checkpoint, "cupy", mode)
    assert len(generate(lm, vocab, "Ham", 30)) == 30
