"""The catalogue of issue 27, "Nothing lost": each situation as a real `python -m rnngraph` process (small sizes,
seconds each), asserting its one line, its exit status and that nothing was lost: runs lock their folder and
their logs never tear, SIGTERM and SIGHUP end a run as Ctrl-C does, a closed pipe ends a command quietly, no
file is overwritten unasked, a diverged run is an error that keeps the last good checkpoint, and the hints
fit (a cell file, a binary text, a file as --out, a run folder as a checkpoint)."""
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.lab.cli import main
from rnngraph.lab.outputs import MANIFEST, write_text_output
from rnngraph.nn.optim import Adam
from rnngraph.train.checkpoint import load_checkpoint, save_checkpoint
from rnngraph.train.lock import LOCK_FILE, hold_folder
from rnngraph.train.logs import LOG_COLUMNS
from rnngraph.train.loop import DIVERGED, TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("train", "--text", "small.txt", "--hidden", "16", "--streams", "2", "--bptt", "8", "--no-progress",
         "--backend", "numpy")
LONG = (*TRAIN, "--epochs", "100", "--checkpoint-every", "20", "--progress-every", "0")    # stopped by the test
CELLS = '''from rnngraph.ir.cells import mgu as builtin


def mgu(input_size, hidden_size):
    return builtin(input_size, hidden_size)
'''


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A working folder: a small text, a cell file, a trained run `run`, an existing.json not rnngraph's."""
    from rnngraph.train.data import read_text
    d = tmp_path_factory.mktemp("lost")
    (d / "small.txt").write_text(read_text()[:6000])
    (d / "mycells.py").write_text(CELLS)
    (d / "existing.json").write_text('{"mine": true}\n')
    (d / "existing.txt").write_text("a file, not a folder\n")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert main([*TRAIN, "--out", "run", "--max-steps", "4"]) == 0
    finally:
        os.chdir(cwd)
    return d


@pytest.fixture
def work(template, tmp_path):
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    return tmp_path


def start(*args, cwd, stdout=subprocess.PIPE):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "rnngraph", *args], cwd=cwd, env=env, text=True, stdout=stdout,
                            stderr=subprocess.PIPE)


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def run(*args, cwd):
    return finish(start(*args, cwd=cwd))


def one_line(err: str, start: str, *fragments) -> str:
    assert err.startswith(start) and err.count("\n") == 1, f"stderr must be one line {start}...; got {err!r}"
    assert "Traceback" not in err and all(f in err for f in fragments), err
    return err.strip()


