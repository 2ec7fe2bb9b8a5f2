"""A new user's first hour with train, demo and sample (issue 10): no command replaces another run, Ctrl-C
says what was kept, progress shows without a terminal, and the hints fit the mistake."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.lab import demo as demo_module
from rnngraph.train.charlm import CharLM
from rnngraph.train.checkpoint import load_checkpoint, save_checkpoint
from rnngraph.lab.cli import main
from rnngraph.train.data import make_streams, read_text
from rnngraph.train.sample import generate, load_model
from rnngraph.train.loop import Trainer, TrainConfig, read_log, train

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(echo=lambda *a: None)
TINY = ["--hidden", "8", "--streams", "2", "--bptt", "4", "--backend", "numpy", "--no-progress"]


def tiny(small_text, out, **kw):
    return TrainConfig(**{**dict(text=str(small_text), hidden=8, streams=2, bptt=4, backend="numpy", progress=False,
                                 out=str(out)), **kw})


def one_line(capsys, argv, status, start):
    """Runs the CLI; asserts the exit status and one stderr line starting with `start`; returns that line."""
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith(start), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def files(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def run_id(folder):
    return load_checkpoint(Path(folder) / "checkpoint.npz").config["train"]["run_id"]


# -- item 1: no command replaces another run ----------------------------------------------------

def test_resume_into_another_runs_folder_is_refused_unless_overwrite(small_text, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny(small_text, a, max_steps=3), **QUIET)
    train(tiny(small_text, b, max_steps=5), **QUIET)
    before = files(b)
    err = one_line(capsys, ["train", "--resume", str(a / "checkpoint.npz"), "--out", str(b), "--max-steps", "6"],
                   2, f"rnngraph: error: {b / 'checkpoint.npz'} holds a checkpoint of another run ({run_id(b)} at "
                      f"step 5); resuming {a / 'checkpoint.npz'} ({run_id(a)} at step 3) would replace it")
    assert "--overwrite" in err
    assert files(b) == before                                   # checkpoint and both logs untouched
    assert main(["train", "--resume", str(a / "checkpoint.npz"), "--out", str(b), "--max-steps", "6",
                 "--overwrite"]) == 0
    assert run_id(b) == run_id(a) and load_checkpoint(b / "checkpoint.npz").config["step"] == 6
    assert json.loads((b / "log.json").read_text())["config"]["run_id"] == run_id(a)


def test_a_folder_with_only_another_runs_log_is_protected_too(small_text, tmp_path, capsys):
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    (tmp_path / "checkpoint.npz").unlink()
    log = (tmp_path / "log.json").read_bytes()
    one_line(capsys, ["train", "--text", str(small_text), *TINY, "--out", str(tmp_path)], 2,
             f"rnngraph: error: {tmp_path / 'log.json'} already holds the log; start a new run elsewhere")
    assert (tmp_path / "log.json").read_bytes() == log


def test_an_unreadable_checkpoint_is_replaced_only_with_overwrite(small_text, tmp_path, capsys):
    (tmp_path / "checkpoint.npz").write_bytes(b"not a zip")
    args = ["train", "--text", str(small_text), *TINY, "--out", str(tmp_path), "--max-steps", "1"]
    err = one_line(capsys, args, 2, f"rnngraph: error: {tmp_path / 'checkpoint.npz'} already holds a checkpoint")
    assert "replace it (a run whose file cannot be read) with --overwrite" in err
    assert (tmp_path / "checkpoint.npz").read_bytes() == b"not a zip"
    assert main(args + ["--overwrite"]) == 0 and run_id(tmp_path).startswith("run-")


def test_resume_into_its_own_folder_from_an_earlier_or_later_checkpoint(small_text, tmp_path, capsys):
    first = train(tiny(small_text, tmp_path, max_steps=3), **QUIET)
    ident = run_id(tmp_path)
    shutil.copy(first.checkpoint, tmp_path / "step3.npz")
    assert main(["train", "--resume", str(tmp_path / "checkpoint.npz"), "--max-steps", "6"]) == 0
    assert run_id(tmp_path) == ident                           # the id survives a resume
    assert main(["train", "--resume", str(tmp_path / "step3.npz"), "--max-steps", "5"]) == 0   # an earlier one
    assert run_id(tmp_path) == ident and read_log(tmp_path)["step"].tolist() == [1, 2, 3, 4, 5]
    assert "done: 5 steps" in capsys.readouterr().out


def test_a_checkpoint_from_before_run_ids_resumes_into_its_own_folder(small_text, tmp_path):
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    ckpt = load_checkpoint(tmp_path / "checkpoint.npz")
    del ckpt.config["train"]["run_id"]
    save_checkpoint(ckpt.path, {k: v for k, v in ckpt.config.items() if k not in ("format", "version")},
                    ckpt.arrays)
    assert train(tiny(small_text, tmp_path, max_steps=4), resume=ckpt.path, **QUIET).steps == 4
    with pytest.raises(RnnGraphError, match="already holds a checkpoint"):
        Trainer(tiny(small_text, tmp_path, max_steps=4), **QUIET)     # a new run still may not replace it


@pytest.fixture
def small_demo(monkeypatch):
    """demo --quick in about a second: a tinier model, validated on 4096 short streams."""
    monkeypatch.setitem(demo_module.__dict__, "QUICK", dict(hidden=8, streams=2, bptt=4, max_steps=3, sample=5))
    monkeypatch.setattr("rnngraph.train.loop.VAL_STREAMS", 4096)


def test_demo_refuses_a_training_runs_folder_but_replaces_its_own(small_text, tmp_path, capsys, small_demo):
    run, mine = tmp_path / "run", tmp_path / "demo"
    train(tiny(small_text, run, max_steps=4), **QUIET)
    before = files(run)
    err = one_line(capsys, ["demo", "--quick", "--backend", "numpy", "--out", str(run)], 2,
                   f"rnngraph: error: {run / 'checkpoint.npz'} holds a checkpoint of a training run "
                   f"({run_id(run)} at step 4), not of a demo")
    assert "--overwrite" in err and files(run) == before
    for _ in range(2):                                          # the second demo replaces the first
        assert main(["demo", "--quick", "--backend", "numpy", "--out", str(mine)]) == 0
        assert run_id(mine).startswith("demo-")
    assert main(["demo", "--quick", "--backend", "numpy", "--out", str(run), "--overwrite"]) == 0
    assert run_id(run).startswith("demo-")


# -- items 2 and 7: Ctrl-C says what was kept ----------------------------------------------------

def interrupt_at(monkeypatch, call):
    """Makes Trainer.train_step raise KeyboardInterrupt on its `call`-th call, as Ctrl-C would."""
    real, calls = Trainer.train_step, []

    def step(self):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(self)
    monkeypatch.setattr(Trainer, "train_step", step)


def test_ctrl_c_before_the_first_checkpoint_says_nothing_was_saved(small_text, tmp_path, capsys, monkeypatch):
    interrupt_at(monkeypatch, 3)
    args = ["train", "--text", str(small_text), *TINY, "--out", str(tmp_path / "q"), "--checkpoint-every", "100"]
    one_line(capsys, args, 130, "rnngraph: interrupted; nothing was saved yet (the first checkpoint comes at "
                                "step 100); run the same command again to start afresh")
    assert not (tmp_path / "q" / "checkpoint.npz").exists()
    monkeypatch.undo()
    assert main(args + ["--max-steps", "2"]) == 0               # and the same command does start afresh


def test_ctrl_c_after_a_checkpoint_names_it_and_the_command_to_continue(small_text, tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    interrupt_at(monkeypatch, 4)
    args = ["train", "--text", str(small_text), *TINY, "--out", str(a), "--checkpoint-every", "2"]
    err = one_line(capsys, args, 130, f"rnngraph: interrupted; checkpoint {a / 'checkpoint.npz'} holds step 2; "
                                      f"continue with rnngraph train --resume {a / 'checkpoint.npz'}\n")
    monkeypatch.undo()
    interrupt_at(monkeypatch, 1)                                # a resume into a new folder, stopped at once
    hint = err.split("continue with rnngraph ")[1].split()
    err = one_line(capsys, hint + ["--out", str(b)], 130,
                   f"rnngraph: interrupted; checkpoint {a / 'checkpoint.npz'} holds step 2; continue with "
                   f"rnngraph train --resume {a / 'checkpoint.npz'} --out {b}\n")
    monkeypatch.undo()
    assert main(err.split("continue with rnngraph ")[1].split() + ["--max-steps", "3"]) == 0
    assert load_checkpoint(b / "checkpoint.npz").config["step"] == 3


def test_sigint_to_a_piped_training_run(small_text, tmp_path):
    """A real Ctrl-C: the progress lines reach a pipe while the run goes on, and the end is one line, 130."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "rnngraph", "train", "--text", str(small_text), *TINY, "--out", "q",
                          "--progress-every", "0.05", "--epochs", "100", "--checkpoint-every", "100000"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("step "):
            line = p.stdout.readline()
            assert line or p.poll() is None, p.stderr.read()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert err == ("rnngraph: interrupted; nothing was saved yet (the first checkpoint comes at step 100000); "
                   "run the same command again to start afresh\n")
    assert line.startswith("step ") and "/142,400: loss " in line and " frames/s, " in line


