"""The committed studies re-decided (issue 29 items 4 and 6): every verdict, table and quoted
number in the repository is what the tool gives from the committed run data.

For each committed study directory (docs/study, docs/study/<name>) the report is rebuilt without
training (`normlab study STUDY --report-only`, launch.study.rebuild) from copies of its committed
compare.csv (or results.csv), sensitivity.csv (l_0) and study.md: verdicts.md, verdicts.json,
sensitivity.csv and study.md must come out byte for byte as committed, and the A/A self-test
(SCIENCE.md 22.6, B = 2000) on every cell of its loss table must keep the false-positive rate
<= 0.0597. The generated blocks of the README and docs must match their verdicts.json, and the
numbers the stabilizers write-up quotes must be the committed runs' numbers.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from statistics import fmean

import pytest
from normlab.launch.stats.statistics import holm
from normlab.launch.study.plan import DEFAULT_LRS, DEFAULT_RECIPES, DEFAULT_SEEDS, spec_from_flags
from normlab.launch.study.rebuild import rebuild
from normlab.launch.study.spec import load_study
from normlab.launch.verdicts.aa_simulation import fpr_threshold
from normlab.launch.verdicts.doc_blocks import stale
from rich.console import Console
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
STUDIES = [
    "default",
    "wortsman",
    "qknorm",
    "stabilizers",
    "lr12",
    "depth",
    "zloss",
    "aa",
    "completep_depth_quick",
    "completep_depth",
    "completep_placements",
    "mup_width",
    "fp8",
]
FILES = (
    "verdicts.md",
    "verdicts.json",
    "sensitivity.csv",
    "study.md",
    "ladder.csv",
    "transfer.csv",
)
B = 2000
# the studies whose tables are results.csv: aa (run with it), and those whose added seeds were
# joined with `normlab study --report-only --merge` (2026-12-03)
WITH_RESULTS = (
    "aa",
    "lr12",
    "stabilizers",
    "zloss",
    "wortsman",
    "fp8",
    "completep_placements",
    "completep_depth",
)


def signed(x: str | float) -> str:
    """A number as the docs print it: two decimals, its sign, a typographic minus."""
    return f"{float(x):+.2f}".replace("-", "−")


def study_dir(name: str) -> Path:
    return DOCS / "study" if name == "default" else DOCS / "study" / name


def spec_of(name: str):  # noqa: ANN201 (StudySpec)
    if name == "default":
        return spec_from_flags(DEFAULT_RECIPES, list(DEFAULT_LRS), list(DEFAULT_SEEDS))
    return load_study(name)


def committed_plateau() -> float:
    """The unigram plateau of the committed studies' data (bundled, bpe/4096), as their
    sensitivity.csv files record it: one value for all (they trained on the same data)."""
    found = set()
    for name in STUDIES:
        path = study_dir(name) / "sensitivity.csv"
        if path.is_file():
            with path.open() as fh:
                found |= {r["plateau"] for r in csv.DictReader(fh) if r.get("plateau")}
    assert len(found) == 1, found
    return float(found.pop())


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    plateau = committed_plateau()
    out = {}
    quiet = Console(file=open("/dev/null", "w"), width=240)  # noqa: SIM115
    for name in STUDIES:
        src = study_dir(name)
        if not (src / "compare.csv").is_file():
            continue
        dst = tmp_path_factory.mktemp(name)
        for f in ("compare.csv", "results.csv", "sensitivity.csv", "study.md", "study.json"):
            if (src / f).is_file():
                shutil.copy(src / f, dst / f)
        out[name] = (dst, rebuild(spec_of(name), dst, quiet, aa=B, plateau=plateau))
    return out


@pytest.mark.parametrize("name", STUDIES)
def test_committed_study_rebuilds_byte_for_byte(name: str, rebuilt: dict) -> None:
    if name not in rebuilt:
        pytest.skip(f"{name}: no committed compare.csv")
    dst, found = rebuilt[name]
    # results.csv where a study has it (aa; the studies whose added seeds were merged), else
    # compare.csv
    has_results = (study_dir(name) / "results.csv").is_file()
    assert found["source"] == ("results.csv" if has_results else "compare.csv")
    assert has_results == (name in WITH_RESULTS)
    for f in FILES:
        committed = study_dir(name) / f
        if not committed.is_file():
            continue
        assert (dst / f).read_text() == committed.read_text(), (
            f"{committed} differs from what `normlab study --report-only` gives from the "
            "committed runs: rebuild it"
        )


@pytest.mark.parametrize("name", STUDIES)
def test_aa_self_test_on_committed_loss_tables(name: str, rebuilt: dict) -> None:
    """SCIENCE.md 22.6: FPR <= alpha + 2 sqrt(alpha (1 - alpha) / B) = 0.0597 at B = 2000,
    on every cell (recipe, size) of the study at its own seed count."""
    if name not in rebuilt:
        pytest.skip(f"{name}: no committed compare.csv")
    results = rebuilt[name][1]["decided"].aa
    assert results, f"{name}: no cell could be A/A-tested"
    assert fpr_threshold(0.05, B) == pytest.approx(0.0597, abs=5e-5)
    for r in results:
        assert r.replicates == B
        assert r.fpr <= r.threshold and r.fpr_gaussian <= r.threshold, (name, r)


def test_no_directional_verdict_from_one_seed_or_on_the_aa_study(rebuilt: dict) -> None:
    for name, (_, found) in rebuilt.items():
        for v in found["decided"].verdicts:
            if v.verdict in ("a_lower", "b_lower"):
                assert min(v.n_a, v.n_b) >= 2, (name, v)
    if "aa" in rebuilt:
        assert {v.verdict for v in rebuilt["aa"][1]["decided"].verdicts} <= {
            "equivalent",
            "inconclusive",
        }


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        *sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("guides/*.md")),
    ],
)
def test_generated_verdict_blocks_match_the_committed_verdicts(doc: str) -> None:
    assert stale(ROOT / doc, ROOT) == [], (
        f"{doc}: regenerate with `python -m normlab.launch.verdicts.doc_blocks {doc}`"
    )


def _rows(name: str) -> list[dict[str, str]]:
    with (study_dir(name) / "compare.csv").open() as fh:
        return list(csv.DictReader(fh))


def runs_of(directory: Path) -> dict[str, dict[str, str]]:
    """A study or probe directory's compare.csv rows by run name."""
    with (directory / "compare.csv").open() as fh:
        return {r["run"]: r for r in csv.DictReader(fh)}


