"""Step time with every observing instrument on against none, side by side, through the Trainer.

Two trainers with the same tiny recipe (one with every observing instrument of
launch/registry.py on, one with none) are built once and driven in paired repeats: each repeat
runs one log window (log_every steps, the last a log step whose values cross to the host) of
each, their steps interleaved one by one (on, off, on, off, ...; which goes first alternates
between repeats), so that the machine's slow phases, which last about ten steps, hit both alike.
The overhead of a repeat is its "on" window's seconds per step over its "off" window's, minus
one, on the wall clock and on this process's CPU time (the default for the line below: on a
shared machine the wall time also counts the waits for a core, which drown a few percent); the
line printed is the median over the repeats:

    instruments overhead: X % at log_every 10 (95 % CI of the median A .. B, N pairs)

The interval is distribution-free (order statistics of the pair overheads, binomial coverage >=
95 %), and a bound such as "X <= 5" holds when B <= 5. `--control` runs the same with no
instruments in either arm (an A/A pair): its interval is the bench's own noise floor.
The FP8 row does the same with precision.fp8 (emulated on a CPU) and the fp8 instrument added.
The actions (spike_policy, fp16_clamp, early_warning) and init_loss are not observers and stay
off. update_spikes measures every step by definition (launch/instruments/updates.py): it is on
unless `--without update_spikes`, and its own cost is what `--only update_spikes` prints.

    python benchmarks/bench_instruments.py                         # tiny, fp32, CPU
    python benchmarks/bench_instruments.py --repeats 15 --fp8 --json out.json
    python benchmarks/bench_instruments.py --only update_spikes    # one instrument alone
    python benchmarks/bench_instruments.py --control               # A/A: the noise floor
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from normlab.launch.config import load_config  # noqa: E402
from normlab.launch.registry import INSTRUMENTS  # noqa: E402
from normlab.launch.training.host_rows import to_host  # noqa: E402
from normlab.launch.training.trainer import Trainer  # noqa: E402

NOT_OBSERVERS = {"spike_policy", "fp16_clamp", "early_warning", "init_loss", "fp8"}
OBSERVERS = sorted(set(INSTRUMENTS) - NOT_OBSERVERS)  # fp8: added on the FP8 row
SIZES = {
    "tiny": ["model.qk_norm=head"],  # recipes/base/tiny.yaml (+ QK-Norm: qk_gains logs)
    "small": [  # a larger CPU size: 8 layers, d 256, 8 heads, seq 256, batch 8
        "model.qk_norm=head",
        "model.n_layers=8",
        "model.d_model=256",
        "model.n_heads=8",
        "model.d_ff=704",
        "data.seq_len=256",
    ],
}


def build(size: str, log_every: int, names: list[str], fp8: bool, root: Path, threads: int):
    """A Trainer ready to step (engine, model, data built; callbacks started)."""
    tag = f"{size}-{log_every}-{'fp8' if fp8 else 'plain'}-{len(names)}"
    overrides = [
        *SIZES[size],
        "training.steps=100000",
        f"training.log_every={log_every}",
        "training.device=cpu",
        f"training.threads={threads}",
        "schedule.warmup_steps=0",
        "instruments={}",
        f"run_dir={root / tag}",
        *[f"instruments.{name}=true" for name in names],
    ]
    overrides += ["precision.fp8={}"] if fp8 else []
    trainer = Trainer(load_config(REPO / "recipes" / "pre.yaml", overrides), console=Console())
    trainer._build()  # engine, model, data: what Trainer.run does before its loop
    for cb in trainer.callbacks:
        cb.on_train_start(trainer)
    return trainer


def interleaved_window(
    trainers: dict[str, Trainer], order: tuple[str, str], log_every: int
) -> dict[str, tuple[float, float]]:
    """One log window of each trainer, their steps interleaved one by one in `order` (the last
    of each a log step, then each one's host copy of the log): {name: (wall, CPU) seconds per
    step}. Interleaving step by step spreads the machine's slow phases (which last ~10 steps)
    over both arms alike; CPU is this process's (time.process_time), which on a shared machine
    does not count the waits for a core that the wall time does."""
    wall = dict.fromkeys(order, 0.0)
    cpu = dict.fromkeys(order, 0.0)
    pending: dict[str, list] = {name: [] for name in order}

    def timed(name: str, work) -> None:  # noqa: ANN001
        start, start_cpu = time.perf_counter(), time.process_time()
        work()
        wall[name] += time.perf_counter() - start
        cpu[name] += time.process_time() - start_cpu

    for _ in range(log_every):
        for name in order:
            trainer = trainers[name]

            def step(trainer: Trainer = trainer, name: str = name) -> None:
                trainer.step += 1
                pending[name].append(trainer._train_step(trainer.step))

            timed(name, step)
    for name in order:
        timed(name, lambda name=name: to_host(pending[name]))
    return {name: (wall[name] / log_every, cpu[name] / log_every) for name in order}


def paired(
    size: str,
    log_every: int,
    names: list[str],
    fp8: bool,
    repeats: int,
    threads: int,
    control: bool = False,
):
    """Median over paired repeats of on/off - 1 (percent), with the medians of each arm. With
    `control`, the "on" arm is a second trainer with no instruments (an A/A pair: the bench's
    own noise floor)."""
    with tempfile.TemporaryDirectory() as tmp:
        off = build(size, log_every, [], fp8, Path(tmp), threads)
        on_names = [] if control else names + (["fp8"] if fp8 else [])
        on = build(size, log_every, on_names, fp8, Path(tmp) / "on", threads)
        arms = {"off": off, "on": on}
        interleaved_window(arms, ("off", "on"), log_every)  # warm-up: allocator, dispatch
        pairs: list[dict[str, tuple[float, float]]] = []
        for i in range(repeats):
            order = ("off", "on") if i % 2 else ("on", "off")
            pairs.append(interleaved_window(arms, order, log_every))
    row: dict = {
        "size": size,
        "fp8": fp8,
        "log_every": log_every,
        "instruments": on_names,
        "control": control,
        "repeats": repeats,
    }
    for k, clock in enumerate(("wall", "cpu")):
        ratios = [p["on"][k] / p["off"][k] - 1.0 for p in pairs]
        row[f"{clock}_median_off_ms"] = 1e3 * statistics.median(p["off"][k] for p in pairs)
        row[f"{clock}_median_on_ms"] = 1e3 * statistics.median(p["on"][k] for p in pairs)
        row[f"{clock}_overhead_pct"] = 100.0 * statistics.median(ratios)
        row[f"{clock}_pair_overheads_pct"] = [100.0 * r for r in ratios]
        lo, hi = median_ci(ratios)
        row[f"{clock}_overhead_ci95_pct"] = [100.0 * lo, 100.0 * hi]
    return row


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: [x_(k), x_(n-k+1)] of the sorted values, k the
    binomial(n, 1/2) quantile at (1 - confidence) / 2 (coverage >= confidence); infinite when n
    is too small for one (n < 6 at 95 %)."""
    from scipy import stats

    xs, n = sorted(values), len(values)
    k = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))
    if k < 1 or stats.binom.cdf(k - 1, n, 0.5) > (1 - confidence) / 2:
        k -= 1
    if k < 1:
        return -math.inf, math.inf
    return xs[k - 1], xs[n - k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny", help="comma list of: tiny, small")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15, help="paired windows per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 row (needs torchao)")
    parser.add_argument("--without", default="", help="comma list of observers left off")
    parser.add_argument("--only", default="", help="comma list: just these observers on")
    parser.add_argument(
        "--clock",
        default="cpu",
        choices=["cpu", "wall"],
        help="the clock of the overhead line: cpu (this process's CPU time, steady under load; "
        "with --threads 1 the training's own) or wall",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A run: the 'on' arm has no instruments either (the bench's noise floor)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else OBSERVERS
    names = [n for n in names if n not in args.without.split(",")]
    load = os.getloadavg()[0]
    on = "none (A/A control)" if args.control else ", ".join(names)
    print(f"instruments on: {on}; {args.repeats} paired repeats; 1-min load {load:.1f}")
    rows = []
    for size in args.sizes.split(","):
        for fp8 in (False, True) if args.fp8 else (False,):
            row = paired(
                size, args.log_every, names, fp8, args.repeats, args.threads, args.control
            )
            rows.append(row)
            label = f"{size}{' fp8' if fp8 else ''}"
            for clock in ("wall", "cpu"):
                spread = row[f"{clock}_pair_overheads_pct"]
                print(
                    f"{label} {clock}: off {row[f'{clock}_median_off_ms']:.1f} ms/step, on "
                    f"{row[f'{clock}_median_on_ms']:.1f} ms/step (medians); overhead "
                    f"{row[f'{clock}_overhead_pct']:+.1f} % (pairs {min(spread):+.1f} .. "
                    f"{max(spread):+.1f} %)",
                    flush=True,
                )
            prefix = ("" if size == "tiny" else f"{size} ") + ("FP8 " if fp8 else "")
            if args.control:
                prefix = "A/A control (no instruments in either arm): " + prefix
            lo, hi = row[f"{args.clock}_overhead_ci95_pct"]
            print(
                f"{prefix}instruments overhead: {row[f'{args.clock}_overhead_pct']:.1f} % at "
                f"log_every {args.log_every} (95 % CI of the median {lo:+.1f} .. {hi:+.1f} %, "
                f"{args.repeats} pairs)",
                flush=True,
            )
    if args.json:
        meta = {"command": " ".join(sys.argv), "load_1min_at_start": load, "cpus": os.cpu_count()}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
