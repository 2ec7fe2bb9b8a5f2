"""Probe: two `rnngraph train` runs started --gap seconds apart into one --out, --repeats times (issue 27's target).

Each repetition starts a tiny CPU run (H = 16, 2 streams, bptt 8, --steps steps, a 6,000-character text),
then, --gap seconds later, the same command into the same folder. Exactly one must refuse, in one line
(the folder is in use, or, had the first already finished, it holds its checkpoint), and every row of the
survivor's log.csv must parse with every step there, as its checkpoint says. It prints one line per
repetition and a summary; exit status 1 if any repetition lost something. A probe: it writes no results file.

    python experiments/two_runs_race.py [--repeats 20] [--gap 0.1] [--steps 400]
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout, installed or not


def race(folder: Path, gap: float, steps: int) -> str:
    """One repetition in `folder`; '' when nothing was lost, else what went wrong."""
    from rnngraph.train.checkpoint import load_checkpoint
    from rnngraph.train.logs import LOG_COLUMNS
    args = [sys.executable, "-m", "rnngraph", "train", "--text", "small.txt", "--hidden", "16", "--streams", "2",
            "--bptt", "8", "--no-progress", "--backend", "numpy", "--out", "race", "--max-steps", str(steps)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen(args, cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
    time.sleep(gap)
    procs.append(subprocess.Popen(args, cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    ends = [(p.pid, *p.communicate(timeout=300), p.returncode) for p in procs]
    codes = sorted(end[3] for end in ends)
    if codes != [0, 2]:
        return f"exit statuses {codes}, not one 0 and one 2"
    winner, loser = sorted(ends, key=lambda e: e[3])
    err = loser[2]
    if err.count("\n") != 1 or not (f"is in use by pid {winner[0]} " in err or "already holds a checkpoint" in err):
        return f"the refusal is not one line naming the holder: {err!r}"
    with open(folder / "race" / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    if rows[0] != list(LOG_COLUMNS) or any(len(r) != len(LOG_COLUMNS) for r in rows[1:]):
        return "a malformed row in log.csv"
    if [int(r[0]) for r in rows[1:]] != list(range(1, steps + 1)):
        return "steps missing from log.csv"
    if load_checkpoint(folder / "race").config["step"] != steps:
        return "the checkpoint is not at the last step"
    return "" if "in use" in err else "(the second run came after the first had finished)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.1, help="seconds between the two starts (default: 0.1)")
    ap.add_argument("--steps", type=int, default=400, help="training steps of each run (default: 400)")
    args = ap.parse_args(argv)
    from rnngraph.train.data import read_text
    lost = locked = 0
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="rnngraph-race-") as d:
            (Path(d) / "small.txt").write_text(read_text()[:6000])
            what = race(Path(d), args.gap, args.steps)
        bad = bool(what) and not what.startswith("(")
        lost += bad
        locked += not what
        print(f"{k + 1:2d}: {'LOST: ' + what if bad else 'ok ' + what}", flush=True)
    print(f"{args.repeats} repetitions, {args.gap} s apart: {args.repeats - lost} without loss ({locked} refused by "
          f"the lock, {args.repeats - lost - locked} by the finished run's checkpoint), {lost} lost something")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
