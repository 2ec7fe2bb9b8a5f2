"""The stored results as `rnngraph report` reads them (bench, experiment and training-run files, each with
where it came from), and the formatting its tables share: times, ratios, Markdown tables, source lines."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RnnGraphError
from .experiments import REPO, load_results


def rel(path: Path) -> str:
    """A path as the pages name it: from the repository root (absolute outside it)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# -- the stored results ---------------------------------------------------------------------------

class Results:
    """The files under one results folder, each read once: bench documents (bench/NAME.json), experiment
    documents (NAME.json) and the stored training runs (training_runs.json and the logs it names)."""

    def __init__(self, root):
        self.root = Path(root).resolve()
        self._docs: dict = {}

    def bench(self, name: str) -> dict:
        """bench/NAME.json as `rnngraph bench --json` writes it (machine with the command, settings, results)."""
        path = self.root / "bench" / f"{name}.json"
        if path not in self._docs:
            doc = self._json(path)
            missing = [k for k in ("machine", "settings", "results") if k not in doc]
            if missing or not {"command", "date"} <= set(doc["machine"]):
                raise RnnGraphError(f"{path} is not a bench result: it lacks {', '.join(missing) or 'a command or date'}")
            self._docs[path] = dict(doc, path=path, records=doc["results"], metadata=doc["machine"])
        return self._docs[path]

    def experiment(self, name: str) -> dict:
        path = self.root / f"{name}.json"
        if path not in self._docs:
            self._docs[path] = dict(load_results(path), path=path)
        return self._docs[path]

    def training(self) -> dict:
        """name -> a stored run of training_runs.json, with `path` (its log) and, for a training log, `log`."""
        from ..train.logs import read_log
        path = self.root / "training_runs.json"
        if path not in self._docs:
            runs = {}
            for run in self._json(path)["runs"]:
                log = self.root / run["folder"] / run["log"]
                if not log.is_file():
                    raise RnnGraphError(f"{path} names {log}, which does not exist")
                runs[run["name"]] = dict(run, path=log, **({"log": read_log(log)} if log.suffix != ".txt" else {}))
            self._docs[path] = runs
        return self._docs[path]

    def _json(self, path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except OSError as e:
            raise RnnGraphError(f"cannot read {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise RnnGraphError(f"{path} is not JSON: {e}") from None


def loop(r: dict) -> str | None:
    """The loop strategy an rnngraph record ran, or was asked for where it was skipped (records that name
    neither ran `stages`, as every loop did before there were others); None for a peer."""
    if r["impl"].partition("@")[0] not in ("naive", "staged", "graph"):
        return None
    asked = r.get("loop") if r.get("loop") != "auto" else None
    return r.get("loop_strategy") or asked or "stages"


def ran(r: dict | None) -> str:
    """What `auto` ran for a record: the loop strategy, for the persistent one on which cores and in how many
    groups of rows, as the bench recorded it."""
    if r is None or loop(r) != "persistent" or not r.get("gpu_loop"):
        return "–" if r is None else loop(r)
    return r["gpu_loop"].replace(" (", " on ", 1).removesuffix(")")


def record(doc: dict, optional: bool = False, **match) -> dict | None:
    """The one measured record of `doc` matching every key (loop_strategy: see loop()), or None when it was
    skipped (or, `optional`, not there); an RnnGraphError when several match, or none and not `optional`
    (the page asks for a measurement the file lacks)."""
    got = [r for r in doc["records"]
           if all((loop(r) if k == "loop_strategy" else r.get(k)) == v for k, v in match.items())]
    if optional and not got:
        return None
    if len(got) != 1:
        raise RnnGraphError(f"{doc['path']} holds {len(got)} records with {match}; expected one")
    r = got[0]
    unmeasured = r.get("forward_ms") is None and r.get("train_ms") is None
    return None if unmeasured or any(k in r for k in ("skipped", "failed", "error")) else r


# -- formatting -----------------------------------------------------------------------------------

def num(v) -> str:
    """A time (or any positive quantity) with three significant figures, never in exponent form."""
    if v is None:
        return "–"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def pair(r: dict | None) -> str:
    """'forward / training step' milliseconds of a record."""
    return "–" if r is None else f"{num(r.get('forward_ms'))} / {num(r.get('train_ms'))}"


def ratio(a: dict | None, b: dict | None, what: str = "train") -> float | None:
    x, y = (None if r is None else r.get(f"{what}_ms") for r in (a, b))
    return x / y if x and y else None


def times(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def table(head: list, rows: list) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def command(doc: dict) -> str:
    """The command that made a stored file, its output option pointed at where the file is stored."""
    cmd, where = doc["metadata"]["command"], rel(doc["path"])
    cmd = re.sub(r"--json \S+", f"--json {where}", cmd)
    return re.sub(r"--out \S+", f"--out {rel(doc['path'].parent)}", cmd)


def source(doc: dict) -> str:
    """One line: the file, the command that made it, the machine and the date."""
    m = doc["metadata"]
    machine = m.get("gpu") or m.get("device") or "an unnamed machine"
    if m.get("gpu"):
        machine += (f", CUDA {m.get('cuda_runtime')} (driver {m.get('cuda_driver')}), CuPy {m.get('cupy')}, "
                    f"torch {m.get('torch')}")
    how = "; stored from the table the command printed (medians only)" if doc.get("converted") else ""
    return f"`{rel(doc['path'])}`: `{command(doc)}` on {machine}, {str(m['date'])[:10]}{how}."


# -- what falls short -----------------------------------------------------------------------------

@dataclass
class Findings:
    """Where rnngraph is slower than a peer, collected while the tables are rendered (for the page's summary)."""
    slower: list = field(default_factory=list)

    def compare(self, section: str, what: str, ours: dict | None, peer: dict | None, peer_name: str) -> None:
        for w, label in (("forward", "forward"), ("train", "training step")):
            r = ratio(ours, peer, w)
            if r is not None and r >= 1.005:             # 1.00× (a tie to the shown digits) is not slower
                self.slower.append((section, f"{what}: the {label} takes {times(r)} {peer_name}'s "
                                             f"({num(ours[f'{w}_ms'])} against {num(peer[f'{w}_ms'])} ms)"))


def slope(doc: dict, impl: str = "graph", **match) -> list:
    """The forward's and the training step's µs a frame of the records matching `match` and impl: the slope between
    their shortest and longest T (None where either was not measured)."""
    T0, T1 = doc["settings"]["T"][0], doc["settings"]["T"][-1]
    a, b = (record(doc, T=T, impl=impl, **match) for T in (T0, T1))
    return [None if a is None or b is None else 1e3 * (b[f"{w}_ms"] - a[f"{w}_ms"]) / (T1 - T0)
            for w in ("forward", "train")]


def per_frame(r: dict | None) -> str:
    """µs a frame, forward / training step, of a record (its T frames)."""
    return "–" if r is None else f"{num(1e3 * r['forward_ms'] / r['T'])} / {num(1e3 * r['train_ms'] / r['T'])}"


def best_val(run: dict) -> tuple:
    """(the best validation bpc, its epoch) of a stored run."""
    log = run["log"]
    k = min((k for k, v in enumerate(log["val_bpc"]) if v == v), key=lambda k: log["val_bpc"][k])
    return log["val_bpc"][k], log["epoch"][k]


def seconds(run: dict) -> float:
    """A stored run's training time."""
    return float(run["log"]["elapsed_s"][-1])