def log_steps(folder) -> list:
    """The steps of FOLDER/log.csv, asserting that every row is whole (every column, numbers)."""
    with open(Path(folder) / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(LOG_COLUMNS)
    for row in rows[1:]:
        assert len(row) == len(LOG_COLUMNS) and all(float(v) == float(v) for v in row if v), row
    return [int(r[0]) for r in rows[1:]]


def wait_for_steps(folder, n, p, timeout=60):
    """Waits until FOLDER/log.csv holds n rows (the process p still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        if (Path(folder) / "log.csv").exists() and len(log_steps(folder)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{folder}/log.csv did not reach {n} rows")


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- a run owns its folder -------------------------------------------------------------------------------

def test_two_runs_into_one_folder_one_refuses_and_the_survivors_log_is_whole(work):
    args = (*TRAIN, "--out", "race", "--max-steps", "400")
    first = start(*args, cwd=work)
    time.sleep(0.1)
    second = start(*args, cwd=work)
    results = {p.pid: finish(p) for p in (first, second)}
    assert sorted(rc for rc, _, _ in results.values()) == [0, 2], results
    (winner, (_, out, _)), (_, (_, _, err)) = sorted(results.items(), key=lambda kv: kv[1][0])
    # the loser met the lock (or, had the winner already finished, its checkpoint): one line either way
    one_line(err, "rnngraph: error: ")
    assert f"race is in use by pid {winner} on " in err or "race/checkpoint.npz already holds a checkpoint" in err
    assert "done: 400 steps" in out
    assert log_steps(work / "race") == list(range(1, 401))
    assert load_checkpoint(work / "race").config["step"] == 400
    assert not (work / "race" / LOCK_FILE).exists()


def test_resume_of_a_running_run_refuses_sigterm_ends_it_with_the_command_to_continue(work):
    p = start(*LONG, "--out", "live", cwd=work)
    wait_for_steps(work / "live", 25, p)                   # past its first checkpoint (step 20)
    rc, _, err = run("train", "--resume", "live", "--max-steps", "30", cwd=work)
    assert rc == 2
    one_line(err, "rnngraph: error: live is in use by pid ", f"pid {p.pid} on ", "rnngraph train --text small.txt",
             "; wait for it to end or stop it, or pass another --out")
    p.send_signal(signal.SIGTERM)
    rc, _, err = finish(p)
    assert rc == 143, err
    line = one_line(err, "rnngraph: stopped by SIGTERM; checkpoint live/checkpoint.npz holds step ",
                    "; continue with rnngraph train --resume live/checkpoint.npz")
    step = int(line.split("holds step ")[1].split(";")[0])
    assert step % 20 == 0 and step == load_checkpoint(work / "live").config["step"]
    command = line.split("continue with rnngraph ")[1].split()
    rc, out, err = run(*command, "--max-steps", str(step + 5), cwd=work)
    assert rc == 0 and err == "" and f"done: {step + 5} steps" in out
    assert log_steps(work / "live") == list(range(1, step + 6))


def test_a_signal_during_a_checkpoints_write_takes_effect_once_it_is_complete(tmp_path, monkeypatch):
    """An interrupt inside zipfile's writer could leave it unable to close (a ValueError, not the interrupt)."""
    real, writes = np.lib.format.write_array, []

    def write_array(*args, **kw):
        writes.append(1)
        if len(writes) == 2:
            os.kill(os.getpid(), signal.SIGTERM)                   # handled now, were it not held
        return real(*args, **kw)
    monkeypatch.setattr(np.lib.format, "write_array", write_array)
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path / "checkpoint.npz", {"step": 1}, {f"model/w{i}": np.ones(3) for i in range(4)})
    finally:
        signal.signal(signal.SIGTERM, old)
    assert len(writes) == 4 and sorted(load_checkpoint(tmp_path / "checkpoint.npz").arrays) == [
        f"model/w{i}" for i in range(4)]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.npz"]


def test_sighup_ends_a_run_as_ctrl_c_does(work):
    p = start(*LONG, "--out", "hup", cwd=work)
    wait_for_steps(work / "hup", 25, p)
    p.send_signal(signal.SIGHUP)
    rc, _, err = finish(p)
    assert rc == 129, err
    one_line(err, "rnngraph: stopped by SIGHUP; checkpoint hup/checkpoint.npz holds step ", "--resume")


def test_a_lock_left_by_a_killed_run_is_taken_by_the_next(work):
    p = start(*LONG, "--out", "killed", cwd=work)
    wait_for_steps(work / "killed", 25, p)
    p.kill()
    p.communicate()
    lock = work / "killed" / LOCK_FILE
    assert json.loads(lock.read_text())["pid"] == p.pid            # left behind, naming a process that is gone
    step = load_checkpoint(work / "killed").config["step"]
    rc, out, err = run("train", "--resume", "killed", "--max-steps", str(step + 3), cwd=work)
    assert rc == 0 and err == "" and f"done: {step + 3} steps" in out
    assert log_steps(work / "killed") == list(range(1, step + 4)) and not lock.exists()


def gloo() -> bool:
    try:
        import torch.distributed as td
    except ImportError:
        return False
    return td.is_available() and td.is_gloo_available()


