"""`normlab study STUDY --report-only --out DIR --merge MORE`: seeds run later joined to a committed
study's tables (launch.study.merge): the union of the runs, the committed values kept exactly, a
repeat merge a no-op, and a run whose values differ refused with DIR left as it was."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.errors import ConfigError
from normlab.launch.lr_sensitivity.protocol import run_metrics
from normlab.launch.rundir.runs import load_run
from normlab.launch.study.merge import merge_runs
from normlab.launch.study.plan import plan
from normlab.launch.study.spec import load_study
from normlab.launch.study.study_verdicts import results_rows, write_runs
from normlab.launch.verdicts.results_table import read_results

from tests.conftest import REPO

WORTSMAN = REPO / "docs" / "study" / "wortsman"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """DIR: the wortsman study as first committed (compare.csv, seeds 0 and 1, l_0 in
    sensitivity.csv); MORE: a study directory holding the same runs as seeds 2 and 3, 0.01 nats
    higher."""
    out, more = tmp_path / "out", tmp_path / "more"
    out.mkdir(), more.mkdir()
    shutil.copy(WORTSMAN / "sensitivity.csv", out / "sensitivity.csv")
    first = [r for r in _rows(WORTSMAN / "compare.csv") if r["seed"] in ("0", "1")]
    with (out / "compare.csv").open("w", newline="") as fh:  # the study as first committed
        writer = csv.DictWriter(fh, list(first[0]))
        writer.writeheader()
        writer.writerows(first)
    runs = []
    for r in first:
        runs.append(
            r | {"seed": str(int(r["seed"]) + 2), "run": r["run"][:-1] + str(int(r["seed"]) + 2)}
        )
    with (more / "compare.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(runs[0]))
        writer.writeheader()
        writer.writerows(runs)
    return out, more


def _more_results(more: Path, out: Path, shift: float) -> None:
    """MORE's results.csv: DIR's runs (as the merge reads them) at seed + 2, loss + shift."""
    from dataclasses import replace

    base = read_results(out / "results.csv")
    write_runs(
        [replace(r, seed=r.seed + 2, eval_loss=r.eval_loss + shift) for r in base],
        more / "results.csv",
    )


def test_merge_joins_seeds_keeps_committed_values_and_repeats_as_a_no_op(dirs) -> None:
    out, more = dirs
    spec = load_study("wortsman")
    # DIR alone (no source) writes its committed runs as results.csv: l_0 from sensitivity.csv
    assert merge_runs(spec, out, []) == []
    base = read_results(out / "results.csv")
    committed = {
        (r["recipe"], float(r["lr"]), int(r["seed"])): r for r in _rows(out / "compare.csv")
    }
    l0 = {r["recipe"]: float(r["init_loss"]) for r in _rows(WORTSMAN / "sensitivity.csv")}
    assert len(base) == len(committed) == 70
    for r in base:
        row = committed[(r.recipe, r.lr, r.seed)]
        assert r.eval_loss == float(row["eval_loss"]) and r.status == row["status"]
        assert r.l0 == l0[r.recipe]
    _more_results(more, out, 0.01)
    lines = merge_runs(spec, out, [more])
    assert lines == [f"{more}: 70 of 70 runs added (seeds [2, 3])"]
    merged = read_results(out / "results.csv")
    assert sorted({r.seed for r in merged}) == [0, 1, 2, 3] and len(merged) == 140
    by_key = {(r.recipe, r.lr, r.seed): r for r in merged}
    for r in base:
        kept = by_key[(r.recipe, r.lr, r.seed)]  # seeds 0 and 1 exactly as committed
        assert (kept.eval_loss, kept.status, kept.l0) == (r.eval_loss, r.status, r.l0)
        assert by_key[(r.recipe, r.lr, r.seed + 2)].eval_loss == pytest.approx(r.eval_loss + 0.01)
    assert len(_rows(out / "compare.csv")) == 140
    before = {f: (out / f).read_bytes() for f in ("results.csv", "compare.csv")}
    assert merge_runs(spec, out, [more]) == [f"{more}: 0 of 70 runs added (seeds [2, 3])"]
    assert {f: (out / f).read_bytes() for f in before} == before


def test_a_run_with_other_values_is_refused_and_nothing_is_written(dirs) -> None:
    out, more = dirs
    spec = load_study("wortsman")
    merge_runs(spec, out, [])
    _more_results(more, out, 0.0)
    merge_runs(spec, out, [more])
    before = {f: (out / f).read_bytes() for f in ("results.csv", "compare.csv")}
    _more_results(more, out, 0.5)  # the same seeds 2 and 3 with other losses
    with pytest.raises(ConfigError, match=r"seed [23] is already in results.csv with other"):
        merge_runs(spec, out, [more])
    assert {f: (out / f).read_bytes() for f in before} == before
    assert not list(out.glob(".*merge-tmp"))
    with pytest.raises(ConfigError, match="cannot read the results table"):
        merge_runs(spec, out, [more.parent / "absent"])


def test_merge_needs_report_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = str(REPO / "recipes" / "studies" / "wortsman.yaml")
    assert main(["study", study, "--out", str(tmp_path), "--merge", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["normlab study: error: --merge joins finished runs: give it with --report-only"]


def _seed_0_and_seed_1(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *more_args: str
) -> tuple[str, Path, Path]:
    """A tiny study without claims (1 block, 2 rates, 4 steps), run for real: seed 0 into DIR,
    seed 1 into MORE (with `more_args` added). Returns (the study file, DIR, MORE)."""
    from tests.launch.study.test_study_file import tiny_set, write_study

    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    body = {
        "name": "later_seeds",
        "recipes": ["pre_nowarmup"],
        "set": {**tiny_set(tiny_data), "model.n_layers": 1, "training.eval_every": 0},
        "grid": {"optim.lr": [1e-3, 1e-2]},
        "seeds": [0, 1],
        "steps": 4,
        "protocol": {"claims": False},
    }  # fmt: skip
    study = str(write_study(tmp_path / "later_seeds.yaml", body))
    out, more = tmp_path / "out", tmp_path / "more"
    assert main(["study", study, "--seeds", "0", "--out", str(out)]) == 0
    assert main(["study", study, "--seeds", "1", "--out", str(more), *more_args]) == 0
    return study, out, more


def test_seeds_run_later_merge_into_a_study_without_claims(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented way to add seeds, end to end with real runs, for a study that decides no
    claims (the transfer studies): seed 0 into DIR, seed 1 into MORE, then `--report-only
    --merge`. Every study's report writes results.csv, so MORE has the table the merge reads, and
    DIR's rebuilt tables hold both seeds with MORE's values as they were measured."""
    study, out, more = _seed_0_and_seed_1(tiny_data, tmp_path, monkeypatch)
    assert {r.seed for r in read_results(more / "results.csv")} == {1}
    first_figure = (out / "lr_loss.png").read_bytes()
    first_logits = (out / "lr_logits.png").read_bytes()
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 0
    assert (out / "lr_loss.png").read_bytes() != first_figure  # redrawn with both seeds
    # results.csv carries each run's metrics as its run directory measured them, so the log Z
    # figure is redrawn with both seeds too, and study.md has no note that it is stale
    measured = {(r.lr, r.seed): r.metrics for r in read_results(out / "results.csv")}
    for where in (out, more):
        for run_dir in (where / "runs").iterdir():
            run = load_run(run_dir)
            cfg = run.config
            key = (float(cfg["optim"]["lr"]), int(cfg["training"]["seed"]))
            assert measured[key] == pytest.approx(run_metrics(run), nan_ok=True)
            assert math.isfinite(measured[key]["logz_mean_final"])
    assert (out / "lr_logits.png").read_bytes() != first_logits
    assert "not redrawn" not in (out / "study.md").read_text()
    merged = {(r.lr, r.seed): r for r in read_results(out / "results.csv")}
    assert sorted(merged) == [(1e-3, 0), (1e-3, 1), (1e-2, 0), (1e-2, 1)]
    for r in _rows(more / "compare.csv"):
        assert merged[(float(r["lr"]), 1)].eval_loss == float(r["eval_loss"])
    (row,) = _rows(out / "sensitivity.csv")
    assert row["seeds"] == "0 1"
    # the report says what was joined: the first run's 2 runs, then MORE's 2 (study.json)
    record = json.loads((out / "study.json").read_text())
    (joined,) = record["merged"]
    assert (joined["runs"], joined["seeds"], joined["jobs"]) == (2, [1], 1)
    assert joined["wall_s"] == json.loads((more / "study.json").read_text())["wall_s"]
    setting = next(
        line for line in (out / "study.md").read_text().splitlines() if "Setting" in line
    )
    assert setting.endswith(
        f"Joined later with `--merge`: 2 runs (seeds 1, {joined['wall_s']:.0f} s); 4 runs in all."
    )
    assert "; 2 runs in " in setting
    # a repeat adds nothing and says nothing twice
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 0
    assert (out / "study.md").read_text().count("Joined later") == 1
    assert json.loads((out / "study.json").read_text())["merged"] == record["merged"]
    # the rows the rebuilt report reads carry each run's max attention logit from compare.csv
    # (results.csv has the losses only; the ladder fits the max logit)
    spec = load_study(study)
    rows, _ = results_rows(plan(spec, out), out)
    logged = {
        (float(r["lr"]), int(r["seed"])): float(r["max_logit"]) for r in _rows(out / "compare.csv")
    }
    assert len(rows) == 4
    for r in rows:
        assert r["max_logit"] == logged[(float(r["lr"]), r["seed"])] > 0


