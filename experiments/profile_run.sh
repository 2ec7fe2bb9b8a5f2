#!/usr/bin/env bash
# device: ncu per-kernel times of one training step, rnngraph staged and JAX
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT="${OUT:-runs/profile}"; mkdir -p "$OUT"
which ncu nsys
for spec in "staged min_gru 4096" "jax_scan min_gru 4096" "staged min_gru 65536" "jax_scan min_gru 65536"; do
  set -- $spec
  timeout 200 ncu --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv \
     python3 experiments/kernel_profile.py --impl $1 --cell $2 -T $3 --loop scan > "$OUT/$1_$2_$3.csv" 2> "$OUT/$1_$2_$3.err"
  echo "== $spec"; python3 experiments/kernel_profile.py --summarise "$OUT/$1_$2_$3.csv" | head -25; tail -3 "$OUT/$1_$2_$3.err"
done