@pytest.mark.skipif(not gloo(), reason="--procs needs torch.distributed with gloo")
def test_ranks_a_held_folder_is_refused_before_any_rank_starts_and_rank_0_holds_the_lock(work):
    hold = hold_folder(work / "held")                              # this process holds it
    try:
        rc, out, err = run(*TRAIN, "--out", "held", "--procs", "2", cwd=work)
    finally:
        hold.release()
    assert rc == 2 and out == ""
    one_line(err, f"rnngraph: error: held is in use by pid {os.getpid()} on ")
    launcher = start(*LONG, "--out", "ranks", "--procs", "2", cwd=work)
    wait_for_steps(work / "ranks", 25, launcher)
    holder = json.loads((work / "ranks" / LOCK_FILE).read_text())["pid"]
    assert holder != launcher.pid                                  # rank 0, the process that writes
    launcher.send_signal(signal.SIGTERM)
    rc, _, err = finish(launcher)
    assert rc == 143, err
    one_line(err, "rnngraph: stopped by SIGTERM; checkpoint ranks/checkpoint.npz holds step ",
             "; continue with rnngraph train --resume ranks/checkpoint.npz --procs 2")
    assert sorted(p.name for p in (work / "ranks").iterdir()) == ["checkpoint.npz", "log.csv", "log.json"]


# -- signals and pipes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("schedule", "lstm"), ("schedule", "lstm", "--json"), ("cells",), ("doctor",),
                                  ("sample", "run", "--length", "2000", "--backend", "numpy"),
                                  (*TRAIN, "--out", "piped", "--max-steps", "3"),
                                  pytest.param((*TRAIN, "--out", "piped", "--max-steps", "3", "--procs", "2"),
                                               marks=pytest.mark.skipif(not gloo(), reason="no gloo"))],
                         ids=lambda a: " ".join(a[:3]) + (" --procs" if "--procs" in a else ""))
def test_a_closed_pipe_ends_a_command_quietly_with_status_141(work, args):
    p = start(*args, cwd=work)
    p.stdout.close()                                               # the reader left (as `| head` does)
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == "", err


# -- nothing overwritten silently ---------------------------------------------------------------------

def test_bench_json_refuses_a_file_rnngraph_did_not_write_unless_overwrite(work):
    args = ("bench", "--quick", "--impls", "staged", "-H", "8", "--json", "existing.json")
    rc, out, err = run(*args, cwd=work)
    assert rc == 2 and out == ""
    one_line(err, "rnngraph: error: existing.json already exists and rnngraph did not write it", "--overwrite")
    assert (work / "existing.json").read_text() == '{"mine": true}\n'
    rc, _, err = run(*args, "--overwrite", cwd=work)
    assert rc == 0 and err == "rnngraph: wrote existing.json\n"
    assert "results" in json.loads((work / "existing.json").read_text())


def test_figures_go_to_the_working_directory_not_the_checkout(work):
    before = {p.name: digest(p) for p in (ROOT / "figures").iterdir()} if (ROOT / "figures").is_dir() else {}
    rc, out, err = run("figures", "--runs", "no_runs", cwd=work)
    assert rc == 0 and err == "", err
    assert out.splitlines()[0] == "wrote figures/single_stream_speedup.png"
    assert (work / "figures" / "headline.md").is_file()
    after = {p.name: digest(p) for p in (ROOT / "figures").iterdir()} if (ROOT / "figures").is_dir() else {}
    assert after == before


def test_an_output_rnngraph_wrote_is_replaced_a_changed_or_foreign_one_is_not(tmp_path):
    path = tmp_path / "out.md"
    write_text_output(path, "one\n")
    write_text_output(path, "two\n")                                # its own, unchanged: replaced silently
    assert path.read_text() == "two\n" and json.loads((tmp_path / MANIFEST).read_text()) == {"out.md": digest(path)}
    path.write_text("edited by hand\n")
    with pytest.raises(RnnGraphError, match="out.md already exists and rnngraph did not write it"):
        write_text_output(path, "three\n")
    assert path.read_text() == "edited by hand\n"
    write_text_output(path, "three\n", overwrite=True)
    assert path.read_text() == "three\n"


