"""`normlab verdicts` on a large table, against the exact enumeration: `python
benchmarks/bench_verdicts.py [--recipes 50 --lrs 20 --seeds 100]`.

Builds a synthetic results table (every recipe a noisy parabola over a log-spaced lr grid, seed
noise 0.3 nats, runs above 7.5 diverged), times `normlab verdicts` on it end to end in a fresh
interpreter (every recipe pair, three claims each: 3675 claims at the default size), and reports
how its permutation p-values were found (exact, sequential Monte-Carlo with its MC error, or
skipped where Welch decides). Then the exact way on a smaller case: claim (a)'s permutation p by
enumerating every relabelling of 9 + 9 seeds (48,620, each redoing the cross-fitted selection)
against the sequential Monte-Carlo p, times and p's side by side, with scipy.stats.
permutation_test (exact) on the per-seed values as the reference for (b).
Wall-clock numbers need idle cores: on a shared machine say so (--note). Not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_table(path: Path, recipes: int, lrs: int, seeds: int) -> None:
    rng = np.random.default_rng(0)
    grid = np.geomspace(1e-4, 1e-1, lrs)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["recipe", "lr", "seed", "eval_loss", "status", "l0"])
        for r in range(recipes):
            best, curve = rng.uniform(0.3, 0.7) * lrs, rng.uniform(0.005, 0.02)
            for g, lr in enumerate(grid):
                for s in range(seeds):
                    loss = 3.0 + 0.01 * r + curve * (g - best) ** 2 + rng.normal(0, 0.3)
                    bad = loss > 7.5
                    w.writerow([f"r{r:02d}", f"{lr:.6g}", s, "nan" if bad else f"{loss:.5f}",
                                "diverged" if bad else "completed", "10.8"])  # fmt: skip


def time_command(table: Path, out: Path) -> tuple[float, float, list[dict]]:
    """Wall and CPU seconds of `normlab verdicts` in a fresh interpreter, and its verdicts."""
    cmd = [sys.executable, "-m", "normlab.launch.cli", "verdicts", str(table), "--plateau",
           "4.0", "--out", str(out)]  # fmt: skip
    start = time.perf_counter()
    before = _children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - start, _children_cpu() - before
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    sys.stderr.write(done.stderr)
    return wall, cpu, json.loads((out / "verdicts.json").read_text())


def _children_cpu() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def exact_against_mc(seeds: int) -> list[str]:
    """Claim (a)'s permutation p on `seeds` + `seeds` seed-runs: enumerated against sequential
    MC; claim (b)'s per-seed p against scipy.stats.permutation_test (exact)."""
    from normlab.launch.stats import statistics as st
    from normlab.launch.stats.sequential_mc import sequential_p
    from normlab.launch.verdicts import decide as dc
    from normlab.launch.verdicts import family as vc
    from normlab.launch.verdicts.permutation_mc import mc_min_p
    from scipy import stats

    rng = np.random.default_rng(1)
    g = np.arange(12)
    xa = 3.0 + 0.01 * (g - 5) ** 2 + rng.normal(0, 0.3, (seeds, 12))
    xb = 3.05 + 0.01 * (g - 6) ** 2 + rng.normal(0, 0.3, (seeds, 12))
    a, b = vc.cross_fitted(xa)[0], vc.cross_fitted(xb)[0]
    count = math.comb(2 * seeds, seeds)
    old = st.EXACT_LIMIT
    st.EXACT_LIMIT = count  # enumerate every relabelling
    st.relabellings.cache_clear()
    try:
        t = time.perf_counter()
        exact = dc._permutation_min_p(vc.LOSS, xa, xb, a, b, 0.1)
        exact_s = time.perf_counter() - t
    finally:
        st.EXACT_LIMIT = old
        st.relabellings.cache_clear()
    t = time.perf_counter()
    mc = mc_min_p(vc.LOSS, xa, xb, 0.1)
    mc_s = time.perf_counter() - t
    sa, sb = vc.seed_sensitivity(xa), vc.seed_sensitivity(xb)
    ref = stats.permutation_test(
        (sa, sb), lambda x, y: x.mean() - y.mean(), permutation_type="independent",
        alternative="less", n_resamples=np.inf,
    ).pvalue  # fmt: skip
    pooled, obs = np.concatenate([sa, sb]), sa.mean() - sb.mean()

    def lower(mask: np.ndarray) -> np.ndarray:  # the A-lower tail of the mean difference
        d = (mask @ pooled) / seeds - ((~mask) @ pooled) / seeds
        return (d <= obs + 1e-12)[:, None]

    (mine,) = sequential_p(lower, 2 * seeds, seeds)
    return [
        f"(a) {seeds}+{seeds} seeds: exact enumeration of {count:,} relabellings p {exact:.4g} in "
        f"{exact_s:.2f} s; sequential MC p {mc.p:.4g} ({mc.text()}) in {mc_s:.3f} s: "
        f"{exact_s / mc_s:.0f}x faster, |diff| {abs(mc.p - exact):.3g} = "
        f"{abs(mc.p - exact) / mc.se:.2f} MC SE",
        f"(b) per-seed S, A lower: scipy.stats.permutation_test exact p {ref:.4g}; sequential "
        f"MC p {mine.p:.4g} ({mine.text()}), |diff| {abs(mine.p - ref) / mine.se:.2f} MC SE",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", type=int, default=50)
    ap.add_argument("--lrs", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--exact-seeds", type=int, default=9, help="per arm, for the exact case")
    ap.add_argument("--note", default="", help="e.g. 'shared machine, 8 other jobs'")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "results.csv"
        write_table(table, args.recipes, args.lrs, args.seeds)
        wall, cpu, verdicts = time_command(table, Path(tmp) / "out")
    how: dict[str, int] = {}
    for v in verdicts:
        note = v.get("permutation_note") or ""
        key = "skipped (Welch decides)" if "skipped" in note else note.split(",")[0]
        if v["statistic"] == "trained_range":
            key = "trained_range, counted exactly"
        how[key or "no permutation p"] = how.get(key or "no permutation p", 0) + 1
    print(
        f"normlab verdicts, {args.recipes} recipes x {args.lrs} lrs x {args.seeds} seeds "
        f"({len(verdicts)} claims): {wall:.1f} s wall, {cpu:.1f} s CPU"
        + (f" [{args.note}]" if args.note else "")
    )
    print("permutation p: " + ", ".join(f"{k} {n}" for k, n in how.items()))
    for text in exact_against_mc(args.exact_seeds):
        print(text)


if __name__ == "__main__":
    main()
