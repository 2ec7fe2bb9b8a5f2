"""A training run's logs: log.csv (one row per step) and log.json (the config, the model and every row), and
reading them back. Neither is ever seen half written: log.csv is rebuilt from the history on a resume in a
temporary file renamed over it, and each row is then appended by one write of the whole line, unbuffered;
log.json is replaced atomically. A reader skips a last line without its newline, should it catch one."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np

from ..errors import RnnGraphError
from .held import signals_held

LOG_COLUMNS = ("step", "epoch", "loss", "bpc", "val_bpc", "lr", "grad_norm", "frames_per_s", "elapsed_s")


class RunLog:
    """log.csv and log.json in folder `out`; `open` starts log.csv from the rows so far."""

    def __init__(self, out: Path):
        self.csv_path, self.json_path = out / "log.csv", out / "log.json"
        self._csv = None

    def open(self, history: list) -> None:
        """Opens log.csv for appending, rewritten from `history` (a resumed run drops rows past its checkpoint)."""
        tmp = self.csv_path.with_name(f".{self.csv_path.name}.{os.getpid()}.tmp")
        try:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(_lines([LOG_COLUMNS, *(_csv_row(r) for r in history)]))
            tmp.replace(self.csv_path)
            self._csv = open(self.csv_path, "ab", buffering=0)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RnnGraphError(f"cannot write the training log {self.csv_path}: {e.strerror or e}") from None

    def add(self, row: dict) -> None:
        """Appends one row: one write of the whole line (or, should the system take part of it, the rest)."""
        line = memoryview(_lines([_csv_row(row)]))
        while line:
            line = line[self._csv.write(line):]

    def close(self) -> None:
        if self._csv is not None:
            self._csv.close()
            self._csv = None

    def write_json(self, config: dict, model: dict, backend: str, history: list) -> None:
        body = {"config": config, "model": model, "backend": backend, "columns": list(LOG_COLUMNS),
                "rows": [[r[c] for c in LOG_COLUMNS] for r in history]}
        tmp = self.json_path.with_name(self.json_path.name + ".tmp")
        with signals_held():
            tmp.write_text(json.dumps(body))
            tmp.replace(self.json_path)


def _csv_row(row: dict) -> list:
    return [("" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k]) for k in LOG_COLUMNS]


def _lines(rows) -> bytes:
    """CSV lines (csv's quoting, CRLF line ends) as UTF-8 bytes."""
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue().encode("utf-8")


def read_log(path) -> dict:
    """A run's log (log.csv or log.json, or the folder holding them) as column -> numpy array (NaN for
    missing validation entries)."""
    path = Path(path)
    if path.is_dir():
        path = path / "log.csv"
    try:
        if path.suffix == ".json":
            body = json.loads(path.read_text())
            rows = [dict(zip(body["columns"], r)) for r in body["rows"]]
        else:
            with open(path, newline="") as f:
                text = f.read()
            rows = list(csv.DictReader(io.StringIO(text[:text.rfind("\n") + 1])))   # whole lines only
    except (OSError, ValueError, KeyError) as e:
        raise RnnGraphError(f"cannot read training log {path}: {e}") from None
    return {c: np.array([np.nan if r.get(c) in (None, "") else float(r[c]) for r in rows]) for c in LOG_COLUMNS}