def test_schedule_draw_refuses_a_foreign_file_and_replaces_its_own(work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    (work / "mine.png").write_bytes(b"my picture")
    assert main(["schedule", "lstm", "--draw", "mine.png"]) == 2
    one_line(capsys.readouterr().err, "rnngraph: error: mine.png already exists and rnngraph did not write it")
    assert (work / "mine.png").read_bytes() == b"my picture"
    for _ in range(2):                                             # the second time over its own drawing
        assert main(["schedule", "lstm", "--draw", "lstm.png"]) == 0
        assert capsys.readouterr().err == "rnngraph: drew lstm.png\n"


# -- divergence is an error ---------------------------------------------------------------------------

def test_a_huge_learning_rate_without_clipping_is_a_divergence_error(work):
    rc, out, err = run(*TRAIN, "--out", "hot", "--lr", "1e6", "--clip", "0", cwd=work)
    assert rc == 2 and "done" not in out
    one_line(err, "rnngraph: error: the training loss diverged: ", f"more than {DIVERGED:g}× the ",
             "bpc of a uniform guess over 61 characters, at step 2 (epoch 1); stopped before updating the weights; "
             "no checkpoint was written yet; try a lower --lr or --clip")
    assert not (work / "hot" / "checkpoint.npz").exists()


def test_weights_that_diverge_on_a_checkpoint_step_do_not_replace_the_last_good_checkpoint(work, monkeypatch):
    real_step, calls = Adam.step, []

    def blow_up(self, grads):                                      # the 8th update (a checkpoint step) diverges
        real_step(self, grads)
        calls.append(1)
        if len(calls) == 8:
            for p in self.params.values():
                p *= 1e4
    monkeypatch.setattr(Adam, "step", blow_up)
    cfg = TrainConfig(text=str(work / "small.txt"), hidden=16, streams=2, bptt=8, backend="numpy", progress=False,
                      out=str(work / "cut"), checkpoint_every=4, max_steps=20)
    with pytest.raises(RnnGraphError) as e:
        train(cfg, echo=lambda *a: None)
    ckpt = work / "cut" / "checkpoint.npz"
    assert str(e.value).startswith("the loss of the weights about to be saved diverged: ")
    assert f"on the chunk just trained, from zero states; not saved; the last good checkpoint {ckpt} (step 4) is " \
           "intact" in str(e.value)
    assert load_checkpoint(ckpt).config["step"] == 4


# -- messages that help --------------------------------------------------------------------------------

def test_a_cell_given_as_a_file_path_absolute_or_relative(work):
    rc, out, err = run(*TRAIN, "--cell", f"{work / 'mycells.py'}:mgu", "--out", "mgu", "--max-steps", "2", cwd=work)
    assert rc == 0 and "done: 2 steps" in out, err
    assert load_checkpoint(work / "mgu").config["model"]["cell"] == f"{work / 'mycells.py'}:mgu"
    rc, out, _ = run("schedule", "./mycells.py:mgu", cwd=work)
    assert rc == 0 and out.startswith("schedule mgu")
    rc, _, err = run("schedule", "mycells.py:nope", cwd=work)
    assert rc == 2
    one_line(err, "rnngraph: error: file 'mycells.py' has no cell function 'nope'")


def test_a_binary_text_is_said_to_be_binary(work):
    rc, _, err = run(*TRAIN[:1], "--text", sys.executable, *TRAIN[3:], "--out", "bin", cwd=work)
    assert rc == 2 and not (work / "bin").exists()
    one_line(err, f"rnngraph: error: text file {sys.executable} is binary data, not text; give a UTF-8 text file")
    assert "iconv" not in err


def test_out_naming_an_existing_file_says_so(work):
    rc, _, err = run(*TRAIN, "--out", "existing.txt", cwd=work)
    assert rc == 2 and (work / "existing.txt").read_text() == "a file, not a folder\n"
    one_line(err, "rnngraph: error: --out existing.txt is a file, not a folder; give a folder for the checkpoint")


def test_a_run_folder_is_accepted_wherever_a_checkpoint_is(work):
    rc, out, err = run("sample", "run", "--length", "30", "--backend", "numpy", "--seed", "3", cwd=work)
    assert rc == 0 and err == ""
    rc, again, _ = run("sample", "run/checkpoint.npz", "--length", "30", "--backend", "numpy", "--seed", "3", cwd=work)
    assert rc == 0 and again == out and len(out) >= 30
    (work / "empty").mkdir()
    rc, _, err = run("sample", "empty", cwd=work)
    assert rc == 2
    one_line(err, "rnngraph: error: folder empty holds no checkpoint.npz; give a run folder")
