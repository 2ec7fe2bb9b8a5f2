"""The analysis of a cell into a plan: hoisted sections, parallel stages, merged GEMMs, fused groups and the
backward plan (schedule)."""
