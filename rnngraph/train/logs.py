"""A training run's logs: log.csv (one row per step, rewritten from the history on a resume, flushed every
row) and log.json (the config, the model and every row; replaced atomically), and reading them back."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from ..errors import RnnGraphError

LOG_COLUMNS = ("step", "epoch", "loss", "bpc", "val_bpc", "lr", "grad_norm", "frames_per_s", "elapsed_s")


class RunLog:
    """log.csv and log.json in folder `out`; `open` starts log.csv from the rows so far."""

    def __init__(self, out: Path):
        self.csv_path, self.json_path = out / "log.csv", out / "log.json"
        self._csv = self._writer = None

    def open(self, history: list) -> None:
        """Opens log.csv, rewritten from `history` (a resumed run drops rows past its checkpoint)."""
        try:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            self._csv = open(self.csv_path, "w", newline="")
        except OSError as e:
            raise RnnGraphError(f"cannot write the training log {self.csv_path}: {e.strerror or e}") from None
        self._writer = csv.DictWriter(self._csv, LOG_COLUMNS)
        self._writer.writeheader()
        for row in history:
            self._writer.writerow(_csv_row(row))
        self._csv.flush()

    def add(self, row: dict) -> None:
        self._writer.writerow(_csv_row(row))
        self._csv.flush()

    def close(self) -> None:
        if self._csv is not None:
            self._csv.close()

    def write_json(self, config: dict, model: dict, backend: str, history: list) -> None:
        body = {"config": config, "model": model, "backend": backend, "columns": list(LOG_COLUMNS),
                "rows": [[r[c] for c in LOG_COLUMNS] for r in history]}
        tmp = self.json_path.with_name(self.json_path.name + ".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(self.json_path)


def _csv_row(row: dict) -> dict:
    return {k: ("" if row[k] is None else repr(row[k]) if isinstance(row[k], float) else row[k])
            for k in LOG_COLUMNS}


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
                rows = list(csv.DictReader(f))
    except (OSError, ValueError, KeyError) as e:
        raise RnnGraphError(f"cannot read training log {path}: {e}") from None
    return {c: np.array([np.nan if r.get(c) in (None, "") else float(r[c]) for r in rows]) for c in LOG_COLUMNS}
