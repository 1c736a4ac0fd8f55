#!/usr/bin/env bash
# One prepared script for a GPU session (issue 50), within 9 minutes on one GPU, in this order:
#  1. kernels: the fused norm kernels' forward and backward bandwidth as a share of the device's
#     peak (benchmarks/bench_norm_kernels.py: RMSNorm, Pre-LN's add+RMSNorm and Peri-LN's
#     RMSNorm+add at hidden 4096 and 8192, against torch.compile; goal >= 85 % forward, >= 70 %
#     backward of peak for RMSNorm at hidden >= 4096);
#  2. bf16: MFU with the instruments off at the 1b preset and at the 7b width in 4 blocks
#     (benchmarks/bench_fp8.py --arms bf16: engine single, each block compiled);
#  3. fp8: torchao FP8 tensorwise and rowwise tokens/s against those bf16 runs, same shapes
#     (goal >= 1.25x at the 7b width; torchao's auto filter says which layers below pay nothing);
#  4. kernel tests: the mixed-dtype fused-norm tests on CUDA (norm_add failed there 2026-12-04).
# Each part is one process under `timeout -k 5` with its own cap, cut further so the whole run
# stays within BUDGET seconds (default 530); a part cut by its cap keeps the rows it printed (the
# benchmarks print and write each row as it ends). Caps are sized from the H200 run of
# 2026-12-04 (benchmarks/results/gpu_h200_2026-12-04: 1b bf16 took 76 s with FSDP2, a final
# evaluation and a 16 GB checkpoint, none of which the benchmark now does).
# FP8 needs torchao (pip install 'normlab[fp8]', or a carried wheel: the torchao built against the
# machine's torch, 0.17.0 for torch 2.11). On this workplace's device machine, from the repo root:
#   here:  echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#            --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#            torchao==0.17.0
#   there (carry .whl): python3 -m pip install -q --no-index --no-deps --target /tmp/site \
#            .whl/*.whl && export PYTHONPATH=/tmp/site PYTHON=python3 PYTHONUNBUFFERED=1;
#          timeout 580 bash benchmarks/gpu_check.sh /tmp/gc; tar czf $OUT/gc.tgz -C /tmp gc
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (default: benchmarks/results/gpu_<device>_<date>)
#        PARTS="kernels bf16" benchmarks/gpu_check.sh   runs only the named parts (kernels, bf16,
#        fp8, tests); BUDGET=300 shortens the whole run
# Writes OUT_DIR/{env.txt,bench.txt,bench.jsonl,table.txt,bf16_<size>.{txt,json},
# fp8_<size>_<recipe>.{txt,json},fp8_table.txt,tests.txt,summary.txt}.
set -u
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
budget="${BUDGET:-530}"
# A bare GPU machine has torch but not normlab installed (and nothing to install from): the
# `normlab.*` namespace is then a folder of links to this checkout's model/, data/, launch/,
# recipes/ (what pyproject's package-dir maps).
if ! "$py" -c "import normlab.launch.config" 2>/dev/null; then
    shim="$(mktemp -d)"
    mkdir -p "$shim/normlab"
    for d in model data launch recipes; do ln -s "$PWD/$d" "$shim/normlab/$d"; done
    export PYTHONPATH="$shim:$PYTHONPATH"
    echo "gpu_check: normlab not installed; importing it from $PWD through $shim"
fi
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to $py; nothing to check"
    exit 1
fi
device="$("$py" -c "import re, torch; n = torch.cuda.get_device_name(); \
m = re.search(r'[A-Z]+[0-9]+', n.replace('NVIDIA', '')); print((m.group() if m else 'gpu').lower())")"
out="${1:-benchmarks/results/gpu_${device}_$(date -u +%F)}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
    "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    "$py" -c "import torchao; print('torchao', torchao.__version__)" 2>/dev/null || echo "no torchao"
    git log -1 --format='commit %H' 2>/dev/null || true
} > "$out/env.txt" 2>&1
echo "gpu_check: $(head -n 2 "$out/env.txt" | tail -n 1); budget $budget s; writing $out" \
    | tee -a "$summary"

# cap WANT: WANT seconds, or what is left of the budget (0 when under 15 s are left)
cap() {
    local left=$((budget - SECONDS))
    if ((left < 15)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}
# part NAME WANT OUTFILE CMD...: one capped process; its exit status and time in the summary
part() {
    local name="$1" want="$2" file="$3"
    shift 3
    local c start
    c="$(cap "$want")"
    if ((c == 0)); then
        echo "$name: skipped, the budget is spent" | tee -a "$summary"
        return
    fi
    start=$SECONDS
    timeout -k 5 "$c" "$@" > "$file" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s of $c (124: cut by its cap)" | tee -a "$summary"
}
parts="${PARTS:-kernels bf16 fp8 tests}"

if [[ " $parts " == *" kernels "* ]]; then
    rm -f "$out/bench.jsonl"
    part "norm kernels" 75 "$out/bench.txt" "$py" benchmarks/bench_norm_kernels.py \
        --ops rmsnorm pre_rms peri_rms --hidden 4096 8192 --tokens 32768 \
        --impls triton compile --rep-ms 20 --out "$out/bench.jsonl"
    # the table again from the rows written so far, so a cut run still leaves its summary
    "$py" benchmarks/bench_norm_kernels.py --from-jsonl "$out/bench.jsonl" > "$out/table.txt" 2>&1
    grep -E "^(targets met|RMSNorm at hidden)" "$out/table.txt" | tee -a "$summary"
fi

fp8_args=(--device cuda --steps 6 --warmup 3 --window 3)
if [[ " $parts " == *" bf16 "* ]]; then
    for sc in 1b:75 7b-w4:75; do
        size="${sc%%:*}"
        part "bf16 $size" "${sc##*:}" "$out/bf16_$size.txt" "$py" benchmarks/bench_fp8.py \
            "${fp8_args[@]}" --sizes "$size" --arms bf16 --json "$out/bf16_$size.json"
        grep -E "^done: " "$out/bf16_$size.txt" | tee -a "$summary"
    done
fi

if [[ " $parts " == *" fp8 "* ]]; then
    for size in 7b-w4 1b; do  # the width where FP8 should pay first
        for recipe in tensorwise rowwise; do
            part "fp8 $recipe $size" 65 "$out/fp8_${size}_$recipe.txt" "$py" \
                benchmarks/bench_fp8.py "${fp8_args[@]}" --sizes "$size" --arms "fp8 $recipe" \
                --json "$out/fp8_${size}_$recipe.json"
            grep -E "^done: " "$out/fp8_${size}_$recipe.txt" | tee -a "$summary"
        done
    done
    mapfile -t saved < <(ls "$out"/bf16_*.json "$out"/fp8_*.json 2>/dev/null)
    if ((${#saved[@]})); then
        "$py" benchmarks/bench_fp8.py --from-json "${saved[@]}" > "$out/fp8_table.txt" 2>&1
        tee -a "$summary" < "$out/fp8_table.txt"
    fi
fi

if [[ " $parts " == *" tests "* ]]; then
    part "kernel tests (mixed dtypes)" 40 "$out/tests.txt" "$py" -m pytest \
        tests/model/test_kernels.py -k "mixed_dtypes" -v -p no:cacheprovider --tb=short -rf
    tail -n 1 "$out/tests.txt" | tee -a "$summary"
    grep -E "(FAILED|ERROR)" "$out/tests.txt" | head -n 20 | tee -a "$summary"
fi
echo "gpu_check: done in $SECONDS s" | tee -a "$summary"
