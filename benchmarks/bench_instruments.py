"""Step time with every observing instrument on against none, side by side, through the Trainer.

Trainers with the same tiny recipe (one with every observing instrument of launch/registry.py
on, one with none, and a control, also with none) are built once and driven in paired repeats:
each repeat runs one log window (log_every steps, the last a log step whose values cross to the
host) of each, their steps interleaved one by one (on, off, control, on, off, ...; the order
goes through every permutation in turn), so that the machine's slow phases, which last about
ten steps, hit every arm alike.
The overhead of a repeat is its "on" window's seconds per step over its "off" window's, minus
one, on the wall clock and on this process's CPU time (the default for the line below: on a
shared machine the wall time also counts the waits for a core, which drown a few percent); the
line printed is the median over the repeats:

    instruments overhead: X % at log_every 10 (95 % CI of the median A .. B, N pairs)

The interval is distribution-free (order statistics of the pair overheads, binomial coverage >=
95 %), and a bound such as "X <= 5" holds when B <= 5. A third trainer with no instruments
(the control) runs interleaved with the two; its line, control/off - 1 the same way, is an A/A
comparison, the bench's own noise floor and bias: it should straddle 0 (`--no-control` drops it).
The FP8 row does the same with precision.fp8 (emulated on a CPU) and the fp8 instrument added.
The actions (spike_policy, fp16_clamp, early_warning) and init_loss are not observers and stay
off. update_spikes measures every step by definition (launch/instruments/updates.py): it is on
unless `--without update_spikes`, and its own cost is what `--only update_spikes` prints.

    python benchmarks/bench_instruments.py                         # tiny, fp32, CPU
    python benchmarks/bench_instruments.py --repeats 15 --fp8 --json out.json
    python benchmarks/bench_instruments.py --only fp8 --fp8-only   # the FP8 instrument's cost
    python benchmarks/bench_instruments.py --only update_spikes    # one instrument alone
    python benchmarks/bench_instruments.py --attribute 10          # what each instrument costs
"""

from __future__ import annotations

import argparse
import itertools
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


def build(
    size: str,
    log_every: int,
    names: list[str],
    fp8: bool,
    root: Path,
    threads: int,
    before_start=None,  # noqa: ANN001 (a function of the Trainer, run before the callbacks start)
):
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
    if before_start is not None:
        before_start(trainer)
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
    control: bool = True,
):
    """Median over paired repeats of on/off - 1 (percent), with the medians of each arm; with
    `control`, a third trainer with no instruments ("control") runs interleaved with the two, and
    control/off - 1 (an A/A pair, the bench's own noise floor) is reported the same way."""
    arms = ["off", "on"] + (["control"] if control else [])
    orders = list(itertools.permutations(arms))  # each repeat the next order: all used alike
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {
            arm: build(
                size,
                log_every,
                names + (["fp8"] if fp8 else []) if arm == "on" else [],
                fp8,
                Path(tmp) / arm,
                threads,
            )
            for arm in arms
        }
        interleaved_window(trainers, tuple(arms), log_every)  # warm-up: allocator, dispatch
        pairs = [
            interleaved_window(trainers, orders[i % len(orders)], log_every)
            for i in range(repeats)
        ]
    row: dict = {
        "size": size,
        "fp8": fp8,
        "log_every": log_every,
        "instruments": names + (["fp8"] if fp8 else []),
        "repeats": repeats,
    }
    for k, clock in enumerate(("wall", "cpu")):
        row[f"{clock}_median_off_ms"] = 1e3 * statistics.median(p["off"][k] for p in pairs)
        row[f"{clock}_median_on_ms"] = 1e3 * statistics.median(p["on"][k] for p in pairs)
        for arm, label in (("on", "overhead"), ("control", "control")):
            if arm not in arms:
                continue
            ratios = [p[arm][k] / p["off"][k] - 1.0 for p in pairs]
            row[f"{clock}_{label}_pct"] = 100.0 * statistics.median(ratios)
            row[f"{clock}_pair_{label}s_pct"] = [100.0 * r for r in ratios]
            lo, hi = median_ci(ratios)
            row[f"{clock}_{label}_ci95_pct"] = [100.0 * lo, 100.0 * hi]
    return row


