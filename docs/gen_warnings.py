"""The early-warning result page, from the divergence sweep's runs (no hand-copied value).

    normlab study divergence --out DIR --jobs 2            # the sweep (recipes/studies/)
    python docs/gen_warnings.py --runs DIR... --time-s T   # pack the runs, evaluate, write
    python docs/gen_warnings.py                            # re-evaluate the packed runs
    python docs/gen_warnings.py --check                    # exit 1 when a committed file differs
    normlab study divergence_actions --out DIR --jobs 2    # the online actions (issue 32 item 6)
    python docs/gen_warnings.py --action-runs DIR --action-time-s T   # pack them
    normlab study divergence_actions_heldout --out DIR --jobs 2   # held out, placebo (issue 49)
    python docs/gen_warnings.py --heldout-runs DIR --heldout-time-s T   # pack them

--runs packs every run below DIR (its resolved config, summary.json and metrics.jsonl, the
per-step speed columns left out) into docs/warnings/divergence/runs.jsonl.gz. Every other file
is built from that bundle alone: the runs are unpacked into a temporary directory and
`normlab warnings` (launch.warning.report.run_warnings) evaluates them, so warnings.md,
warnings.json and the figure are what the tool writes; docs/early_warning.md's generated blocks
(between `<!-- normlab:warnings NAME -->` and `<!-- /normlab:warnings -->`) hold the sweep's
event table and the tool's table. The action study's runs are packed the same way into
docs/warnings/divergence_actions/runs.jsonl.gz, and its block sets each run against its twin in
the sweep (same rate and seed, no early warning: launch.warning.actions). The held-out action
study (seeds 6-9, never used to tune or choose the signals) is packed into
docs/warnings/divergence_actions_heldout/ and carries its own twins: each back-off and placebo run
is set against the twin arm of the same rate and seed, and the two arms against each other
(launch.warning.actions.paired); until it is packed its block says so.
tests/test_docs_site.py fails when any of them differs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
OUT = DOCS / "warnings" / "divergence"
BUNDLE = OUT / "runs.jsonl.gz"
META = OUT / "sweep.json"
ACTIONS = DOCS / "warnings" / "divergence_actions"
ACTIONS_BUNDLE, ACTIONS_META = ACTIONS / "runs.jsonl.gz", ACTIONS / "sweep.json"
HELDOUT = DOCS / "warnings" / "divergence_actions_heldout"
HELDOUT_BUNDLE, HELDOUT_META = HELDOUT / "runs.jsonl.gz", HELDOUT / "sweep.json"
PAGE = DOCS / "early_warning.md"
README = DOCS.parent / "README.md"
TEXT_FILES = ("warnings.md", "warnings.json")
SPEED = ("step_time", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
BLOCK = re.compile(r"(<!-- normlab:warnings (\S+) -->\n)(.*?)(<!-- /normlab:warnings -->)", re.S)


def pack(root: Path) -> list[dict[str, Any]]:
    """One record per run below `root`: its directory name, config, summary and metric rows."""
    import yaml
    from normlab.launch.rundir.runfiles import read_metrics
    from normlab.launch.warning.evaluate import find_run_dirs

    records = []
    for run_dir in find_run_dirs([root]):
        rows = [
            {k: v for k, v in row.items() if k not in SPEED}
            for row in read_metrics(run_dir / "metrics.jsonl")
        ]
        records.append({
            "name": run_dir.name,
            "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
            "summary": json.loads((run_dir / "summary.json").read_text()),
            "metrics": rows,
        })  # fmt: skip
    return records


def write_bundle(records: list[dict[str, Any]], path: Path = BUNDLE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    with gzip.GzipFile(path, "wb", mtime=0) as fh:  # mtime 0: the same runs, the same bytes
        fh.write(text.encode())


def read_bundle(path: Path = BUNDLE) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def unpack(records: list[dict[str, Any]], root: Path) -> Path:
    """Run directories `root/runs/NAME` that `normlab warnings` reads as the sweep's own."""
    import yaml

    runs = root / "runs"
    for r in records:
        d = runs / r["name"]
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump(r["config"], sort_keys=False))
        (d / "summary.json").write_text(json.dumps(r["summary"]))
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in r["metrics"]))
    return runs


