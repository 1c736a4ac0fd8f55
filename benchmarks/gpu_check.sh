#!/usr/bin/env bash
# Everything within 10 minutes (one device call). The parts run in order of what is still
# unmeasured, each under a time cap sized from the first H200 run (2026-12-04, benchmarks/results/
# gpu_h200_2026-12-04.md): FP8 125m 130 s (took 108), FP8 1b 200 s (bf16 76 s, tensorwise 61 s),
# parametrization 50 s (20 s was too short), kernel tests 110 s (125 of 129 in 80 s), kernel
# benchmark 60 s: 550 s plus start-up. `fp8wide` (the 7b preset's GEMM shapes in 4 blocks, 170 s),
# `throughput` (compile, 80 s) and `stabilizers` (40 s) run when PARTS names them. A part cut by its cap keeps what it printed so far (the benchmarks print
# rows as they end; pytest -v prints each test's result), and `timeout -k` kills a process that
# handles SIGTERM (the trainer checkpoints on it and would run on).
# FP8 (issue 33): bf16 against precision.fp8 tensorwise and rowwise (torchao, compiled, engine
# fsdp on one GPU, instruments off) step time and MFU on the 125m and 1b presets, as ratios over
# bf16 (benchmarks/bench_fp8.py); needs torchao (pip install 'normlab[fp8]', or a carried wheel:
# the torchao built against the machine's torch, 0.17.0 for its torch 2.11).
# µP / CompleteP against sp (issue 31): the per-step cost on the 125m preset in bf16, as ratios
# (benchmarks/bench_parametrization.py; target within 2 %).
# The Triton norm kernels (issue 5): the GPU-marked and CPU-shaped kernel tests on CUDA, then the
# benchmark (SCIENCE.md section 10 targets; rows kept when the cap ends it).
# Throughput (issue 21): the MFU peak lookup of this GPU and compiled against eager step time
# (inductor, bf16, QK-Clip and the instruments on) with the MFU each reaches on the 125m preset.
# Attention stabilizers (gate, sinks, caps) against Pre-LN in bf16: step-time ratios.
# On this workplace's device machine (its torch 2.11 image, no torchao), from the repo root:
#   here:  echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#            --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#            torchao==0.17.0
#   there (carry .whl): python3 -m pip install -q --no-index --no-deps --target /tmp/site \
#            .whl/*.whl && export PYTHONPATH=/tmp/site PYTHON=python3 PYTHONUNBUFFERED=1;
#          timeout 585 bash benchmarks/gpu_check.sh /tmp/gc; tar czf $OUT/gc.tgz -C /tmp gc
#   (only 8 files come back from $OUT, hence the tarball; the outer timeout leaves time for it)
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (default: $OUT if set, else gpu_check_out)
#        PARTS="throughput" benchmarks/gpu_check.sh   runs only the named parts (fp8, fp8wide,
#        parametrization, kernels, throughput, stabilizers)
# Writes OUT_DIR/{env.txt,fp8_125m.txt,fp8_125m.json,fp8_1b.txt,fp8_1b.json,parametrization.txt,
# tests.txt,bench.txt,bench.jsonl,table.txt,mfu.txt,compile.txt,compile.json,stabilizers.txt,
# stabilizers.json,summary.txt}.
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
py="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# A bare GPU machine has torch but not normlab installed (and nothing to install from): the
# `normlab.*` namespace is then a folder of links to this checkout's model/, data/, launch/,
# recipes/ (what pyproject's package-dir maps). torchao for the FP8 part may be carried as a wheel.
if ! "$py" -c "import normlab.launch.config" 2>/dev/null; then
    shim="$(mktemp -d)"
    mkdir -p "$shim/normlab"
    for d in model data launch recipes; do ln -s "$PWD/$d" "$shim/normlab/$d"; done
    export PYTHONPATH="$shim:$PYTHONPATH"
    echo "gpu_check: normlab not installed; importing it from $PWD through $shim"
fi
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

parts="${PARTS:-fp8 parametrization kernels}"
# FP8 training through torchao: the hardware path (SM 8.9+), compiled, against bf16; one process
# per size (size:cap) so that a cap on a larger size keeps the smaller one's rows. fp8wide: the
# 7b preset's GEMM shapes in 4 blocks (K, N up to 4096 x 11008), where torchtitan's guide expects
# FP8 to pay; not in the default parts
fp8_sizes=""
[[ " $parts " == *" fp8 "* ]] && fp8_sizes+=" 125m:130 1b:200"
[[ " $parts " == *" fp8wide "* ]] && fp8_sizes+=" 7b-w4:170"
for sc in $fp8_sizes; do
    size="${sc%%:*}" cap="${sc##*:}"
    start=$SECONDS
    timeout -k 5 "$cap" "$py" benchmarks/bench_fp8.py --device cuda --sizes "$size" --steps 6 \
        --warmup 3 --json "$out/fp8_$size.json" > "$out/fp8_$size.txt" 2>&1
    echo "fp8 benchmark $size: exit $? in $((SECONDS - start)) s (124 = timed out)" | tee -a "$summary"
    grep -E "^(done: |size |$size )" "$out/fp8_$size.txt" | tee -a "$summary"
done

if [[ " $parts " == *" parametrization "* ]]; then
# µP and CompleteP against sp: the same matmuls, only multipliers, init and optimizer groups differ
start=$SECONDS
timeout -k 5 50 "$py" benchmarks/bench_parametrization.py --device cuda --preset 125m --batch 8 \
    --seq 512 --steps 10 --rounds 5 > "$out/parametrization.txt" 2>&1
echo "parametrization benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
grep -E "ratio to sp" "$out/parametrization.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" kernels "* ]]; then
start=$SECONDS
timeout -k 5 110 "$py" -m pytest tests/model/test_kernels.py tests/model/test_kernels_gpu.py -v -p no:cacheprovider \
    --tb=short -rf --durations=10 > "$out/tests.txt" 2>&1
echo "tests: exit $? in $((SECONDS - start)) s; $(tail -n 1 "$out/tests.txt")" | tee -a "$summary"
grep -E "(FAILED|ERROR)" "$out/tests.txt" | head -n 20 | tee -a "$summary"

start=$SECONDS
rm -f "$out/bench.jsonl"
timeout -k 5 60 "$py" benchmarks/bench_norm_kernels.py --rep-ms 20 --out "$out/bench.jsonl" \
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
timeout -k 5 80 "$py" benchmarks/bench_compile.py --device cuda --dtype bf16 --size 125m --steps 10 \
    --warmup 3 --json "$out/compile.json" > "$out/compile.txt" 2>&1
echo "compile benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
grep -E "^(eager|compiled|compiled vs)" "$out/compile.txt" | tee -a "$summary"
fi

if [[ " $parts " == *" stabilizers "* ]]; then
# attention stabilizers (gate, sinks, caps) against Pre-LN in bf16: step-time ratios, kernel used
start=$SECONDS
timeout -k 5 40 "$py" benchmarks/bench_stabilizers.py --device cuda --sizes small --rounds 10 \
    --json "$out/stabilizers.json" > "$out/stabilizers.txt" 2>&1
echo "stabilizers benchmark: exit $? in $((SECONDS - start)) s" | tee -a "$summary"
tail -n 8 "$out/stabilizers.txt" | tee -a "$summary"
fi