def test_stabilizers_quoted_numbers_are_the_runs() -> None:
    """study_stabilizers.md: the max-logit range at 3e-2 of the recipes without QK-norm (every
    seed), softcap's raw S_max, and the per-recipe maxima of its table."""
    rows = [r for r in _rows("stabilizers") if float(r["lr"]) == 0.03]
    no_qk = [float(r["max_logit"]) for r in rows if r["recipe"] != "hybrid"]
    text = (DOCS / "study_stabilizers.md").read_text()
    assert f"{min(no_qk):.0f}–{max(no_qk):.0f}" in text
    softcap = max(float(r["max_logit"]) for r in rows if r["recipe"] == "softcap")
    assert f"S_max is {softcap:.0f}" in text
    for recipe in {r["recipe"] for r in rows}:
        top = max(float(r["max_logit"]) for r in rows if r["recipe"] == recipe)
        assert f"{top:.0f}" in text, recipe


def test_wortsman_post_ln_trained_nowhere_as_quoted() -> None:
    """Neither Post-LN recipe trained anywhere in `wortsman` (the 0.2-nat rule): the docs must
    not say it trained at 1e-3."""
    with (study_dir("wortsman") / "sensitivity.csv").open() as fh:
        found = {r["recipe"]: r["trained"] for r in csv.DictReader(fh)}
    assert found["post_warmup"] == found["post_nowarmup"] == "no"
    for doc in (ROOT / "README.md", DOCS / "study_wortsman.md", DOCS / "study.md"):
        assert "trains only at 1e-3" not in doc.read_text(), doc
        assert "trained only at 1e-3" not in doc.read_text(), doc


