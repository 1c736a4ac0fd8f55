"""`normlab verdicts`: decide claims on a table of runs and write verdicts.md and verdicts.json.

run_verdicts reads the table (results_table), the claims (a YAML list, or the default family),
decides them (verdicts.decide), adds the rank flips and the exploratory per-point differences
(rank_flips), writes both files into the output folder and returns the lines to print. The output
folder must be new, empty, or hold only earlier verdicts files (nothing else is overwritten).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.launch.errors import ConfigError
from normlab.launch.out_path import (
    WRITES,
    check_out_dir,
    default_out,
    make_out_dir,
    write_text,
)
from normlab.launch.progress import Stages
from normlab.launch.stats import statistics as st
from normlab.launch.stats.group_sequential import Plan
from normlab.launch.verdicts import family as vc
from normlab.launch.verdicts.decide import NOT_TESTED, Verdict, decide, load_claims
from normlab.launch.verdicts.rank_flips import (
    PointDifference,
    RankFlip,
    benjamini_hochberg_points,
    pairs_of,
    point_differences,
    rank_flips,
)
from normlab.launch.verdicts.results_table import Cell, build_cells, read_results
from normlab.launch.verdicts.workers import fan_out

if TYPE_CHECKING:
    from normlab.launch.verdicts.aa_simulation import AAResult

DEFAULT_VERDICTS = default_out("verdicts")
SHOWN = {
    st.A_LOWER: "A lower",
    st.B_LOWER: "B lower",
    st.EQUIVALENT: "equivalent",
    st.INCONCLUSIVE: "inconclusive",
    NOT_TESTED: "not tested",
}


def check_verdicts_dir(out: Path) -> None:
    """Refuse a folder that holds anything but earlier verdicts files (the one checked path)."""
    check_out_dir(out, writes=WRITES["verdicts"])


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None or math.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.{digits}g}"


def shown(v: Verdict) -> str:
    """The verdict's name with what it means ('A lower (a lower than b by more than 0.1
    nats)')."""
    return f"{SHOWN[v.verdict]} ({v.meaning})" if v.meaning else SHOWN[v.verdict]


def line(v: Verdict) -> str:
    """One verdict with its numbers, interval, level and rule."""
    head = f"{v.a} vs {v.b} [{v.size}] {v.statistic}: {shown(v)}"
    if v.verdict == NOT_TESTED or math.isnan(v.delta):
        return f"{head} ({v.note})" if v.note else head
    lo, hi = v.interval
    parts = [
        f"mean A {_fmt(v.mean_a)} B {_fmt(v.mean_b)} (n {v.n_a}/{v.n_b})",
        f"delta {_fmt(v.delta, 3)} in [{_fmt(lo, 3)}, {_fmt(hi, 3)}]",
        f"level {_fmt(v.level, 3)}",
        f"p {_fmt(v.p, 3)}",
    ]
    if v.p_permutation is not None and v.test.startswith("Welch"):
        how = f" ({v.permutation_note})" if v.permutation_note else ""
        parts.append(f"permutation p {_fmt(v.p_permutation, 3)}{how}")
    elif v.permutation_note:
        parts.append(v.permutation_note)
    if v.naive_a is not None:
        parts.append(f"naive best A {_fmt(v.naive_a)} B {_fmt(v.naive_b)}")
    parts.append(f"seeds for 80% power {v.seeds_needed if v.seeds_needed else f'>{v.seed_limit}'}")
    parts.append(f"rule: {v.test}; {v.rule}")
    text = f"{head}: " + "; ".join(parts)
    return f"{text} ({v.note})" if v.note else text


def _note(v: Verdict) -> str:
    """The table's note: the verdict's, and how its permutation p was found where not exactly."""
    if not v.permutation_note:
        return v.note
    shown = f"permutation p {_fmt(v.p_permutation, 3)} ({v.permutation_note})"
    shown = shown if v.p_permutation is not None else v.permutation_note
    return f"{v.note}; {shown}" if v.note else shown


