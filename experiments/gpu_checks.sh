#!/usr/bin/env bash
# The GPU checks and measurements of one device session, from the repository root on a machine with a GPU:
#   experiments/gpu_checks.sh tests [pytest -k expression]   the GPU test suite, 8 processes
#   experiments/gpu_checks.sh bench NAME...                   measurements, each a bench JSON (names below)
#   experiments/gpu_checks.sh profile --impl staged --cell min_gru -T 4096 --loop scan   one step's kernels (ncu)
#   experiments/gpu_checks.sh stalls --impl graph --cell slstm --heads 12 -T 256 -B 16 -H 768 --dtype bfloat16
#                                                             the persistent kernels' warp stalls (ncu)
# Logs and JSON go to $OUT (default: runs/gpu_checks); each step is bounded by `timeout` so one stuck step
# leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_checks}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1    # wheels carried to the machine stay importable
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
        # rnngraph's modes against cuDNN and the torch eager loop (docs/performance.md, "Against cuDNN and torch")
        targets) bench --cell lstm,peephole_lstm,min_gru,mgu -T 100 -B 1,64 -H 512 --repeats 10 --json "$OUT/targets.json" ;;
        # the loop strategies at T = 4096 with graph mode's default chunks, against JAX
        loops_t4096) bench --cell min_gru -T 4096 -B 1,64 --impls graph,jax_scan --loop stages,elementwise,scan \
                            --repeats 10 --json "$OUT/loops_t4096.json" ;;
        # the LSTM in bfloat16, float16 and float32 against cuDNN in each precision, B = 1 ... 256 (auto), and bfloat16
        # with loop="persistent" (tensor cores from B = 4, groups of rows beyond B = 16)
        tensor_cores) bench --cell lstm -T 100 -B 1,4,8,16,32,64,128,256 -H 512 --dtype bfloat16 \
                            --impls graph,graph@float16,graph@float32,cudnn@bfloat16,cudnn@float16,cudnn@float32 \
                            --loop auto,persistent --repeats 15 --json "$OUT/tensor_cores.json" ;;
        # float32 with TF32 allowed on both sides: rnngraph on tensor cores (m16n8k8) against cuDNN, and with TF32 off
        tf32) bench --cell lstm -T 100 -B 1,4,8,16,32,64,128 -H 512 --dtype float32 --impls graph,cudnn --tf32 \
                            --loop auto,persistent --repeats 15 --json "$OUT/tf32.json" ;;
        # the LSTM's cost a frame at B = 64: the slope from T = 100 to 1000, bfloat16 against cuDNN float16
        slope_b64) bench --cell lstm -T 100,1000 -B 64 -H 512 --dtype bfloat16 --impls graph,cudnn@float16 \
                            --repeats 15 --json "$OUT/slope_b64.json" ;;
        # the wide LSTMs auto runs in groups of rows by the H = 512 rule, against stages and cuDNN float16
        wide) bench --cell lstm -T 100 -B 32,64 -H 768,1024 --dtype bfloat16 --impls graph,cudnn@float16 \
                            --loop auto,stages --repeats 15 --json "$OUT/wide.json" ;;
        # rows a persistent row group: as chosen against groups of 16, alternating in one process (runner.GROUP_ROWS)
        rows) for dt in bfloat16 float32; do timeout "${LIMIT:-300}" python3 experiments/persistent_rows.py \
                  --cell lstm,gru,mgu -B 48,64,96,128 -H 512 --dtype $dt --rows 16 | tee -a "$OUT/rows.txt"; done ;;
        # GRU and MGU in bfloat16 at B = 64 against the LSTM and cuDNN float16
        gru_b64) bench --cell lstm,gru,mgu -T 100 -B 64 -H 512 --dtype bfloat16 --impls graph,cudnn@float16 \
                            --loop auto,stages --repeats 15 --json "$OUT/gru_b64.json" ;;
        # the whole char-LM, torch.nn.LSTM against rnngraph.torch as it ships
        charlm) bench --model charlm -B 1,32,128 --impls torch,default --json "$OUT/charlm.json" ;;
        # sLSTM and the multi-head LSTM in 12 heads of 64, against cuDNN's single-head LSTM, the torch loop and FlashRNN
        # (the flashrnn wheel carried to the machine: it compiles its kernels at first use)
        heads) LIMIT="${LIMIT:-500}" bench --cell slstm,mh_lstm,lstm -T 1024 -B 16,64 -H 768 --heads 12 --dtype bfloat16 \
                            --impls graph,cudnn@float16,torch_eager,flashrnn,flashrnn_cuda --repeats 5 \
                            --json "$OUT/heads.json" ;;
        # the per-head loop at B = 16 (warp roles in the forward), sLSTM and the multi-head LSTM in 12 heads of 64
        # against cuDNN float16's single-head LSTM of the same size, in one process
        heads_b16) bench --cell slstm,mh_lstm,lstm -T 1024 -B 16 -H 768 --heads 12 --dtype bfloat16 \
                            --impls graph,cudnn@float16 --repeats 15 --json "$OUT/heads_b16.json" ;;
        # the per-head loop at B = 1: H = 512 in 8 heads, its cost a frame as the slope from T = 100 to 1000
        heads_b1) bench --cell slstm,mh_lstm -T 100,1000 -B 1 -H 512 --heads 8 --dtype bfloat16 --impls graph \
                            --repeats 15 --json "$OUT/heads_b1.json" ;;
        # graph mode fed 10,000 calls of random shapes, T in [1, 2000] and B in [1, 64], LSTM H = 256
        shapes) timeout "${LIMIT:-420}" python3 experiments/graph_shapes_probe.py --json "$OUT/shapes.json" ;;
        # what chunks of time cost per loop strategy: chunks of 1024 (the scan's too), whole calls and the ladder
        chunks) RNNGRAPH_CHUNK_FRAMES=1024 timeout "${LIMIT:-300}" python3 experiments/chunk_overhead.py --T 1000,4096 \
                            --json "$OUT/chunk_overhead.json" ;;
        # the scan at long T against JAX
        scan_long) bench --cell min_gru,min_lstm,qrnn -T 4096,65536 -B 1 --impls graph,jax_scan --loop scan \
                            --repeats 10 --json "$OUT/scan_long.json" ;;
        # a long sequence within device memory: LSTM H = 512, B = 8, T = 100,000, a training step in graph mode
        memory) timeout "${LIMIT:-300}" python3 experiments/long_sequence_memory.py --json "$OUT/memory.json" ;;
        *) echo "unknown bench $name" >&2 ;;
        esac
    done
    ;;
