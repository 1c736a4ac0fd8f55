#!/usr/bin/env bash
# Everything within 10 minutes: each part has a time cap (kernel tests 110 s, kernel benchmark
# 100 s, compile 120 s, stabilizers 60 s, FP8 150 s, parametrization 20 s: 560 s at most, plus
# start-up).
# GPU check of the Triton norm kernels (issue 5): the GPU-marked and CPU-shaped kernel tests on
# CUDA, then the benchmark (SCIENCE.md section 10 targets; rows kept when the cap ends it).
# Then the throughput checks (issue 21): the MFU peak lookup of this GPU and
# compiled against eager step time (inductor, bf16, QK-Clip and the instruments on) with the
# MFU each reaches on the 125m preset.
# Then FP8 (issue 33, capped at 150 s): bf16 against precision.fp8 tensorwise and rowwise
# (torchao, compiled, engine fsdp on one GPU) step time and MFU on the 125m and 1b presets, as
# ratios over bf16 (benchmarks/bench_fp8.py); needs torchao (pip install 'normlab[fp8]').
# Then µP / CompleteP against sp (issue 31, capped at 20 s): the per-step cost on the 125m preset
# in bf16, as ratios (benchmarks/bench_parametrization.py; target within 2 %).
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (default: $OUT if set, else gpu_check_out)
#        PARTS="throughput" benchmarks/gpu_check.sh   runs only the named parts (kernels, throughput,
#        stabilizers, fp8, parametrization)
# Writes OUT_DIR/{env.txt,tests.txt,bench.txt,bench.jsonl,table.txt,mfu.txt,compile.txt,
# compile.json,fp8.txt,fp8.json,parametrization.txt,summary.txt}.
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

parts="${PARTS:-kernels throughput stabilizers fp8 parametrization}"
if [[ " $parts " == *" kernels "* ]]; then
start=$SECONDS
timeout 110 "$py" -m pytest tests/model/test_kernels.py tests/model/test_kernels_gpu.py -q -p no:cacheprovider \
    --durations=10 > "$out/tests.txt" 2>&1
echo "tests: exit $? in $((SECONDS - start)) s; $(tail -n 1 "$out/tests.txt")" | tee -a "$summary"

start=$SECONDS
rm -f "$out/bench.jsonl"
timeout 100 "$py" benchmarks/bench_norm_kernels.py --rep-ms 20 --out "$out/bench.jsonl" \
    > "$out/bench.txt" 2>&1
echo "benchmark: exit $? in $((SECONDS - start)) s (124 = timed out; rows kept)" | tee -a "$summary"
# The table again from the rows written so far, so a timeout still leaves a summary.
"$py" benchmarks/bench_norm_kernels.py --from-jsonl "$out/bench.jsonl" > "$out/table.txt" 2>&1
tail -n 1 "$out/table.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" throughput "* ]]; then
"$py" - > "$out/mfu.txt" 2>&1 <<'PY'
import torch
from normlab.launch.training.mfu import compute_dtype, peak_tflops
name = torch.cuda.get_device_name()
for dtype in ("bf16", "fp16", "fp32", "tf32"):
    print(f"{name}: {dtype} dense peak {peak_tflops(name, dtype)} TFLOP/s")
print("fp32 runs use", compute_dtype("fp32", torch.get_float32_matmul_precision()))
PY
head -n 1 "$out/mfu.txt" | tee -a "$summary"
start=$SECONDS
timeout 120 "$py" benchmarks/bench_compile.py --device cuda --dtype bf16 --size 125m --steps 10 \
    --warmup 3 --json "$out/compile.json" > "$out/compile.txt" 2>&1
echo "compile benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
grep -E "^(eager|compiled|compiled vs)" "$out/compile.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" stabilizers "* ]]; then
# attention stabilizers (gate, sinks, caps) against Pre-LN in bf16: step-time ratios, kernel used
start=$SECONDS
timeout 60 "$py" benchmarks/bench_stabilizers.py --device cuda --sizes small --rounds 10 \
    --json "$out/stabilizers.json" > "$out/stabilizers.txt" 2>&1
echo "stabilizers benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
tail -n 8 "$out/stabilizers.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" fp8 "* ]]; then
# FP8 training through torchao: the hardware path (SM 8.9+), compiled, against bf16
start=$SECONDS
timeout 150 "$py" benchmarks/bench_fp8.py --device cuda --sizes 125m 1b --steps 6 --warmup 3 \
    --json "$out/fp8.json" > "$out/fp8.txt" 2>&1
echo "fp8 benchmark: exit $? in $((SECONDS - start)) s (124 = timed out)" | tee -a "$summary"
grep -E "^(size|125m|1b) " "$out/fp8.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" parametrization "* ]]; then
# µP and CompleteP against sp: the same matmuls, only multipliers, init and optimizer groups differ
start=$SECONDS
timeout 20 "$py" benchmarks/bench_parametrization.py --device cuda --preset 125m --batch 8 \
    --seq 512 --steps 10 --rounds 5 > "$out/parametrization.txt" 2>&1
echo "parametrization benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
grep -E "ratio to sp" "$out/parametrization.txt" | tee -a "$summary"
fi