def as_dict(v: Verdict, flip: RankFlip | None) -> dict:
    d = asdict(v)
    if v.p_permutation_se is None and not v.permutation_note:  # exact, or none: as before
        del d["p_permutation_se"], d["permutation_note"]
    d["interval"] = [_json_num(x) for x in v.interval]
    d["agrees"] = v.agrees
    d["meaning"] = v.meaning
    for key, value in d.items():
        if isinstance(value, float):
            d[key] = _json_num(value)
    if flip is not None:
        d["rank_flip"] = {
            "deltas": {str(f): _json_num(x) for f, x in flip.deltas.items()},
            "flipped_at": flip.flipped,
            "note": flip.note,
        }
    return d


def _json_num(x: float) -> float | str | None:
    if x is None or math.isnan(x):
        return None
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def markdown(
    verdicts: list[Verdict],
    flips: list[RankFlip],
    points: list[PointDifference],
    source: str,
    notes: list[str],
) -> str:
    out = [
        "# Verdicts (SCIENCE.md 22)",
        "",
        f"Runs: `{source}`. Family: {sum(v.verdict != NOT_TESTED for v in verdicts)} claims, "
        f"Holm at alpha {st.ALPHA:g} over the testable ones. A diverged, failed or stopped run "
        "counts as l_0 for every statistic.",
        "",
        "| A | B | size | statistic | verdict | expected | mean A | mean B | delta | interval "
        "| level | p | test | seeds needed | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        lo, hi = v.interval
        out.append(
            f"| {v.a} | {v.b} | {v.size} | {v.statistic} | {shown(v)} | {v.expect} "
            f"({v.agrees}) | {_fmt(v.mean_a)} | {_fmt(v.mean_b)} | {_fmt(v.delta, 3)} "
            f"| [{_fmt(lo, 3)}, {_fmt(hi, 3)}] | {_fmt(v.level, 3)} | {_fmt(v.p, 3)} | {v.test} "
            f"| {v.seeds_needed if v.seeds_needed is not None else '-'} | {_note(v)} |"
        )
    out += ["", "Rules:", ""]
    out += sorted({f"- {v.statistic}: {v.rule}" for v in verdicts if v.rule})
    out += ["", "## Rank flips during training (descriptive, 22.7)", ""]
    for f in flips:
        if f.note:
            out.append(f"- {f.a} vs {f.b} [{f.size}]: {f.note}")
        else:
            ds = ", ".join(f"{int(k * 100)}%: {d:+.3f}" for k, d in f.deltas.items())
            flag = (
                f" RANK FLIP at {', '.join(f'{int(k * 100)}%' for k in f.flipped)}"
                if (f.flipped)
                else ""
            )
            out.append(f"- {f.a} vs {f.b} [{f.size}]: Delta_f {ds}{flag}")
    out += [
        "",
        "## Exploratory per-grid-point differences (Benjamini-Hochberg q 0.05; not verdicts)",
        "",
        "| A | B | size | lr | delta | Welch p | BH |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {d.a} | {d.b} | {d.size} | {d.lr:g} | {d.delta:+.4f} | {d.p:.3g} "
        f"| {'rejected' if d.bh_rejected else '-'} |"
        for d in points
    ]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def run_verdicts(
    results: str | Path,
    claims_file: str | Path | None = None,
    plateau: float | None = None,
    l0: float | None = None,
    margin: float = vc.LOSS_MARGIN,
    out: str | Path = DEFAULT_VERDICTS,
    aa: int | None = None,
    jobs: int = 1,
) -> list[str]:
    """Decide, write verdicts.md and verdicts.json into `out`, return the lines to print.
    `aa`: also run the simulated A/A self-test (22.6) with that many replicates per cell;
    `jobs`: processes deciding the claims (launch.verdicts.workers; the same answers)."""
    check_options(plateau, l0, margin, aa)
    out = Path(out)
    check_verdicts_dir(out)
    claims = load_claims(claims_file) if claims_file is not None else None
    with Stages("verdicts") as stages:
        with stages.stage("reading the table") as tick:
            runs = read_results(results)
            tick(len(runs))
        decided = decide_table(
            runs, claims, plateau, l0, margin, aa, str(results), stages=stages, jobs=jobs
        )
        make_out_dir(out, writes=WRITES["verdicts"])
        return write_decided(decided, out)


def _pair_companions(
    job: tuple[dict[tuple[str, str], Cell], list[tuple[str, str, str]], float], i: int
) -> tuple[RankFlip, list[PointDifference]]:
    """The i-th pair's rank flip and per-point differences (fan_out's unit; BH runs after)."""
    cells, pairs, margin = job
    return rank_flips(cells, [pairs[i]], margin)[0], point_differences(cells, pairs[i])


def check_options(plateau: float | None, l0: float | None, margin: float, aa: int | None) -> None:
    for name, value in (("--plateau", plateau), ("--l0", l0)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ConfigError(f"--margin must be a number >= 0, got {margin}")
    if aa is not None and not 100 <= aa <= 100_000:
        raise ConfigError(f"--aa must be between 100 and 100000 replicates, got {aa}")


@dataclass
class Decided:
    """What one table's claims came to: the verdicts, the rank flips, the exploratory
    differences, the notes, the A/A results, and the seconds deciding them took."""

    verdicts: list[Verdict]
    flips: list[RankFlip]
    points: list[PointDifference]
    notes: list[str]
    aa: list  # aa_simulation.AAResult
    source: str
    seconds: float = 0.0
    aa_seconds: float = 0.0

    def markdown(self, timed: bool = True) -> str:
        text = markdown(self.verdicts, self.flips, self.points, self.source, self.notes)
        if self.aa:
            lines = [aa_line(r, timed) for r in self.aa]
            text += "\n## Simulated A/A self-test (22.6)\n\n" + "\n".join(f"- {a}" for a in lines)
            text += "\n"
        return text

    def json(self) -> str:
        by_pair = {(f.a, f.b, f.size): f for f in self.flips}
        data = [
            as_dict(v, by_pair.get((v.a, v.b, v.size)) if v.statistic == vc.LOSS else None)
            for v in self.verdicts
        ]
        return json.dumps(data, indent=2) + "\n"

    def lines(self) -> list[str]:
        out = [line(v) for v in self.verdicts]
        out += [
            f"rank flip: {f.a} vs {f.b} [{f.size}] at "
            f"{', '.join(f'{int(k * 100)}%' for k in f.flipped)}"
            for f in self.flips
            if f.flipped
        ]
        return out + self.notes + [aa_line(r) for r in self.aa]


def decide_table(
    runs: list,
    claims: list | None = None,
    plateau: float | None = None,
    l0: float | None = None,
    margin: float = vc.LOSS_MARGIN,
    aa: int | None = None,
    source: str = "",
    plan: Plan | None = None,
    stages: Stages | None = None,
    jobs: int = 1,
) -> Decided:
    """The verdicts of a table of runs (results_table.Run), its rank flips, exploratory
    differences and (aa: replicates) the simulated A/A self-test; `jobs`: processes."""
    import time

    start = time.perf_counter()
    cells = build_cells(runs, l0)
    verdicts = decide(cells, claims, plateau, margin, plan=plan, stages=stages, jobs=jobs)
    tested = list(
        dict.fromkeys(
            (v.a, v.b, v.size)
            for v in verdicts
            if (v.a, v.size) in cells and (v.b, v.size) in cells
        )
    )
    pairs = tested if claims is not None else pairs_of(cells)
    shown = stages or Stages("verdicts", quiet=True)
    with shown.stage("rank flips and per-lr differences", len(pairs)) as tick:
        per_pair = fan_out(_pair_companions, (cells, pairs, margin), len(pairs), tick, jobs)
        flips = [flip for flip, _ in per_pair]
        points = benjamini_hochberg_points([d for _, found in per_pair for d in found])
    notes = [f"{r} [{s}]: {n}" for (r, s), c in cells.items() for n in c.notes]
    if plan is not None:  # a study's plan of looks (SCIENCE.md 22.8): the levels are its looks'
        notes.append(f"looks: {plan.describe()}; each level is its look's nominal level")
    mid = time.perf_counter()
    found = []
    if aa:
        from normlab.launch.verdicts.aa_simulation import aa_study

        with shown.stage(f"A/A self-test ({aa} replicates per cell)", len(cells)) as tick:
            found = aa_study(cells, aa, plateau, margin)
            tick(len(cells))
        if not found:
            notes.append("A/A: no cell has >= 2 seeds and a known l_0")
    end = time.perf_counter()
    return Decided(verdicts, flips, points, notes, found, source, end - start, end - mid)


def write_decided(decided: Decided, out: Path) -> list[str]:
    """verdicts.md and verdicts.json into `out` (made already); the lines to print."""
    write_text(out / "verdicts.md", decided.markdown())
    write_text(out / "verdicts.json", decided.json())
    return [*decided.lines(), f"wrote {out / 'verdicts.md'} and {out / 'verdicts.json'}"]


def aa_line(r: AAResult, timed: bool = True) -> str:
    took = f"; {r.seconds:.2f} s" if timed else ""
    return (
        f"A/A {r.recipe} [{r.size}] n {r.n}: FPR {r.fpr:.4f} (Gaussian {r.fpr_gaussian:.4f}) "
        f"<= {r.threshold:.4f}: {'pass' if r.passed else 'FAIL'} (B {r.replicates}; "
        f"{r.no_test:.0%} draws with one seed-run in an arm{took})"
    )


def plan_lines(
    results: str | Path | None,
    delta: float,
    sd: float | None,
    statistic: str,
    family: int,
    plateau: float | None = None,
    margin: float = vc.LOSS_MARGIN,
    l0: float | None = None,
) -> list[str]:
    """`normlab verdicts --plan DELTA`: seeds per arm for 80 % power at a true difference DELTA,
    from a stated SD (--sd, one statistic) or from each cell of a pilot table (every statistic
    the pilot can give; trained_range needs --plateau), at Holm's first level alpha / family."""
    from normlab.launch.verdicts.decide import pilot_sd, seeds_plan

    if not (math.isfinite(delta) and delta > 0):
        raise ConfigError(f"--plan must be a positive difference, got {delta}")
    if family < 1:
        raise ConfigError(f"--family must be >= 1, got {family}")
    if statistic not in vc.STATISTICS:
        raise ConfigError(f"--statistic must be one of {', '.join(vc.STATISTICS)}")
    if (sd is None) == (results is None):
        raise ConfigError("--plan needs either --sd SD or a pilot RESULTS table, not both")
    if sd is not None:
        if not (math.isfinite(sd) and sd > 0):
            raise ConfigError(f"--sd must be a positive number, got {sd}")
        return [seeds_plan(statistic, sd, delta, family, margin)[1]]
    assert results is not None  # one of sd and results is given (checked above)
    cells = build_cells(read_results(results), l0)
    stats = vc.STATISTICS if plateau is not None else (vc.LOSS, vc.SENS)
    out = []
    for (recipe, size), cell in cells.items():
        if cell.n < 2 or not cell.usable:
            out.append(f"{recipe} [{size}]: no pilot spread (needs >= 2 seeds and a known l_0)")
            continue
        for s in stats:
            pilot = pilot_sd(cell, s, plateau)
            _, text = seeds_plan(s, pilot, delta, family, margin, pilot=cell)
            out.append(f"{recipe} [{size}] {s}: {text}")
    return out