def test_transfer_page_quotes_the_committed_ladders() -> None:
    """docs/transfer.md's hold-out coverage and best-lr shifts are each committed ladder.csv's
    (issue 31 item 5: the coverage over every committed ladder)."""
    ladders = sorted(DOCS.glob("study/**/ladder.csv"))
    names = [
        "completep_depth",
        "completep_depth_quick",
        "completep_placements",
        "depth",
        "mup_width",
    ]
    assert [p.parent.name for p in ladders] == names
    text = " ".join((DOCS / "transfer.md").read_text().split())  # line breaks as spaces
    for path in ladders:
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        decided = [r["holdout_covered"] for r in rows if r["holdout_covered"] in ("True", "False")]
        assert f"**{decided.count('True')} of {len(decided)}**" in text, path.parent.name
        for r in rows:
            if r["quantity"] == "best_lr":
                shift = signed(r["shift_log2"])
                assert shift.lstrip("+") in text, (path.parent.name, r["recipe"])
    # mup_width's quoted best losses and LR-sensitivity ranges are its sensitivity.csv's
    with (study_dir("mup_width") / "sensitivity.csv").open() as fh:
        rows = {(r["recipe"], r["size"]): r for r in csv.DictReader(fh)}
    best = {k: float(r["best_loss"]) for k, r in rows.items()}
    sens = {k: float(r["lr_sensitivity"]) for k, r in rows.items()}
    mup_best = best["mup", "d_model=64"], best["mup", "d_model=512"]
    assert f"from {mup_best[0]:.3f} at d 64 to {mup_best[1]:.3f}" in text
    assert f"sp's falls to {best['sp', 'd_model=512']:.3f}" in text
    wide_sp = [sens["sp", f"d_model={d}"] for d in (128, 256, 512)]
    narrow = sens["sp", "d_model=64"]
    assert f"{narrow:.2f} at d 64 to {min(wide_sp):.2f}-{max(wide_sp):.2f}" in text
    mup = [v for (recipe, _), v in sens.items() if recipe == "mup"]
    assert f"between {min(mup):.2f} and {max(mup):.2f}" in text
    # the transfer verdicts it quotes are transfer.csv's (per-seed shifts, interval, seeds needed)
    with (study_dir("mup_width") / "transfer.csv").open() as fh:
        verdicts = {r["recipe"]: r for r in csv.DictReader(fh)}
    assert verdicts["sp"]["verdict"] == "does_not_transfer_down" and "**does not transfer**" in text
    sp_shifts = [f"{float(x):.2f}".replace("-", "−") for x in verdicts["sp"]["shifts_log2"].split()]
    assert f"{sp_shifts[0]} and {sp_shifts[1]} octaves" in text
    lo, hi = (f"{float(verdicts['sp'][k]):.2f}".replace("-", "−") for k in ("lo", "hi"))
    assert f"[{lo}, {hi}]" in text
    assert verdicts["mup"]["verdict"] == "inconclusive"
    assert f"about **{verdicts['mup']['seeds_needed']} seeds**" in text
    # completep_depth: the best losses, the per-seed shifts and the seeds each verdict needs
    with (study_dir("completep_depth") / "sensitivity.csv").open() as fh:
        best = {(r["recipe"], r["size"]): float(r["best_loss"]) for r in csv.DictReader(fh)}
    sp_ends = best["sp", "n_layers=2"], best["sp", "n_layers=16"]
    assert f"from {sp_ends[0]:.3f} at 2 blocks to {sp_ends[1]:.3f}" in text
    cp = [f"{best['completep', f'n_layers={n}']:.3f}" for n in (2, 4, 8, 16)]
    assert f"falls from {cp[0]} at 2 blocks to {cp[1]} at 4" in text
    assert f"({cp[2]} at 8, {cp[3]} at 16)" in text
    assert min(cp) == cp[1] and max(cp) == cp[0]  # best at 4 blocks, every depth below 2 blocks
    with (study_dir("completep_depth") / "transfer.csv").open() as fh:
        verdicts = {r["recipe"]: r for r in csv.DictReader(fh)}
    sp = verdicts["sp"]
    assert sp["verdict"] == "inconclusive" and sp["seeds"] == "0 1"
    shifts = [f"{float(x):+.2f}" for x in sp["shifts_log2"].split()]
    assert f"({shifts[0]} and {shifts[1]} octaves" in text
    level = float(sp["level"])
    quoted = f"about **{sp['seeds_needed']} seeds** to decide at its first look's level"
    assert f"{quoted} {level:.3g}" in text
    # CompleteP: decided under the study file's plan of looks (n 2, then 8), the page quoting both
    # the corrected verdict and what the uncorrected reading was
    v = verdicts["completep"]
    assert v["verdict"] == "inconclusive" and v["seeds"] == "0 1 2 3 4 5 6 7"
    assert load_study("completep_depth").looks is not None
    assert "`looks: {spending: pocock, seeds: [2, 8], registered: false}`" in text
    shifts = [signed(x) for x in v["shifts_log2"].split()]
    assert f"moved by {', '.join(shifts[:-1])} and {shifts[-1]} octaves" in text
    mean, lo, hi = (signed(v[k]) for k in ("mean_log2", "lo", "hi"))
    level = float(v["level"])
    quoted = f"the mean shift is {mean} octaves and its interval at the level of the second look, "
    assert quoted + f"{level:.3g}, is [{lo}, {hi}]: past +0.5" in text and float(v["hi"]) > 0.5
    assert f"about {v['seeds_needed']} seeds at the observed spread, in a new study" in text
    assert "last look" in v["note"]
    d = [float(x) for x in v["shifts_log2"].split()]
    raw = stats.ttest_1samp(d, 0.0).confidence_interval(1 - 2 * 0.025)  # Holm's first step
    assert f"Holm's level 0.025 is [{signed(raw.low)}, {signed(raw.high)}]" in text
    assert -0.5 < raw.low < raw.high < 0.5  # what the uncorrected reading called "transfers"
    assert f"(p {float(v['p']):.3f})" in text and f"(sd {float(v['sd_log2']):.2f} octaves)" in text
    with (study_dir("completep_depth") / "ladder.csv").open() as fh:
        ladder = {(r["recipe"], r["quantity"]): r for r in csv.DictReader(fh)}
    moved = ladder["completep", "best_lr"]
    quoted = [signed(moved[k]) for k in ("shift_log2", "shift_lo")]
    assert f"by {quoted[0]} octaves [{quoted[1]}, " in text
    held = [q for (r, q), row in ladder.items() if row["holdout_covered"] == "True"]
    assert held == ["max_logit"] and ladder["completep", "max_logit"]["holdout_covered"] == "True"
    assert "the forecast of 16 blocks held for **1 of 8** quantities" in text


