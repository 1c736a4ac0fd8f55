"""`normlab verdicts` beyond the exact count (issue 47, item 5), on a generated table small enough
for CI (4 recipes x 5 lrs x 12 seeds: C(24, 12) = 2,704,156 relabellings per claim, beyond
statistics.EXACT_LIMIT): it answers, shows its stages, and every Welch claim's permutation p is
either a sequential Monte-Carlo p with its MC standard error stated (the line, verdicts.md and
verdicts.json) or skipped where Welch decides, said so; the trained range keeps its exact
counted p. benchmarks/bench_verdicts.py times the full 50 x 20 x 100 case."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from normlab.launch import progress
from normlab.launch.cli import main
from normlab.launch.stats import sequential_mc as smc
from normlab.launch.stats import statistics as st

from tests.launch.verdicts.tables import rows_of, write_table

LRS5 = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = 12


def _table(tmp_path: Path) -> Path:
    rng = np.random.default_rng(11)
    g = np.arange(5)
    rows = []
    for r, (shift, best) in enumerate([(0.0, 2), (0.02, 2), (0.5, 1), (0.05, 3)]):
        mu = 4.0 + shift + 0.15 * (g - best) ** 2
        rows += rows_of(f"r{r}", mu + rng.normal(0, 0.15, (SEEDS, 5)), lrs=LRS5, l0=9.0)
    return write_table(tmp_path / "big.csv", rows)


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("large")
    out = tmp / "v"
    mp = pytest.MonkeyPatch()
    mp.setattr(progress, "SHORT_S", 0.0)  # every stage's line, however quick here
    try:
        import contextlib
        import io

        err, std = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            code = main(["verdicts", str(_table(tmp)), "--plateau", "4.6", "--out", str(out)])
    finally:
        mp.undo()
    return {"code": code, "out": std.getvalue(), "err": err.getvalue(), "dir": out}


def test_it_answers_and_shows_each_stage(decided: dict) -> None:
    assert math.comb(2 * SEEDS, SEEDS) > st.EXACT_LIMIT
    assert decided["code"] == 0, decided["err"]
    stages = [ln for ln in decided["err"].splitlines() if ln.startswith("verdicts: ")]
    claims = 6 * 3  # every pair of 4 recipes, three claims each
    assert any(re.match(rf"verdicts: testing claims: {claims}/{claims} in ", s) for s in stages)
    assert any("intervals, permutation p, seeds needed" in s for s in stages), stages


def test_every_welch_claim_states_how_its_permutation_p_was_found(decided: dict) -> None:
    data = json.loads((decided["dir"] / "verdicts.json").read_text())
    lines = {ln.split(":")[0]: ln for ln in decided["out"].splitlines() if " vs " in ln}
    md = (decided["dir"] / "verdicts.md").read_text()
    kinds = set()
    for d in data:
        head = f"{d['a']} vs {d['b']} [{d['size']}] {d['statistic']}"
        if d["statistic"] == "trained_range":  # exact counts: no MC, nothing to state
            assert "permutation_note" not in d and d["p_permutation"] == d["p"]
            continue
        note = d["permutation_note"]
        assert note and note in lines[head] and note in md
        if d["verdict"] == "inconclusive":  # resampled: p, its MC SE, how it stopped
            kinds.add("mc")
            assert note.startswith("Monte-Carlo") and f"MC SE {d['p_permutation_se']:.2g}" in note
            assert 1 / (smc.RESAMPLES + 1) <= d["p_permutation"] <= 1
            assert d["p_permutation_se"] > 0
        else:  # Welch decides: no resampling
            kinds.add("skipped")
            assert d["p_permutation"] is None and "skipped: Welch decides" in note
    assert kinds == {"mc", "skipped"}, kinds


def test_an_inconclusive_claim_past_the_simulated_range_is_answered_without_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim (a) undecided with MAX_SIMULATED seeds per arm already run needs more than the
    calculator searches: no simulation is run (it would cost n^2 per replicate for nothing), and
    the note says the seeds are already past its range; a decided claim is still simulated."""
    from normlab.launch.verdicts import decide as dc
    from normlab.launch.verdicts import family as vc
    from normlab.launch.verdicts.power import MAX_SIMULATED
    from normlab.launch.verdicts.results_table import build_cells, read_results

    calls: list[int] = []
    real = dc.seeds_for_cells
    monkeypatch.setattr(dc, "seeds_for_cells", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(3)
    g = np.arange(5)
    n = MAX_SIMULATED
    rows = []
    for name, shift, sd in (("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 1.0, 0.02), ("d", 0.0, 0.02)):
        mu = 20.0 + shift + 0.2 * (g - 2) ** 2
        rows += rows_of(name, mu + rng.normal(0, sd, (n, 5)), lrs=LRS5, l0=99.0)
    cells = build_cells(read_results(write_table(tmp_path / "runs.csv", rows)))
    (v,) = dc.decide(cells, [dc.Claim("a", "b", vc.LOSS)])
    assert v.verdict == st.INCONCLUSIVE and v.seeds_needed is None and not calls
    assert f"undecided at {n} seeds per arm, past the {MAX_SIMULATED}" in v.note
    (w,) = dc.decide(cells, [dc.Claim("d", "c", vc.LOSS)])
    assert w.verdict == st.A_LOWER and calls and w.seeds_needed is not None


def test_several_processes_give_the_same_verdicts_byte_for_byte(
    decided: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 2 (forked workers, here even for 18 claims) writes the same verdicts.json as one
    process: each claim's random numbers are seeded per claim, Holm runs in the parent."""
    from normlab.launch.verdicts import workers

    monkeypatch.setattr(workers, "MIN_PARALLEL", 1)
    table = _table(tmp_path)
    out = tmp_path / "v2"
    args = ["verdicts", str(table), "--plateau", "4.6", "--out", str(out), "--jobs", "2"]
    assert main(args) == 0
    assert (out / "verdicts.json").read_bytes() == (decided["dir"] / "verdicts.json").read_bytes()


def _pid_and_square(data: int, i: int) -> tuple[int, int]:
    import os

    return os.getpid(), data * i * i


def test_fan_out_runs_in_other_processes_keeps_order_and_ticks_each_item() -> None:
    import os

    from normlab.launch.verdicts.workers import fan_out

    ticks: list[int] = []
    got = fan_out(_pid_and_square, 3, 200, lambda: ticks.append(1), jobs=2)
    assert [v for _, v in got] == [3 * i * i for i in range(200)] and len(ticks) == 200
    assert os.getpid() not in {p for p, _ in got}
    one = fan_out(_pid_and_square, 3, 200, lambda: None, jobs=1)
    assert {p for p, _ in one} == {os.getpid()}


def test_jobs_below_one_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    assert (
        main(["verdicts", str(_table(tmp_path)), "--jobs", "0", "--out", str(tmp_path / "o")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs" in err[0] and ">= 1" in err[0]
    assert not (tmp_path / "o").exists()
