"""`rnngraph report`: docs/performance.md and README.md's headline table, rendered from the stored results in
experiments/results (nothing is measured); `--check` exits 1 when a page differs from what the files give.

Example::

    rnngraph report            # rewrite docs/performance.md and the README's headline table
    rnngraph report --check    # exit 1 (naming the pages) when either is out of date
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RnnGraphError
from .experiments import REPO, RESULTS, load_results

PAGE = REPO / "docs" / "performance.md"
README = REPO / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
PEERS = ("cudnn", "torch_eager", "torch_compile", "jax_scan", "rnngraph_torch")


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the pages that differ from the stored results")
    p.add_argument("--results", metavar="DIR", default=str(RESULTS),
                   help="folder of stored results (default: %(default)s)")


def run(args) -> int:
    from .report_page import render_page
    results = Results(args.results)
    pages = {PAGE: render_page(results), README: with_headline(_read(README), headline(results))}
    stale = [p for p, text in pages.items() if not p.exists() or _read(p) != text]
    if args.check:
        for p in stale:
            print(f"rnngraph: {_rel(p)} differs from what {_rel(results.root)} gives; run `rnngraph report`",
                  file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(pages[p])
        print(f"wrote {_rel(p)}")
    if not stale:
        print("rnngraph: the pages are current")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise RnnGraphError(f"cannot read {path}: {e.strerror or e}") from None


def _rel(path: Path) -> str:
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

    def relative(self, path: Path) -> str:
        """A path as the pages name it: from the repository root."""
        return _rel(path)


def loop(r: dict) -> str | None:
    """The loop strategy an rnngraph record ran, or was asked for where it was skipped (records that name
    neither ran `stages`, as every loop did before there were others); None for a peer."""
    if r["impl"] not in ("naive", "staged", "graph"):
        return None
    asked = r.get("loop") if r.get("loop") != "auto" else None
    return r.get("loop_strategy") or asked or "stages"


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
    cmd, where = doc["metadata"]["command"], _rel(doc["path"])
    cmd = re.sub(r"--json \S+", f"--json {where}", cmd)
    return re.sub(r"--out \S+", f"--out {_rel(doc['path'].parent)}", cmd)


def source(doc: dict) -> str:
    """One line: the file, the command that made it, the machine and the date."""
    m = doc["metadata"]
    machine = m.get("gpu") or m.get("device") or "an unnamed machine"
    if m.get("gpu"):
        machine += (f", CUDA {m.get('cuda_runtime')} (driver {m.get('cuda_driver')}), CuPy {m.get('cupy')}, "
                    f"torch {m.get('torch')}")
    how = "; stored from the table the command printed (medians only)" if doc.get("converted") else ""
    return f"`{_rel(doc['path'])}`: `{command(doc)}` on {machine}, {str(m['date'])[:10]}{how}."


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


# -- the headline table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    label: str
    file: str
    ours: dict
    peer: dict
    peer_name: str


HEADLINE = [
    Row("LSTM, B = 1, bfloat16", "half", dict(B=1, impl="graph"), dict(B=1, impl="cudnn@float16"), "cuDNN, float16"),
    Row("LSTM, B = 8", "persistent_b8", dict(impl="graph", loop_strategy="persistent"), dict(impl="cudnn"), "cuDNN"),
    Row("LSTM, B = 64", "targets", dict(cell="lstm", B=64, impl="graph"), dict(cell="lstm", B=64, impl="cudnn"),
        "cuDNN"),
    Row("MGU (a user cell), B = 1", "targets", dict(cell="mgu", B=1, impl="graph"),
        dict(cell="mgu", B=1, impl="torch_eager"), "torch eager loop"),
    Row("LayerNorm-LSTM, B = 1", "norm", dict(impl="graph"), dict(impl="torch_compile"), "torch.compile"),
    Row("minGRU, B = 1, T = 4096", "loops_t4096", dict(B=1, impl="graph", loop_strategy="scan"),
        dict(B=1, impl="jax_scan"), "JAX associative scan"),
    Row("minGRU, B = 1", "loops_t100", dict(cell="min_gru", impl="graph", loop_strategy="scan"),
        dict(cell="min_gru", impl="jax_scan"), "JAX associative scan"),
]


def headline(results: Results, findings: Findings | None = None) -> str:
    """The headline table: rnngraph against cuDNN, torch eager, torch.compile and JAX, each row with its source."""
    files = list(dict.fromkeys(row.file for row in HEADLINE))
    rows = []
    for row in HEADLINE:
        doc = results.bench(row.file)
        ours, peer = record(doc, **row.ours), record(doc, **row.peer)
        rows.append([row.label, f"{pair(ours)} ({loop(ours)})", row.peer_name, pair(peer),
                     f"{times(ratio(ours, peer, 'forward'))} / {times(ratio(ours, peer))}",
                     str(files.index(row.file) + 1)])
        if findings is not None:
            findings.compare("headline", row.label, ours, peer, row.peer_name)
    head = ["workload", "rnngraph, ms (loop)", "peer", "peer, ms", "rnngraph ÷ peer", "source"]
    notes = "\n".join(f"{k + 1}. {source(results.bench(f))}" for k, f in enumerate(files))
    return (table(head, rows) + "\n\nMilliseconds, forward / training step (forward and backward with input and "
            "weight gradients), medians; T = 100, H = 512, float32 with TF32 off and one layer unless the row "
            "says otherwise; below 1× rnngraph is faster. Sources:\n\n" + notes)


def with_headline(readme: str, text: str) -> str:
    """README.md with `text` between its headline markers."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise RnnGraphError(f"{README} needs one {BEGIN} line followed by one {END} line")
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + text + "\n" + readme[stop:]