def test_transfer_page_quotes_the_placement_study() -> None:
    """completep_placements (issue 31 item 4): the verdicts, per-seed shifts, seeds needed, best
    rates and losses, run counts and times docs/transfer.md quotes are its transfer.csv's,
    sensitivity.csv's, sensitivity_grid.csv's, ladder.csv's and study.json's."""
    import json

    text = " ".join((DOCS / "transfer.md").read_text().split())  # line breaks as spaces
    src = study_dir("completep_placements")

    def table(name: str) -> list[dict[str, str]]:
        with (src / name).open() as fh:
            return list(csv.DictReader(fh))

    verdicts = {r["recipe"]: r for r in table("transfer.csv")}
    sens = {(r["recipe"], r["size"]): r for r in table("sensitivity.csv")}
    ladder = {(r["recipe"], r["quantity"]): r for r in table("ladder.csv")}
    assert verdicts["peri_completep"]["verdict"] == "transfers"
    assert 'the verdict is "transfers"' in text
    assert verdicts["olmo2_completep"]["verdict"] == "inconclusive"
    for recipe in ("peri_completep", "olmo2_completep"):
        v = verdicts[recipe]
        assert "edge" not in v["note"], recipe  # every seed's optimum inside the grid
        shifts = [signed(x) for x in v["shifts_log2"].split()]
        assert f"{', '.join(shifts[:-1])} and {shifts[-1]}" in text, recipe
        if v["verdict"] == "inconclusive":
            assert f"about **{v['seeds_needed']} seeds**" in text, recipe
        lr = ladder[recipe, "best_lr"]  # the seed-mean shift and its bootstrap interval
        quoted = f"{signed(lr['shift_log2'])} octaves [{signed(lr['shift_lo'])}, "
        assert quoted + f"{signed(lr['shift_hi'])}]" in text, recipe
    assert verdicts["peri_completep"]["seeds"] == "0 1 2 3 4 5 6"
    assert verdicts["olmo2_completep"]["seeds"] == "0 1"

    def best(recipe: str, n: int) -> str:
        return f"{float(sens[recipe, f'n_layers={n}']['best_loss']):.3f}"

    assert f"from {best('peri_completep', 2)} at 2 blocks to {best('peri_completep', 16)}" in text
    olmo = [best("olmo2_completep", n) for n in (2, 8, 16)]
    assert f"{olmo[0]} at 2 blocks, {olmo[1]} at 8 and {olmo[2]} at 16" in text
    assert all(best("olmo2_completep", n) > best("peri_completep", n) for n in (2, 4, 8, 16))
    # the best rates quoted: OLMo 2's range inside the grid, 16-32x Peri-LN's
    rates = {r: [float(sens[r, f"n_layers={n}"]["best_lr"]) for n in (2, 4, 8, 16)] for r in
             ("peri_completep", "olmo2_completep")}  # fmt: skip
    assert (min(rates["olmo2_completep"]), max(rates["olmo2_completep"])) == (0.125, 0.25)
    assert max(rates["olmo2_completep"]) < 0.3536  # inside the grid's top rate
    ratios = [o / p for o, p in zip(rates["olmo2_completep"], rates["peri_completep"], strict=True)]
    assert f"{min(ratios):.0f}-{max(ratios):.0f}x Peri-LN's" in text
    assert set(rates["peri_completep"]) == {0.007812}
    assert "Peri-LN's is 7.8e-3 at every depth" in text
    # Peri-LN's verdict: the mean of its 7 seeds' shifts and the interval at the Holm level
    peri = verdicts["peri_completep"]
    quoted = f"the mean shift is {signed(peri['mean_log2'])} octaves and its interval at the Holm"
    level = f"{float(peri['level']):.2g}"
    assert quoted in text and f"level {level} is [{signed(peri['lo'])}, " in text
    assert f"Holm's 0.025 becomes {level} at the third look" in text
    assert f"{signed(peri['hi'])}], inside ±0.5" in text
    assert float(peri["lo"]) > -0.5 and float(peri["hi"]) < 0.5
    # below Pre-LN's (completep_depth's completep arm) and OLMo 2's best loss at every depth
    with (study_dir("completep_depth") / "sensitivity.csv").open() as fh:
        pre = {r["size"]: r["best_loss"] for r in csv.DictReader(fh) if r["recipe"] == "completep"}
    for n in (2, 4, 8, 16):
        assert best("peri_completep", n) < f"{float(pre[f'n_layers={n}']):.3f}", n
    flat = [float(r["mean"]) for r in table("sensitivity_grid.csv")
            if r["recipe"] == "olmo2_completep" and r["size"] == "n_layers=16"
            and float(r["lr"]) >= 0.088]  # fmt: skip
    spread = max(flat) - min(flat)
    assert len(flat) == 5 and f"varies by {spread:.2f} nats from 8.8e-2 to 0.35" in text
    logit = ladder["olmo2_completep", "max_logit"]
    quoted = f"(exponent {signed(logit['exponent'])} [{signed(logit['exponent_lo'])}, "
    assert quoted + f"{signed(logit['exponent_hi'])}])" in text
    # the run counts and times: the first 208 runs, then what each merge joined
    record = json.loads((src / "study.json").read_text())
    joined = record["merged"]
    first = round(record["wall_s"])
    assert f"208 on the first 13 rates in {first} s" in text
    assert [m["runs"] for m in joined] == [48, 64, 160, 240]
    assert f"{round(joined[0]['wall_s'])} s and {round(joined[1]['wall_s'])} s" in text
    assert f"(160 runs) in {round(joined[2]['wall_s'])} s" in text
    assert f"seeds 4-6 (240 runs) in {round(joined[3]['wall_s'])} s" in text
    assert f"{208 + 48 + 64 + 160 + 240} runs" in text