def evaluate(records: list[dict[str, Any]], out: Path) -> dict[str, str]:
    """Unpack, run `normlab warnings`' evaluation, copy what it wrote into `out`; the text files,
    with the temporary run paths replaced by the runs' names. It writes into a fresh folder first:
    `normlab warnings --out` refuses a folder holding other files (here the bundle)."""
    import shutil

    from normlab.launch.warning.report import run_warnings

    with tempfile.TemporaryDirectory() as tmp:
        runs = unpack(records, Path(tmp))
        fresh = Path(tmp) / "out"
        run_warnings([str(runs)], fresh)
        texts = {f: (fresh / f).read_text().replace(f"{runs}/", "") for f in TEXT_FILES}
        out.mkdir(parents=True, exist_ok=True)
        for png in fresh.glob("*.png"):
            shutil.copyfile(png, out / png.name)
    for f, text in texts.items():
        (out / f).write_text(text)
    return texts


def event_table(records: list[dict[str, Any]]) -> str:
    """Per learning rate: runs, runs with an event, its kinds and the first event's steps."""
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for r in records:
        by_lr.setdefault(float(r["config"]["optim"]["lr"]), []).append(r)
    lines = [
        "| lr | runs (seeds) | with an event | kinds of the first event | first event's step: "
        "median [min, max] | healthy steps |",
        "|---|---|---|---|---|---|",
    ]
    for lr in sorted(by_lr):
        runs = by_lr[lr]
        firsts = [r["summary"]["events"][0] for r in runs if r["summary"].get("events")]
        steps = [e["step"] for e in firsts]
        kinds = sorted({e["kind"] for e in firsts})
        healthy = sum(
            max((m["step"] for m in r["metrics"] if "loss" in m), default=0)
            for r in runs
            if not r["summary"].get("events")
        )
        seeds = ", ".join(str(r["config"]["training"]["seed"]) for r in runs)
        span = f"{statistics.median(steps):g} [{min(steps)}, {max(steps)}]" if steps else "-"
        lines.append(
            f"| {lr:g} | {len(runs)} ({seeds}) | {len(firsts)} | {', '.join(kinds) or '-'} | "
            f"{span} | {healthy} |"
        )
    return "\n".join(lines) + "\n"


def _last_finite(r: dict[str, Any], prefix: str) -> float | None:
    """The largest value over the keys `prefix`* (blocks) at the run's last finite logged row."""
    for m in reversed(r["metrics"]):
        vals = [
            float(v)
            for k, v in m.items()
            if k.startswith(prefix) and isinstance(v, int | float) and math.isfinite(v)
        ]
        if vals:
            return max(vals)
    return None