def attribute(size: str, log_every: int, names: list[str], fp8: bool, windows: int, threads: int):
    """CPU milliseconds per log window spent in each instrument's callback methods, forward hooks
    and attention-probe readers (every registration made while one of its callbacks runs is
    timed; each call's own time, its timed calls inside left to them), and in the attention
    probe's shared recomputation, over `windows` windows of the "on" trainer; and the window's
    total."""
    from normlab.launch.instruments import attention_probe
    from torch import nn

    spent: dict[str, float] = {}  # exclusive CPU seconds: a timed call inside another is its own
    owner: list[str] = []
    children: list[float] = []  # per open timed call: the time of the timed calls inside it

    def timed(fn, tag: str):  # noqa: ANN001, ANN202
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.process_time()
            children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.process_time() - start
                inner = children.pop()
                spent[tag] = spent.get(tag, 0.0) + elapsed - inner
                if children:
                    children[-1] += elapsed

        return run

    originals = {m: getattr(nn.Module, m) for m in ("register_forward_hook",
                                                    "register_forward_pre_hook")}  # fmt: skip
    add = attention_probe._Probe.add

    def register(method: str):  # noqa: ANN202
        def patched(module, hook, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if getattr(hook, "__func__", None) is attention_probe._Probe._hook:
                hook = timed(hook, "attention probe (S, P once for its readers)")
            elif owner:
                hook = timed(hook, f"{owner[-1]} hooks")
            return originals[method](module, hook, *args, **kwargs)

        return patched

    def subscribed(probe, read, weights):  # noqa: ANN001, ANN202
        return add(probe, timed(read, f"{owner[-1]} probe reader") if owner else read, weights)

    def owned(fn, name: str, method: str):  # noqa: ANN001, ANN202
        inner = timed(fn, f"{name} {method}")

        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            owner.append(name)
            try:
                return inner(*args, **kwargs)
            finally:
                owner.pop()

        return run

    for method in originals:
        setattr(nn.Module, method, register(method))
    attention_probe._Probe.add = subscribed  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:

            def wrap(trainer: Trainer) -> None:
                for cb in trainer.callbacks:
                    for method in ("on_train_start", "on_after_backward", "on_step_end"):
                        if method in type(cb).__dict__:
                            setattr(cb, method, owned(getattr(cb, method), cb.name, method))

            names = names + (["fp8"] if fp8 else [])
            on = build(size, log_every, names, fp8, Path(tmp), threads, before_start=wrap)
            interleaved_window({"on": on}, ("on",), log_every)
            spent.clear()
            total = sum(
                interleaved_window({"on": on}, ("on",), log_every)["on"][1] * log_every
                for _ in range(windows)
            )
    finally:
        for method, original in originals.items():
            setattr(nn.Module, method, original)
        attention_probe._Probe.add = add  # type: ignore[method-assign]
    return {tag: 1e3 * v / windows for tag, v in spent.items()}, 1e3 * total / windows


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


def report(row: dict) -> list[str]:
    """The lines printed for one row: both clocks' medians, then the overhead line (and the A/A
    control's) on the row's clock. `--from-json` prints them again from a saved run."""
    label = f"{row['size']}{' fp8' if row['fp8'] else ''}"
    lines = []
    for clock in ("wall", "cpu"):
        spread = row[f"{clock}_pair_overheads_pct"]
        lines.append(
            f"{label} {clock}: off {row[f'{clock}_median_off_ms']:.1f} ms/step, on "
            f"{row[f'{clock}_median_on_ms']:.1f} ms/step (medians); overhead "
            f"{row[f'{clock}_overhead_pct']:+.1f} % (pairs {min(spread):+.1f} .. "
            f"{max(spread):+.1f} %)"
        )
    clock = row.get("clock", "cpu")
    prefix = ("" if row["size"] == "tiny" else f"{row['size']} ") + ("FP8 " if row["fp8"] else "")
    lo, hi = row[f"{clock}_overhead_ci95_pct"]
    lines.append(
        f"{prefix}instruments overhead: {row[f'{clock}_overhead_pct']:.1f} % at log_every "
        f"{row['log_every']} (95 % CI of the median {lo:+.1f} .. {hi:+.1f} %, "
        f"{row['repeats']} pairs)"
    )
    if f"{clock}_control_pct" in row:
        lo, hi = row[f"{clock}_control_ci95_pct"]
        lines.append(
            f"{prefix}A/A control (a third trainer, no instruments, against off): "
            f"{row[f'{clock}_control_pct']:+.1f} % (95 % CI of the median {lo:+.1f} .. "
            f"{hi:+.1f} %)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny", help="comma list of: tiny, small")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15, help="paired windows per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 row (needs torchao)")
    parser.add_argument("--fp8-only", action="store_true", help="only the FP8 row")
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
        "--no-control",
        dest="control",
        action="store_false",
        help="leave out the A/A control arm (a second trainer with no instruments)",
    )
    parser.add_argument(
        "--attribute",
        type=int,
        default=0,
        metavar="WINDOWS",
        help="instead: CPU ms per log window of each instrument's callbacks, hooks and probe "
        "readers, over this many windows of the 'on' trainer",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--from-json", type=Path, help="print the lines of a saved run (--json) and stop"
    )
    args = parser.parse_args()
    precisions = (True,) if args.fp8_only else (False, True) if args.fp8 else (False,)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print(f"$ {saved['command']}   (1-min load {saved['load_1min_at_start']:.1f} at start)")
        for row in saved["rows"]:
            print("\n".join(report(row)))
        return
    names = args.only.split(",") if args.only else OBSERVERS
    names = [n for n in names if n not in args.without.split(",")]
    load = os.getloadavg()[0]
    print(
        f"instruments on: {', '.join(names)}; {args.repeats} paired repeats; 1-min load {load:.1f}"
    )
    if args.attribute:
        for size in args.sizes.split(","):
            for fp8 in precisions:
                spent, total = attribute(
                    size, args.log_every, names, fp8, args.attribute, args.threads
                )
                print(f"{size}{' fp8' if fp8 else ''}: {total:.1f} ms per log window (CPU)")
                for tag, ms in sorted(spent.items(), key=lambda kv: -kv[1]):
                    print(f"  {ms:8.2f} ms  {100 * ms / total:5.2f} %  {tag}")
                share = sum(spent.values()) / total
                print(f"  {sum(spent.values()):8.2f} ms  {100 * share:5.2f} %  every instrument")
        return
    rows = []
    for size in args.sizes.split(","):
        for fp8 in precisions:
            row = paired(
                size, args.log_every, names, fp8, args.repeats, args.threads, args.control
            )
            row["clock"] = args.clock
            rows.append(row)
            print("\n".join(report(row)), flush=True)
    if args.json:
        meta = {"command": " ".join(sys.argv), "load_1min_at_start": load, "cpus": os.cpu_count()}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
