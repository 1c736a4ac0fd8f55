#!/usr/bin/env bash
# The README's "your corpus" example end to end (CPU): inputs, preparation with an existing
# tokenizer, two mixtures, the per-domain comparison. Writes runs/corpus/ and docs/corpus/.
set -euo pipefail
W=runs/corpus
python docs/corpus/make_inputs.py $W/inputs
for d in plays arith; do
  /usr/bin/time -f "prepare $d: %e s wall, %M KB peak RSS" \
    normlab prepare $W/inputs/$d.txt --tokenizer $W/inputs/tokenizer.json --out $W/data/$d \
    --num-proc 2 --val-fraction 0.02 --overwrite
done
normlab validate docs/corpus/mixture.yaml --quiet
normlab train docs/corpus/mixture.yaml --run-dir $W/mix80
normlab train docs/corpus/mixture.yaml --run-dir $W/mix50 \
  "data.sources=[{name: plays, path: $W/data/plays, weight: 0.5}, {name: arith, path: $W/data/arith, weight: 0.5}]"
normlab compare $W/mix80 $W/mix50 --out docs/corpus
