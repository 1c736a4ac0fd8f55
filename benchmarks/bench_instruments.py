"""Step time with the stability instruments off and on, side by side, through the Trainer's step.

Two trainers with the same config (one with every observational instrument: activations,
gradients, attention_logits, qk_gains, spike_score; one with none) are built once and driven
alternately, one log window at a time (log_every steps, the last a log step whose values cross to
the host), so machine load hits both alike. Reports the min and median seconds per step of each
and the overhead of "on" over "off" at log_every 10 and at log_every 1 (every step logged).

    python benchmarks/bench_instruments.py                 # tiny and a larger CPU size
    python benchmarks/bench_instruments.py --sizes tiny --windows 6 --json out.json
    python benchmarks/bench_instruments.py --observers update_spikes   # one instrument alone
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from normlab.launch.config import load_config  # noqa: E402
from normlab.launch.training.host_rows import to_host  # noqa: E402
from normlab.launch.training.trainer import Trainer  # noqa: E402

OBSERVERS = ["activations", "gradients", "attention_logits", "qk_gains", "spike_score"]
SIZES = {
    "tiny": [],  # recipes/base/tiny.yaml: 4 layers, d 128, 4 heads, seq 128, batch 8
    "small": [  # a larger CPU size: 8 layers, d 256, 8 heads, seq 256, batch 8
        "model.n_layers=8",
        "model.d_model=256",
        "model.n_heads=8",
        "model.d_ff=704",
        "data.seq_len=256",
    ],
}


def build(
    size: str, log_every: int, on: bool, root: Path, threads: int, observers: list[str]
) -> Trainer:
    tag = f"{size}-{log_every}-{'on' if on else 'off'}"
    overrides = [
        *SIZES[size],
        "training.steps=100000",
        f"training.log_every={log_every}",
        "training.device=cpu",
        f"training.threads={threads}",
        "schedule.warmup_steps=0",
        f"run_dir={root / tag}",
    ]
    overrides += [f"instruments.{name}=true" for name in observers] if on else []
    trainer = Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides), console=Console())
    trainer._build()  # engine, model, data: what Trainer.run does before its loop
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
    return trainer


def window(trainer: Trainer, log_every: int) -> float:
    """Seconds per step over one log window: log_every steps, then the host copy of the log."""
    start = time.perf_counter()
    pending = []
    for _ in range(log_every):
        trainer.step += 1
        pending.append(trainer._train_step(trainer.step))
    to_host(pending)
    return (time.perf_counter() - start) / log_every


def bench(
    sizes: list[str], windows: int, threads: int, observers: list[str] = OBSERVERS
) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            for log_every in (10, 1):
                pair = {
                    on: build(size, log_every, on, Path(tmp), threads, observers)
                    for on in (False, True)
                }
                times: dict[bool, list[float]] = {False: [], True: []}
                n = windows if log_every > 1 else windows * 5
                for i in range(n + 1):
                    for on in (False, True) if i % 2 else (True, False):
                        t = window(pair[on], log_every)
                        if i > 0:  # the first window warms up both
                            times[on].append(t)
                row = {"size": size, "log_every": log_every, "windows": n}
                for stat, fn in (("median", statistics.median), ("min", min)):
                    off, on_t = fn(times[False]), fn(times[True])
                    row[f"{stat}_off_ms"], row[f"{stat}_on_ms"] = 1e3 * off, 1e3 * on_t
                    row[f"{stat}_overhead_pct"] = 100.0 * (on_t - off) / off
                results.append(row)
                print_row(row)  # as measured: a long run shows its rows as it goes
    return results


def print_row(r: dict) -> None:
    for stat in ("min", "median"):
        print(
            f"{r['size']:<6} {r['log_every']:>9} {stat:>6} {r[f'{stat}_off_ms']:>8.1f} "
            f"{r[f'{stat}_on_ms']:>8.1f} {r[f'{stat}_overhead_pct']:>8.1f}%",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small", help="comma list of: tiny, small")
    parser.add_argument("--windows", type=int, default=6, help="log windows per variant")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--observers",
        default=",".join(OBSERVERS),
        help="comma list of the instruments switched on (default: %(default)s)",
    )
    args = parser.parse_args()
    print("ms per step, instruments off vs on; min and median over interleaved log windows")
    print(f"{'size':<6} {'log_every':>9} {'stat':>6} {'off':>8} {'on':>8} {'overhead':>9}")
    results = bench(args.sizes.split(","), args.windows, args.threads, args.observers.split(","))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
