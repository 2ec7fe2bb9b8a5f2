#!/usr/bin/env bash
# The GPU checks and measurements of one device session, from the repository root on a machine with a GPU:
#   experiments/gpu_checks.sh tests [pytest -k expression]   the GPU test suite, 8 processes
#   experiments/gpu_checks.sh bench NAME...                   measurements, each a bench JSON (names below)
# Logs and JSON go to $OUT (default: runs/gpu_checks); each step is bounded by `timeout` so one stuck step
# leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_checks}"
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
bench() { timeout "${LIMIT:-300}" python3 -m rnngraph bench "$@"; }

case "${1:-}" in
tests)
    shift
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee "$OUT/gpu.txt"
    timeout "${LIMIT:-540}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --dist loadfile --durations=15 \
        -k "${1:-not ranks and not nccl}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
    ;;
bench)
    shift
    for name in "$@"; do
        case "$name" in
        # the tensor-core loop against cuDNN fp16 at the batch sizes people train with (bfloat16, H = 512)
        tensor_cores) bench --cell lstm -T 100 -B 8,16,64,128,256 -H 512 --dtype bfloat16 \
                            --impls graph,cudnn@float16 --loop persistent,stages --json "$OUT/tensor_cores.json" ;;
        tensor_cores_fp16) bench --cell lstm,gru -T 100 -B 64 -H 512,1024 --dtype float16 \
                            --impls graph,cudnn@float16 --json "$OUT/tensor_cores_fp16.json" ;;
        # the scan with graph mode's default chunks, against JAX
        scan) bench --cell min_gru -T 4096,65536 -B 1 --impls graph,jax_scan --json "$OUT/scan.json" ;;
        # the whole char-LM, torch.nn.LSTM against rnngraph.torch as it ships
        charlm) bench --model charlm -B 1,32,128 --impls torch,default --json "$OUT/charlm.json" ;;
        # the headline: LSTM and a user cell against cuDNN, the torch eager loop and torch.compile
        headline) bench --cell lstm,mgu -T 100 -B 1,64 -H 512 --impls graph,cudnn,torch_eager,torch_compile \
                            --json "$OUT/headline.json" ;;
        *) echo "unknown bench $name" >&2 ;;
        esac
    done
    ;;
*) echo "usage: $0 tests [-k expression] | bench NAME..." >&2; exit 2 ;;
esac