def test_a_table_without_the_runs_metrics_keeps_lr_logits_and_says_so(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge from a results.csv written before it carried the runs' metrics (empty cells) cannot
    redraw lr_logits.png without mixing seeds: the figure stays as it was drawn, and study.md and
    the printed notes say how many runs lack them. "nan" (not measured) differs from empty (not
    carried)."""
    study, out, more = _seed_0_and_seed_1(tiny_data, tmp_path, monkeypatch)
    rows = _rows(more / "results.csv")
    rows[0]["logz_max"] = "nan"  # measured nothing: still carried
    for r in rows[1:]:
        r.update({k: "" for k in ("max_logit", "logz_mean_final", "logz_min", "logz_max")})
    with (more / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    carried = {r.seed: r.metrics for r in read_results(more / "results.csv")}
    assert math.isnan(read_results(more / "results.csv")[0].metrics["logz_max"])
    assert "logz_max" not in read_results(more / "results.csv")[1].metrics
    assert set(carried) == {1}
    figure = (out / "lr_logits.png").read_bytes()
    assert main(["study", study, "--report-only", "--out", str(out), "--merge", str(more)]) == 0
    assert (out / "lr_logits.png").read_bytes() == figure
    text = (out / "study.md").read_text()
    note = (
        "*lr_logits.png not redrawn after the merge: 1 of the 4 runs have no log Z in results.csv "
        "(a table written before results.csv carried the runs' metrics), so it still shows the "
        "runs it was first drawn from.*"
    )
    assert text.count(note) == 1
    lines = text.splitlines()
    assert lines[lines.index(note) - 2].endswith("(lr_logits.png)")
    # the merged table keeps the difference: an empty cell stays empty, "nan" stays nan
    merged = read_results(out / "results.csv")
    assert sum("logz_max" not in r.metrics for r in merged) == 1
    assert sum(math.isnan(r.metrics.get("logz_max", 0.0)) for r in merged) == 1
    # a repeat does not add the note twice
    assert main(["study", study, "--report-only", "--out", str(out)]) == 0
    assert (out / "study.md").read_text().count(note) == 1