def test_fp8_page_quotes_the_committed_study() -> None:
    """docs/study_fp8.md (issue 33 item 5): its time, verdict summary and instrument numbers are
    the committed study's (study.json, verdicts.json, compare.csv)."""
    import json

    src = study_dir("fp8")
    text = " ".join((DOCS / "study_fp8.md").read_text().split())  # lines joined
    record = json.loads((src / "study.json").read_text())
    total = record["total_s"]
    assert f"**Time: {total:.0f} s ({total / 60:.0f} min) for the 168 runs of seeds 0 and 1" in text
    merged = record["merged"]
    assert [m["seeds"] for m in merged] == [[2], [3], [4], [5], [6], [7]]
    assert [m["runs"] for m in merged] == [84, 60, 60, 60, 60, 60]
    assert f"Seed 2 (84 runs) took {merged[0]['wall_s']:.0f} s" in text
    walls = [f"{m['wall_s']:.0f}" for m in merged[1:]]
    assert f"took {', '.join(walls[:-1])} and {walls[-1]} s" in text
    assert "**552 runs**" in text and "14 x 2 MLPs x 3 rates x 3 = 252 runs" in text
    verdicts = json.loads((src / "verdicts.json").read_text())
    assert len(verdicts) == 14
    decided = [v for v in verdicts if v["verdict"] != "inconclusive"]
    assert {v["verdict"] for v in decided} == {"equivalent"}
    eight = [v for v in verdicts if (v["n_a"], v["n_b"]) == (8, 8)]
    assert len(eight) == 10 and {(v["n_a"], v["n_b"]) for v in verdicts} == {(8, 8), (3, 3)}
    assert f"**{len(decided)} of the 14 claims are decided, all as equivalent: " in text
    assert f"{len(decided)} of the 10 that ran on 8 seeds**" in text
    assert f"at most {max(abs(v['delta']) for v in decided):.3f} nats" in text
    assert all(v["interval"][0] > -0.1 and v["interval"][1] < 0.1 for v in decided)
    open_8 = [v for v in eight if v["verdict"] == "inconclusive"]
    assert "Three claims on 8 seeds stay inconclusive" in text and len(open_8) == 3
    for v in open_8:  # each quoted by the end of its interval past the margin
        lo, hi = v["interval"]
        quoted = f"upper end is {hi:+.3f}" if hi > 0.1 else f"lower end {lo:+.3f}".replace("-", "−")
        assert quoted in text
    need = sorted(v["seeds_needed"] for v in open_8)
    assert f"they need {need[0]}-{need[-1]} seeds per arm" in text
    olmo2 = sorted(v["seeds_needed"] for v in verdicts if v["n_a"] == 3 and "olmo2" in v["a"])
    hybrid = [v["seeds_needed"] for v in verdicts if v["n_a"] == 3 and "hybrid" in v["a"]]
    assert hybrid == [None, None]  # beyond the simulated calculator's 64 seeds per arm
    assert f"need {olmo2[0]}-{olmo2[1]} and more than 64 seeds per arm" in text
    # the two looks (3 and 8 seeds) corrected by the study file's plan: the page's counts
    assert "registered: false}" in text and "Pocock-type alpha spending over n = 3 and 8" in text
    uncorrected = int(holm([v["p"] for v in verdicts], 0.05)[0].sum())
    assert f"{uncorrected} of the 14 were equivalent; corrected, {len(decided)} of those" in text
    levels = sorted(v["level"] for v in eight)
    assert f"({levels[0]:.4f}-{levels[-1]:.4f} at 8 seeds" in text
    # best rate at the grid's top in both arms on every seed, as the page says
    for a in ("peri_fp8", "peri_qknorm_fp8", "olmo2_noqk_fp8"):
        for v in (v for v in verdicts if v["a"] == a):
            assert v["pick_a"] == v["pick_b"] == [2] * 8, a
    runs = runs_of(src)

    def at(
        recipe: str, key: str, smooth: str = "False", lr: str = "0.03", seeds=(0, 1, 2)
    ) -> list[float]:
        return [float(runs[f"{recipe}_smooth_swiglu{smooth}_lr{lr}_s{s}"][key]) for s in seeds]

    def every(recipe: str, key: str, smooth: str = "False", lr: str = "0.03") -> list[float]:
        """The value on every seed the arm ran (3 or 8)."""
        found = [int(k.rsplit("_s", 1)[1]) for k in runs if k.startswith(f"{recipe}_smooth")]
        return at(recipe, key, smooth, lr, sorted(set(found)))

    def listed(values: list[float], fmt: str) -> str:
        return ", ".join(format(x, fmt) for x in values[:-1]) + f" and {values[-1]:{fmt}}"

    quoted = [("olmo2_fp8", "False"), ("olmo2_noqk_fp8", "False"), ("hybrid_fp8", "False")]
    quoted += [("pre_fp8", "False"), ("peri_fp8", "False"), ("olmo2_fp8", "True")]
    quoted += [("hybrid_fp8", "True")]
    for recipe, smooth in quoted:
        assert listed(at(recipe, "fp8_under", smooth), ".3f") in text, (recipe, smooth)
    for recipe, smooth in (("olmo2_fp8", "False"), ("peri_fp8", "False"), ("olmo2_fp8", "True")):
        assert listed(at(recipe, "fp8_in_amax", smooth), ".3g") in text, (recipe, smooth)
    fp8_arms = sorted({r["recipe"] for r in runs.values() if r["recipe"].endswith("_fp8")})
    assert len(fp8_arms) == 7
    for recipe in fp8_arms:  # "at 1e-3 and 3e-3 the worst underflow stays below 1 %"
        for smooth in ("False", "True"):
            for lr in ("0.001", "0.003"):
                assert max(every(recipe, "fp8_under", smooth, lr)) < 0.01, (recipe, smooth, lr)
    # Peri-LN's mean worst underflow at 3e-2 over seeds 0-7 against Pre-LN's and OLMo 2's
    mean = {r: fmean(every(r, "fp8_under")) for r in fp8_arms}
    assert all(len(every(r, "fp8_under")) == 8 for r in ("peri_fp8", "pre_fp8", "olmo2_noqk_fp8"))
    assert (
        f"is {mean['peri_fp8']:.3f} ({mean['peri_qknorm_fp8']:.3f} with QK-norm), against "
        f"Pre-LN's {mean['pre_fp8']:.3f} ({mean['pre_qknorm_fp8']:.3f} with QK-norm) and "
        f"{mean['olmo2_noqk_fp8']:.3f}" in text
    )
    ratios = [mean["pre_fp8"] / mean["peri_fp8"], mean["pre_qknorm_fp8"] / mean["peri_qknorm_fp8"]]
    assert f"{min(ratios):.0f} to {max(ratios):.0f} times below" in text
    # the high-precision arms with Smooth-SwiGLU are the same runs as without it
    high = {r["recipe"] for r in runs.values()} - set(fp8_arms)
    for recipe in high:
        for lr in ("0.001", "0.003", "0.03"):
            same = every(recipe, "eval_loss", "True", lr) == every(recipe, "eval_loss", "False", lr)
            assert same, (recipe, lr)
    twice = sum(3 * len(every(r, "eval_loss", "True")) for r in high)
    assert f"That is {twice} of the {len(runs)} runs spent twice." in text
    over = [x for smooth in ("False", "True") for x in at("hybrid_fp8", "fp8_over", smooth)]
    assert f"{100 * min(over):.0f}-{100 * max(over):.0f} %" in text


