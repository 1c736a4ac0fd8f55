#!/usr/bin/env bash
# GPU check of the Triton norm kernels (issue 5): the GPU-marked and CPU-shaped kernel tests on
# CUDA, then the benchmark (SCIENCE.md section 10 targets). About 7-8 minutes on an H200.
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (default: $OUT if set, else gpu_check_out)
# Writes OUT_DIR/{env.txt,tests.txt,bench.txt,bench.jsonl,table.txt,summary.txt}.
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
py="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary="$out/summary.txt"
: > "$summary"

if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $py; nothing to check" | tee -a "$summary"
    exit 1
fi
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
    "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    "$py" -c "import liger_kernel; print('liger-kernel present')" 2>/dev/null || echo "no liger-kernel"
} > "$out/env.txt" 2>&1

start=$SECONDS
timeout 210 "$py" -m pytest tests/test_kernels.py tests/test_kernels_gpu.py -q -p no:cacheprovider \
    --durations=10 > "$out/tests.txt" 2>&1
echo "tests: exit $? in $((SECONDS - start)) s; $(tail -n 1 "$out/tests.txt")" | tee -a "$summary"

start=$SECONDS
rm -f "$out/bench.jsonl"
timeout 230 "$py" benchmarks/bench_norm_kernels.py --rep-ms 40 --out "$out/bench.jsonl" \
    > "$out/bench.txt" 2>&1
echo "benchmark: exit $? in $((SECONDS - start)) s (124 = timed out; rows kept)" | tee -a "$summary"
# The table again from the rows written so far, so a timeout still leaves a summary.
"$py" benchmarks/bench_norm_kernels.py --from-jsonl "$out/bench.jsonl" > "$out/table.txt" 2>&1
tail -n 1 "$out/table.txt" | tee -a "$summary"
