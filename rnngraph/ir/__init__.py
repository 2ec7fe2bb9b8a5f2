"""The IR: op kinds and every per-op rule table (ops), the cell builder and validated CellGraph (graph),
the cell library (cells) and the versioned JSON form of a cell (cellio)."""
