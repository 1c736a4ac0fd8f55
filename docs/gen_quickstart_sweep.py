"""The quickstart sweep's numbers, from the runs `normlab quickstart` wrote (no hand-copied value).

    normlab quickstart --out /tmp/qs/s0                  # and training.seed=1, 2 into s1, s2
    python docs/gen_quickstart_sweep.py --runs /tmp/qs   # read the runs: results.json + the page
    python docs/gen_quickstart_sweep.py                  # rewrite the page from results.json
    python docs/gen_quickstart_sweep.py --check          # exit 1 when the page is stale

--runs reads every `RUNS/s<seed>/<recipe>/` run directory through compare's own reader (the
values compare prints: final training loss, max gradient norm, activation growth, max attention
logit) plus the eval losses every 50 steps, and the unigram plateau of the data the runs trained
on; it writes docs/quickstart_sweep/results.json. The generated blocks of
docs/quickstart_sweep.md (between `<!-- normlab:quickstart-sweep NAME -->` and
`<!-- /normlab:quickstart-sweep -->`) are built from that file alone; tests/test_docs_site.py
fails when they differ.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "quickstart_sweep.md"
RESULTS = DOCS / "quickstart_sweep" / "results.json"
RECIPES = ["post_nowarmup", "post_warmup", "pre_nowarmup", "deepnorm_warmup"]
EVAL_STEPS = [50, 100, 150, 200, 250]
BLOCK = re.compile(
    r"(<!-- normlab:quickstart-sweep (\S+) -->\n)(.*?)(<!-- /normlab:quickstart-sweep -->)", re.S
)


def read_runs(root: Path) -> dict[str, Any]:
    """results.json's content from RUNS/s<seed>/<recipe>/ (compare's reader and row)."""
    from normlab.launch.config import load_config
    from normlab.launch.report.table import summarize
    from normlab.launch.rundir.runs import load_run
    from normlab.launch.stats.separation import TRAINED_MARGIN
    from normlab.launch.study.unigram import dataset_unigram_loss
    from normlab.launch.training.datasets import resolve_dataset

    rows, plateau, steps = [], None, set()
    for seed_dir in sorted(root.glob("s[0-9]*"), key=lambda p: int(p.name[1:])):
        for recipe in RECIPES:
            run_dir = seed_dir / recipe
            run = load_run(run_dir)
            row = summarize(run)
            evals = {int(e["step"]): e["eval_loss"] for e in run.evals}
            rows.append({
                "recipe": recipe,
                "seed": row["seed"],
                "status": row["status"],
                "eval": {str(s): evals.get(s) for s in EVAL_STEPS},
                "final_loss": row["final_loss"],
                "grad_max": row["grad_max"],
                "act_growth": row["act_growth"],
                "max_logit": row["max_logit"],
            })  # fmt: skip
            steps.add(row["steps"])
            if plateau is None:
                cfg = load_config(run_dir / "config.yaml", [])
                plateau = dataset_unigram_loss(resolve_dataset(cfg.data))
    if not rows:
        raise SystemExit(f"no s<seed>/<recipe>/ run directories under {root}")
    return {"plateau": plateau, "trained_margin": TRAINED_MARGIN, "steps": sorted(steps),
            "runs": rows}  # fmt: skip


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _trained(run: dict[str, Any], data: dict[str, Any]) -> bool:
    """The study report's rule (launch.stats.separation.trained) on the last evaluation."""
    from normlab.launch.stats.separation import trained

    last = run["eval"][str(EVAL_STEPS[-1])]
    return last is not None and trained(last, data["plateau"], data["trained_margin"])


def per_seed(data: dict[str, Any]) -> list[str]:
    head = " | ".join(f"eval {s}" for s in EVAL_STEPS)
    lines = [
        f"| recipe | seed | {head} | final train loss | max grad norm | act. growth | max logit |",
        "|---|---:|" + "---:|" * (len(EVAL_STEPS) + 4),
    ]
    for r in data["runs"]:
        evals = " | ".join(_f(r["eval"][str(s)]) for s in EVAL_STEPS)
        lines.append(
            f"| {r['recipe']} | {r['seed']} | {evals} | {_f(r['final_loss'])} | "
            f"{_f(r['grad_max'], 2)} | {_f(r['act_growth'], 2)} | {_f(r['max_logit'], 1)} |"
        )
    return lines


