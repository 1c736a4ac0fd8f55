"""Peak memory of `normlab prepare` against corpus size and --batch-mb:
`python benchmarks/bench_prepare_memory.py --runs 200:4 200:16 1024:4`  (MB of input : batch MB).

Each run writes a corpus of that size into a temporary directory (the bundled text repeated),
runs `normlab prepare CORPUS --tokenizer tokenizer.json --num-proc N --batch-mb B` in a child
process and samples, every 0.2 s, the memory of that process and all its workers (psutil, PSS:
shared pages counted once); the peak of the sum is printed with the input size, tokens and wall
time. Everything is
deleted afterwards. The streaming design bounds memory by the batch setting
(about (2 N + 1) batches of text plus the tokenizers), not by the corpus: compare 200 MB and 1 GB
at the same --batch-mb. Not a test; times on a shared machine are under load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_prepare import make_tokenizer  # noqa: E402
from normlab.data.corpus import bundled_corpus_path  # noqa: E402


def tree_pss(proc: psutil.Process) -> int:
    """Proportional set size of the process and its workers: pages the forked workers share
    with the parent are counted once, split between them (RSS would count them per process)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_full_info().pss
    return total


def measure(cmd: list[str]) -> tuple[int, float, str]:
    """(peak memory (PSS) of the process tree in bytes, wall seconds, stdout) of `cmd`."""
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc, peak, done = psutil.Process(child.pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], tree_pss(proc))
            time.sleep(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = child.communicate()
    done.set()
    watcher.join()
    if child.returncode != 0:
        raise SystemExit(f"prepare failed ({child.returncode}): {err[-2000:]}")
    return peak[0], time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", default=["200:4", "200:16", "1024:4"])
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--note", default="")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    text = bundled_corpus_path().read_text()
    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        root = Path(tmp)
        tok = make_tokenizer(text, root / "tokenizer.json", args.vocab_size)
        print(
            f"{'input MB':>9s} {'batch MB':>9s} {'tokens':>13s} {'wall s':>8s} {'peak PSS MB':>12s}"
        )
        for spec in args.runs:
            mb, batch = (float(x) for x in spec.split(":"))
            corpus = root / "corpus.txt"
            with corpus.open("w") as f:
                for _ in range(max(1, round(mb * 2**20 / len(text.encode())))):
                    f.write(text)
            cmd = [sys.executable, "-m", "normlab.launch.cli", "prepare", str(corpus),
                   "--out", str(root / "out"), "--tokenizer", str(tok), "--num-proc",
                   str(args.num_proc), "--batch-mb", str(batch), "--overwrite"]  # fmt: skip
            peak, wall, _ = measure(cmd)
            meta = json.loads((root / "out" / "meta.json").read_text())
            n = meta["tokens"]["train"] + meta["tokens"]["val"]
            size = corpus.stat().st_size / 2**20
            print(f"{size:9.0f} {batch:9.0f} {n:13,d} {wall:8.0f} {peak / 2**20:12.0f}")
            rows.append({"input_mb": round(size), "batch_mb": batch, "num_proc": args.num_proc,
                         "tokens": n, "wall_s": round(wall, 1),
                         "peak_pss_mb": round(peak / 2**20)})  # fmt: skip
            corpus.unlink()
            for f in (root / "out").iterdir():
                f.unlink()
    if args.note:
        print(args.note)
    if args.json:
        args.json.write_text(json.dumps({"note": args.note, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