profile)
    # one training step's kernels, each timed by Nsight Compute: experiments/kernel_profile.py's arguments
    shift
    timeout "${LIMIT:-300}" ncu --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv \
        python3 experiments/kernel_profile.py "$@" > "$OUT/profile.csv" 2> "$OUT/profile.err"
    python3 experiments/kernel_profile.py --summarise "$OUT/profile.csv" | tee "$OUT/profile.txt"
    ;;
stalls)
    # the persistent kernels of one training step: where their warps wait (Nsight Compute's warp state sampling,
    # per SASS line in stalls_sass.csv), with the same arguments as profile
    shift
    timeout "${LIMIT:-300}" ncu --nvtx --nvtx-include "step/" -k "regex:^rg_persist_[0-9a-f]" --section WarpStateStats \
        --section SourceCounters --section SpeedOfLight --section LaunchStats -f -o "$OUT/stalls" \
        python3 experiments/kernel_profile.py "$@" > "$OUT/stalls.log" 2>&1
    ncu -i "$OUT/stalls.ncu-rep" --page details > "$OUT/stalls.txt" 2>&1
    ncu -i "$OUT/stalls.ncu-rep" --page source --csv --print-source sass > "$OUT/stalls_sass.csv" 2>&1
    rm -f "$OUT/stalls.ncu-rep"
    tail -5 "$OUT/stalls.log"; grep -E "Duration|Warp Cycles Per Issued" "$OUT/stalls.txt" | head -20
    python3 experiments/kernel_profile.py --stalls "$OUT/stalls_sass.csv" | tee "$OUT/stalls_summary.txt"
    gzip -f "$OUT/stalls_sass.csv"
    ;;
*) echo "usage: $0 tests [-k expression] | bench NAME... | profile|stalls [kernel_profile.py arguments]" >&2; exit 2 ;;
esac