def over_seeds(data: dict[str, Any]) -> list[str]:
    shown = [100, 200, 250]
    lines = [
        "| recipe | seeds | " + " | ".join(f"eval {s}" for s in shown) + " |",
        "|---|---:|" + "---:|" * len(shown),
    ]
    for recipe in RECIPES:
        runs = [r for r in data["runs"] if r["recipe"] == recipe]
        cells = []
        for s in shown:
            xs = [r["eval"][str(s)] for r in runs if r["eval"][str(s)] is not None]
            sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
            cells.append(f"{statistics.mean(xs):.3f} +- {sd:.3f} [{min(xs):.3f}, {max(xs):.3f}]")
        lines.append(f"| {recipe} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def findings(data: dict[str, Any]) -> list[str]:
    """One line per recipe: on how many seeds it trained, and its eval losses at the last step;
    then the instruments of the runs that trained against those that did not."""
    last, bar = str(EVAL_STEPS[-1]), data["plateau"] - data["trained_margin"]
    lines = [
        f"Trained means an eval loss at step {last} at or below the unigram plateau "
        f"{data['plateau']:.3f} minus {data['trained_margin']:g} (<= {bar:.3f}), the rule of "
        "compare and the study report.",
        "",
    ]
    ok = [_trained(r, data) for r in data["runs"]]
    for recipe in RECIPES:
        runs = [r for r in data["runs"] if r["recipe"] == recipe]
        k = sum(t for r, t in zip(data["runs"], ok, strict=True) if r["recipe"] == recipe)
        values = ", ".join(f"{r['eval'][last]:.3f}" for r in runs)
        seeds = ", ".join(str(r["seed"]) for r in runs)
        lines.append(
            f"- **{recipe}** trained on {k} of {len(runs)} seeds: eval {values} at step {last} "
            f"(seeds {seeds})."
        )
    stalled = [r for r, t in zip(data["runs"], ok, strict=True) if not t]
    trained = [r for r, t in zip(data["runs"], ok, strict=True) if t]
    if stalled and trained:

        def span(rs: list[dict[str, Any]], key: str, d: int) -> str:
            xs = [r[key] for r in rs if r[key] is not None]
            return f"{min(xs):.{d}f}-{max(xs):.{d}f}" if xs else "-"

        lines += [
            f"- **Max attention logit**: {span(stalled, 'max_logit', 1)} in the "
            f"{len(stalled)} runs that did not train, {span(trained, 'max_logit', 1)} in the "
            f"{len(trained)} that did.",
        ]
    for recipe in RECIPES:
        runs = [r for r in data["runs"] if r["recipe"] == recipe and r["act_growth"] is not None]
        if runs:
            xs = [r["act_growth"] for r in runs]
            lines.append(
                f"- **Activation growth** (residual RMS at the last block over the first), "
                f"{recipe}: {min(xs):.2f}-{max(xs):.2f}x."
            )
    return lines


RENDER = {"per-seed": per_seed, "over-seeds": over_seeds, "findings": findings}


def render_page(text: str, data: dict[str, Any]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in RENDER:
            raise SystemExit(f"{PAGE}: unknown block {name!r}; known: {', '.join(RENDER)}")
        return m.group(1) + "\n".join(RENDER[name](data)) + "\n" + m.group(4)

    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="parent of s<seed>/ quickstart outputs to read")
    p.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = p.parse_args(argv)
    if args.runs is not None:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(read_runs(args.runs), indent=1) + "\n")
    data = json.loads(RESULTS.read_text())
    text = PAGE.read_text()
    new = render_page(text, data)
    if args.check:
        if new != text:
            print(f"{PAGE} is stale: run python docs/gen_quickstart_sweep.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
