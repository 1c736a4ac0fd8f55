"""Data preparation throughput on the bundled corpus: `python benchmarks/bench_prepare.py`.

Runs `data.prepare.prepare` from scratch into a temporary directory (tokenizer training included)
and prints the corpus sizes, the stage timings and tokens per second. Not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from normlab.data.corpus import CORPUS_XZ, bundled_corpus_path  # noqa: E402
from normlab.data.prepare import prepare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--model-type", default="bpe", choices=("bpe", "unigram"))
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    text = bundled_corpus_path()
    print(f"corpus: {text.stat().st_size:,} bytes raw, {CORPUS_XZ.stat().st_size:,} compressed")
    best = None
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            meta = prepare(
                None,
                Path(tmp) / "out",
                vocab_size=args.vocab_size,
                model_type=args.model_type,
                num_proc=args.num_proc,
            )
            wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, meta)
    wall, meta = best
    n = meta["tokens"]["train"] + meta["tokens"]["val"]
    t = meta["timings_s"]
    print(f"tokens: {n:,} ({meta['tokens']['train']:,} train, {meta['tokens']['val']:,} val)")
    print(f"bytes/token: {text.stat().st_size / n:.2f}")
    print(f"stages (s): {t}")
    print(f"prepare wall (best of {args.repeats}): {wall:.2f} s -> {n / wall:,.0f} tokens/s")
    print(f"tokenize+write only: {n / (t['tokenize'] + t['write']):,.0f} tokens/s")


if __name__ == "__main__":
    main()