def test_fp8_page_quotes_the_lr_probe() -> None:
    """docs/study_fp8.md's probe at lr 1e-1 (seeds 0-2, SwiGLU): the means, differences and
    underflow ranges it quotes are docs/probes/fp8_lr01's runs, set against the study's 3e-2
    runs."""
    import json

    text = " ".join((DOCS / "study_fp8.md").read_text().split())
    probe, study = DOCS / "probes" / "fp8_lr01", study_dir("fp8")
    assert f"seeds 0-2, {json.loads((probe / 'study.json').read_text())['total_s']:.0f} s" in text

    new, old = runs_of(probe), runs_of(study)
    assert len(new) == 18 and {r["status"] for r in new.values()} == {"completed"}
    spec = load_study(str(DOCS / "probes" / "fp8_lr01.yaml"))  # the file the page says ran
    assert {r.label for r in spec.recipes} == {r["recipe"] for r in new.values()}
    assert {float(r["lr"]) for r in new.values()} == {0.1}

    def loss(runs: dict, recipe: str, lr: str, key: str = "eval_loss") -> list[float]:
        return [float(runs[f"{recipe}_smooth_swigluFalse_lr{lr}_s{s}"][key]) for s in (0, 1, 2)]

    diffs, under = [], []
    for base in ("olmo2_noqk", "peri_qknorm", "peri"):
        hp, fp8 = fmean(loss(new, base, "0.1")), fmean(loss(new, f"{base}_fp8", "0.1"))
        hp3, fp83 = fmean(loss(old, base, "0.03")), fmean(loss(old, f"{base}_fp8", "0.03"))
        if base == "peri":
            assert f"worse at 1e-1 ({hp:.3f}, against {hp3:.3f} at 3e-2)" in text
            assert hp > hp3
        else:
            assert f"{hp:.3f}" in text and f"{fp8:.3f}" in text, base
            assert f"against {hp3:.3f} and {fp83:.3f}" in text, base
            assert hp < hp3 and fp8 < fp83, base
        diffs.append(f"{fp8 - hp:+.3f}")
        u = loss(new, f"{base}_fp8", "0.1", "fp8_under")
        under.append(f"{min(u):.2f}-{max(u):.2f}")
    assert f"differences are {diffs[0]}, {diffs[1]} and {diffs[2]} nats" in text
    assert f"rises to {under[0]} (OLMo 2 without QK-norm), {under[1]} (Peri-LN with" in text
    assert f"and {under[2]} (Peri-LN)" in text