def test_ctrl_c_in_sample_keeps_the_text_printed_so_far(small_text, tmp_path, capsys, monkeypatch):
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    real, calls = CharLM.step, []

    def step(self, *a, **kw):
        calls.append(1)
        if len(calls) == 7:                                     # a step after each character: 7 printed
            raise KeyboardInterrupt
        return real(self, *a, **kw)
    monkeypatch.setattr(CharLM, "step", step)
    assert main(["sample", str(tmp_path / "checkpoint.npz"), "--prime", "Ham", "--length", "40",
                 "--backend", "numpy"]) == 130
    out, err = capsys.readouterr()
    assert err == "rnngraph: interrupted; kept the 7 of --length 40 characters printed above\n"
    monkeypatch.undo()
    lm, vocab = load_model(tmp_path / "checkpoint.npz", "numpy")
    assert out == "Ham" + generate(lm, vocab, "Ham", 7, temperature=0.8) + "\n"


def test_ctrl_c_in_demo_names_what_its_folder_holds(tmp_path, capsys, monkeypatch, small_demo):
    out = tmp_path / "d"
    with monkeypatch.context() as m:
        m.setattr(demo_module, "train", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
        one_line(capsys, ["demo", "--quick", "--backend", "numpy", "--out", str(out)], 130,
                 f"rnngraph: interrupted; nothing was saved in {out}\n")
    monkeypatch.setattr("rnngraph.train.sample.generate", lambda *a, **kw: (_ for _ in ()).throw(KeyboardInterrupt))
    err = one_line(capsys, ["demo", "--quick", "--backend", "numpy", "--out", str(out)], 130, "rnngraph: interrupted")
    assert err == f"rnngraph: interrupted; kept {out / 'checkpoint.npz'} ({run_id(out)} at step 3)\n"


# -- item 3: progress without a terminal, and streamed samples -----------------------------------

def test_progress_lines_come_at_the_interval_when_the_bar_is_off(small_text, tmp_path, capsys):
    assert main(["train", "--text", str(small_text), *TINY, "--out", str(tmp_path / "a"), "--max-steps", "3",
                 "--progress-every", "0"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert [x.split(":")[0] for x in lines] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(" loss " in x and ", bpc " in x and " frames/s, " in x and x.endswith(" s") for x in lines)
    assert main(["train", "--text", str(small_text), *TINY, "--out", str(tmp_path / "b"), "--max-steps", "3"]) == 0
    assert "step 1/3" not in capsys.readouterr().out            # the default 10 s did not pass
    one_line(capsys, ["train", "--text", str(small_text), "--progress-every", "-1"], 2,
             "rnngraph: error: --progress-every must be a number of seconds >= 0, got -1.0")


def test_generate_hands_each_character_to_the_callback_as_it_is_drawn(small_text, tmp_path):
    train(tiny(small_text, tmp_path, max_steps=2), **QUIET)
    lm, vocab = load_model(tmp_path / "checkpoint.npz", "numpy")
    base, calls, seen = lm.__class__, [], []

    class Counting(base):
        def __call__(self, *a, **kw):
            calls.append(1)
            return base.__call__(self, *a, **kw)

        def step(self, *a, **kw):
            calls.append(1)
            return base.step(self, *a, **kw)
    lm.__class__ = Counting
    text = generate(lm, vocab, "Ham", 30, temperature=0.8, on_text=lambda ch: seen.append((ch, len(calls))))
    assert "".join(ch for ch, _ in seen) == text and len(text) == 30
    assert [n for _, n in seen] == list(range(1, 31))     # character i arrives after model call i (the prime, steps)


# -- item 4: a resume that has nothing left to train says so -------------------------------------

def test_resume_past_max_steps_or_the_last_epoch_says_nothing_was_trained(small_text, tmp_path, capsys):
    train(tiny(small_text, tmp_path / "a", max_steps=4), **QUIET)
    ckpt = tmp_path / "a" / "checkpoint.npz"
    before = files(tmp_path / "a")
    assert main(["train", "--resume", str(ckpt), "--max-steps", "2"]) == 0
    assert capsys.readouterr().out == (f"nothing trained: checkpoint {ckpt} is already at step 4 ≥ --max-steps 2; "
                                       "raise --max-steps to train further\n")
    assert files(tmp_path / "a") == before
    epoch = train(tiny(small_text, tmp_path / "e", streams=16, bptt=64, epochs=1), **QUIET)   # 11 steps per epoch
    assert epoch.steps == 11 and epoch.trained == 11
    assert main(["train", "--resume", str(epoch.checkpoint)]) == 0
    assert capsys.readouterr().out == (f"nothing trained: checkpoint {epoch.checkpoint} is already at step 11, "
                                       "the end of its --epochs 1 (11 steps each); raise --epochs to train further\n")
    assert train(tiny(small_text, tmp_path / "e", streams=16, bptt=64, epochs=1), resume=epoch.checkpoint,
                 **QUIET).trained == 0


# -- items 5 and 6: --out "" and hints that fit --------------------------------------------------

def test_an_empty_out_is_refused(small_text, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--text", str(small_text), *TINY, "--out", ""], ["demo", "--quick", "--out", " "]):
        one_line(capsys, argv, 2, "rnngraph: error: --out is empty; give the folder")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("encoding, name", [("utf-16", "utf-16"), ("utf-16-le", "utf-16le"),
                                            ("utf-16-be", "utf-16be"), ("utf-32", "utf-32")])
def test_utf16_and_utf32_texts_get_an_iconv_hint_for_their_encoding(encoding, name, tmp_path):
    path = tmp_path / "wide.txt"
    path.write_bytes("To be, or not to be.\n".encode(encoding) * 20)
    with pytest.raises(RnnGraphError, match=rf"is {name}, not UTF-8; convert it first, e.g. iconv -f {name} "
                                            rf"-t utf-8 {path} > wide-utf8.txt"):
        read_text(path)


def test_utf16_text_on_the_command_line(tmp_path, capsys):
    (tmp_path / "u.txt").write_bytes("naïve text\n".encode("utf-16") * 100)
    err = one_line(capsys, ["train", "--text", str(tmp_path / "u.txt"), "--out", str(tmp_path / "r")], 2,
                   f"rnngraph: error: text file {tmp_path / 'u.txt'} is utf-16, not UTF-8")
    assert "latin1" not in err


def test_too_many_streams_at_bptt_1_suggests_fewer_streams_not_a_smaller_bptt(small_text, tmp_path, capsys):
    with pytest.raises(RnnGraphError) as e:
        make_streams(np.arange(100), 60, 1)
    assert str(e.value).endswith("enough for at most 50 streams of --bptt 1 + 1 characters; use fewer --streams "
                                 "or a longer text")
    err = one_line(capsys, ["train", "--text", str(small_text), "--bptt", "1", "--streams", "10000", "--out",
                            str(tmp_path)], 2, "rnngraph: error: --streams 10000 is larger than the data allows")
    assert "fewer --streams or a longer text" in err and "smaller --bptt" not in err
    with pytest.raises(RnnGraphError, match="validation text is too short: it has 1 character.* use a larger "
                                            "--val-fraction or a longer text"):
        Trainer(tiny(small_text, tmp_path, bptt=1, val_fraction=1e-9), **QUIET)