def level_table(records: list[dict[str, Any]]) -> str:
    """Per learning rate and class, the median (over runs) of the residual-stream RMS (largest
    block) and of the max attention logit at the last finite logged step: the level the
    activations had reached when the run overflowed, or when a healthy run ended."""
    lines = [
        "| lr | class | runs | residual RMS, largest block: median [min, max] | "
        "max attention logit: median [min, max] |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in records:
        kind = "event" if r["summary"].get("events") else "healthy"
        groups.setdefault((float(r["config"]["optim"]["lr"]), kind), []).append(r)
    for (lr, kind), runs in sorted(groups.items()):
        cells = []
        for prefix in ("resid_rms/", "max_logit"):
            vals = [v for r in runs if (v := _last_finite(r, prefix)) is not None]
            cells.append(
                f"{statistics.median(vals):.3g} [{min(vals):.3g}, {max(vals):.3g}]" if vals else "-"
            )
        lines.append(f"| {lr:g} | {kind} | {len(runs)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def action_block(records: list[dict[str, Any]]) -> str:
    """The action study's runs, each against its twin in the sweep (same lr and seed)."""
    from normlab.launch.warning.actions import outcome, split_refusal, table

    meta = json.loads(ACTIONS_META.read_text())
    # the signals were tuned (seeds 0-1) and chosen (the held-out seeds) on the whole sweep
    selection = meta.get("selection_seeds") or sorted(
        {int(r["config"]["training"]["seed"]) for r in records}
    )
    twins = {
        (float(r["config"]["optim"]["lr"]), int(r["config"]["training"]["seed"])): r
        for r in records
    }
    protected = read_bundle(ACTIONS_BUNDLE)
    outcomes = []
    for r in protected:
        twin = twins[(float(r["config"]["optim"]["lr"]), int(r["config"]["training"]["seed"]))]
        rows = [m for m in r["metrics"] if "loss" in m]
        twin_rows = [m for m in twin["metrics"] if "loss" in m]
        outcomes.append(outcome(r["config"], r["summary"], rows, (twin["summary"], twin_rows)))
    seeds = sorted({o.seed for o in outcomes})
    recorded = meta.get("evaluation_seeds")
    if recorded is not None and sorted(recorded) != seeds:
        raise SystemExit(f"{ACTIONS_META}: evaluation_seeds {recorded} but the runs' are {seeds}")
    head = (
        f"{len(outcomes)} runs, seeds {seeds[0]}-{seeds[-1]}; measured `{meta['command']}`: "
        f"{meta['time_s'] / 60:.0f} min on {meta['machine']}.\n\n"
    )
    placebo = (
        ""
        if any(o.action.startswith("placebo") for o in outcomes)
        else (
            "No placebo arm (the same back-off at a fixed step, not triggered by the alarm): "
            '"the alarm\'s timing saved it" is not separated from "a lower lr saved it".\n\n'
        )
    )
    refusal = split_refusal(selection, seeds)
    if refusal is not None:
        return head + refusal + "\n\n" + placebo + "Recorded, not a finding:\n\n" + table(outcomes)
    return head + placebo + table(outcomes)


def heldout_outcomes() -> tuple[list[Any], list[Any], dict[str, Any]] | None:
    """The held-out action study's back-off and placebo runs, each set against the twin arm of
    the same (lr, seed) inside its own bundle, its twins, and its sweep.json; None before it is
    packed."""
    from normlab.launch.warning.actions import outcome

    if not HELDOUT_BUNDLE.exists():
        return None
    meta = json.loads(HELDOUT_META.read_text())
    twins: dict[tuple[float, int], dict[str, Any]] = {}
    protected = []
    for r in read_bundle(HELDOUT_BUNDLE):
        ew = (r["config"].get("instruments") or {}).get("early_warning") or {}
        key = (float(r["config"]["optim"]["lr"]), int(r["config"]["training"]["seed"]))
        if ew.get("action", "checkpoint") == "checkpoint" and not ew.get("placebo_step"):
            if key in twins:
                raise SystemExit(f"{HELDOUT_BUNDLE}: two twins at lr {key[0]:g}, seed {key[1]}")
            twins[key] = r  # alarms only save a checkpoint: the unprotected run
        else:
            protected.append(r)
    outcomes = []
    for r in protected:
        key = (float(r["config"]["optim"]["lr"]), int(r["config"]["training"]["seed"]))
        if key not in twins:
            raise SystemExit(f"{HELDOUT_BUNDLE}: {r['name']} has no twin run")
        twin = twins[key]
        rows = [m for m in r["metrics"] if "loss" in m]
        twin_rows = [m for m in twin["metrics"] if "loss" in m]
        outcomes.append(outcome(r["config"], r["summary"], rows, (twin["summary"], twin_rows)))
    seeds = sorted({o.seed for o in outcomes})
    recorded = meta.get("evaluation_seeds")
    if recorded is not None and sorted(recorded) != seeds:
        raise SystemExit(f"{HELDOUT_META}: evaluation_seeds {recorded} but the runs' are {seeds}")
    return outcomes, list(twins.values()), meta


def _span(seeds: list[int]) -> str:
    if len(seeds) == 1:
        return str(seeds[0])
    return (
        f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else str(seeds)
    )


def heldout_block(found: tuple[list[Any], list[Any], dict[str, Any]] | None) -> str:
    """The held-out action study: both arms against their twins (the action table), the seed
    split, and the back-off against its placebo (launch.warning.actions.paired)."""
    from normlab.launch.warning.actions import paired, paired_sentence, split_refusal, table

    if found is None:
        return (
            "Not run and packed yet: `normlab study divergence_actions_heldout --out DIR --jobs 2`"
            ", then `python docs/gen_warnings.py --heldout-runs DIR --heldout-time-s T`.\n"
        )
    outcomes, twins, meta = found
    seeds = sorted({o.seed for o in outcomes})
    selection = sorted(meta["selection_seeds"])
    head = (
        f"{len(outcomes) + len(twins)} runs ({len(twins)} twins, {len(outcomes)} with an action), "
        f"seeds {_span(seeds)}; measured `{meta['command']}`: {meta['time_s'] / 60:.0f} min on "
        f"{meta['machine']}.\n\n"
    )
    refusal = split_refusal(selection, seeds)
    if refusal is not None:
        head += refusal + "\n\nRecorded, not a finding:\n\n"
    else:
        head += (
            f"Out of sample: the signals were tuned and chosen on seeds {_span(selection)}, the "
            f"actions are evaluated on seeds {_span(seeds)}.\n\n"
        )
    return head + table(outcomes) + "\n" + paired_sentence(paired(outcomes)) + "\n"


def heldout_clause(found: tuple[list[Any], list[Any], dict[str, Any]] | None) -> str | None:
    """The headline's sentence on the held-out action study; None before it is packed. It
    states a finding only as far as `actions.shown` allows, and only when the seeds are
    disjoint."""
    from normlab.launch.warning.actions import SEEDS_NEEDED, paired, shown, split_refusal

    if found is None:
        return None
    outcomes, _, meta = found
    seeds = sorted({o.seed for o in outcomes})
    result = paired(outcomes)
    if split_refusal(meta["selection_seeds"], seeds) is not None:
        return (
            f"The action study on seeds {_span(seeds)} is recorded but not a finding: its seeds "
            "overlap those its signals were chosen on."
        )
    if not result.pairs:
        return f"On held-out seeds {_span(seeds)} no twin diverged: the back-off is not tested."
    text = (
        f"On held-out seeds {_span(seeds)} the alarm-driven back-off saved {result.saved} of "
        f"{result.pairs} runs whose twin diverged, its placebo (the same back-off once at a fixed "
        f"step) {result.placebo_saved} of {result.pairs} (exact one-sided McNemar p "
        f"{result.p:.3g} over (lr, seed) pairs; {result.seed_p:.3g} with the {result.seeds} "
        "seeds as the units): "
    )
    reach = shown(result)
    if reach == "seeds":
        return text + (
            "alarm-driven back-offs beat one back-off at a fixed step, a difference of timing "
            "and of dose."
        )
    if reach == "pairs":
        return text + (
            "alarm-driven back-offs beat one back-off at a fixed step on these pairs, a "
            "difference of timing and of dose; over seeds it is not shown yet "
            f"({SEEDS_NEEDED} held-out seeds are the fewest that can show it)."
        )
    return text + "that alarm-driven back-offs save more runs is not shown at these seeds."


def headline(texts: dict[str, str], actions: str, heldout: str | None = None) -> str:
    """The one sentence the README and the page open with, from the tool's warnings.json (Holm
    over every signal compared), then the held-out action study's clause (`heldout_clause`), or
    before it is packed the in-sample action block's own refusal or placebo lines."""
    data = json.loads(texts["warnings.json"])
    rows = [r for r in data["signals"] if r.get("holm_p") is not None and r["signal"] != "loss"]
    rows = [r for r in rows if not math.isnan(float(r["holm_p"]))]
    winners = [r["signal"] for r in rows if r["beats_loss"]]
    raw = sorted((r for r in rows if r["mcnemar_p"] < 0.05), key=lambda r: r["mcnemar_p"])
    ps = "; ".join(f"{r['signal']} p {r['mcnemar_p']:.3g}, Holm {r['holm_p']:.3g}" for r in raw)
    events = rows[0]["events"] if rows else 0
    if winners:
        first = (
            f"On {events} held-out fp16 overflows on CPU, {', '.join(winners)} warn earlier than "
            f"the loss after Holm over the {len(rows)} signals compared"
        )
    else:
        first = (
            f"On {events} held-out fp16 overflows on CPU, no signal warns earlier than the loss "
            f"once Holm corrects over the {len(rows)} signals compared"
        )
    first += f" ({ps}: uncorrected only)." if raw and not winners else "."
    if heldout is not None:
        return first + " " + heldout + "\n"
    caveats = []
    if "Refused:" in actions:
        caveats.append("its signals were chosen on the same seeds")
    if "No placebo arm" in actions:
        caveats.append("it has no placebo arm (the same back-off not triggered by the alarm)")
    if caveats:
        first += (
            " The online action study is recorded but not a finding: " + " and ".join(caveats) + "."
        )
        first += " The held-out study with a placebo arm is not packed yet."
    return first + "\n"


def blocks(records: list[dict[str, Any]], texts: dict[str, str]) -> dict[str, str]:
    meta = json.loads(META.read_text())
    n_events = sum(bool(r["summary"].get("events")) for r in records)
    seeds = sorted({r["config"]["training"]["seed"] for r in records})
    table = texts["warnings.md"].split("\n", 1)[1].strip()  # the tool's page without its title
    table = table.replace("](recall_vs_false_alarms.png)", "](warnings/divergence/"
                          "recall_vs_false_alarms.png)")  # fmt: skip
    actions = action_block(records)
    found = heldout_outcomes()
    return {
        "headline": headline(texts, actions, heldout_clause(found)),
        "sweep": (
            f"{len(records)} runs, {n_events} with an event, seeds {seeds[0]}-{seeds[-1]}; "
            f"measured `{meta['command']}`: {meta['time_s'] / 60:.0f} min on {meta['machine']}.\n\n"
            + event_table(records)
        ),
        "evaluation": table + "\n",
        "levels": level_table(records),
        "actions": actions,
        "heldout": heldout_block(found),
    }


def render(page: str, found: dict[str, str]) -> str:
    def fill(m: re.Match[str]) -> str:
        return m.group(1) + found[m.group(2)] + m.group(4)  # a name not found: a KeyError

    return BLOCK.sub(fill, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", help="the sweep's study directories")
    parser.add_argument("--time-s", type=float, help="the sweep's measured wall time (--runs)")
    parser.add_argument("--machine", default="2 CPU cores", help="where it ran, under what load")
    parser.add_argument("--action-runs", type=Path, nargs="+", help="the action study's dirs")
    parser.add_argument("--action-time-s", type=float, help="its measured wall time")
    parser.add_argument("--heldout-runs", type=Path, nargs="+", help="the held-out action study")
    parser.add_argument("--heldout-time-s", type=float, help="its measured wall time")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.action_runs:
        packed = [r for root in args.action_runs for r in pack(root)]
        write_bundle(packed, ACTIONS_BUNDLE)
        ACTIONS_META.write_text(json.dumps({
            "command": "normlab study divergence_actions --jobs 2",
            "time_s": args.action_time_s,
            "machine": args.machine,
            # the seeds the watched signals were tuned and chosen on (the sweep's), and those
            # the actions are evaluated on; action_block refuses an overlap
            "selection_seeds": sorted({r["config"]["training"]["seed"] for r in read_bundle()}),
            "evaluation_seeds": sorted({r["config"]["training"]["seed"] for r in packed}),
        }, indent=1) + "\n")  # fmt: skip
    if args.heldout_runs:
        packed = [r for root in args.heldout_runs for r in pack(root)]
        write_bundle(packed, HELDOUT_BUNDLE)
        HELDOUT_META.write_text(json.dumps({
            "command": "normlab study divergence_actions_heldout --jobs 2",
            "time_s": args.heldout_time_s,
            "machine": args.machine,
            # as for the in-sample study: the seeds the signals were chosen on (the sweep's) and
            # those the actions are evaluated on; heldout_block refuses an overlap
            "selection_seeds": sorted({r["config"]["training"]["seed"] for r in read_bundle()}),
            "evaluation_seeds": sorted({r["config"]["training"]["seed"] for r in packed}),
        }, indent=1) + "\n")  # fmt: skip
    if args.runs:
        write_bundle([r for root in args.runs for r in pack(root)])
        META.write_text(json.dumps({
            "command": "normlab study divergence --jobs 2",
            "time_s": args.time_s,
            "machine": args.machine,
        }, indent=1) + "\n")  # fmt: skip
    records = read_bundle()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            texts = evaluate(records, Path(tmp))
        stale = [f for f in TEXT_FILES if (OUT / f).read_text() != texts[f]]
        found = blocks(records, texts)
        if PAGE.read_text() != render(PAGE.read_text(), found):
            stale.append(str(PAGE.relative_to(DOCS)))
        if README.read_text() != render(README.read_text(), found):
            stale.append("../README.md")
        for f in stale:
            print(f"stale: {f} (run python docs/gen_warnings.py)", file=sys.stderr)
        return 1 if stale else 0
    texts = evaluate(records, OUT)
    found = blocks(records, texts)
    PAGE.write_text(render(PAGE.read_text(), found))
    README.write_text(render(README.read_text(), found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
