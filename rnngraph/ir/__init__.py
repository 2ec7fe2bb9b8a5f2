"""The IR: op kinds and every per-op rule table (ops), the validated CellGraph (graph), the builder cells
are written with (builder), the cell library (cells) and the versioned JSON form of a cell (cellio)."""
