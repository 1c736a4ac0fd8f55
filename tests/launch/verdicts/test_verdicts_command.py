"""`normlab verdicts RESULTS.csv`: end to end on small tables, and one line for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.cli import main

from tests.launch.verdicts.tables import LRS, rows_of, write_table

MU = np.array([6.0, 5.2, 4.6, 4.3, 4.5, 5.5, 7.0])


def _runs(tmp_path: Path, n: int = 4) -> Path:
    rng = np.random.default_rng(3)
    rows = rows_of("pre", MU + rng.normal(0, 0.02, (n, 7)), l0=8.3, status={(0, 6): "diverged"})
    rows += rows_of("post", MU + 0.5 + rng.normal(0, 0.02, (n, 7)), l0=8.3)
    rows += rows_of("solo", MU[None, :], l0=8.3)  # one seed: never decided
    return write_table(tmp_path / "runs.csv", rows)


def test_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "v"
    rc = main(["verdicts", str(_runs(tmp_path)), "--plateau", "6.0", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads((out / "verdicts.json").read_text())
    assert len(data) == 3 * 3  # three pairs x three claims
    for d in data:
        for key in ("a", "b", "size", "statistic", "verdict", "interval", "level", "seeds_needed"):
            assert key in d
    by = {(d["a"], d["b"], d["statistic"]): d for d in data}
    loss = by[("pre", "post", "loss_at_best_lr")]
    assert loss["verdict"] == "a_lower" and loss["interval"][1] < -0.1
    assert loss["delta"] == pytest.approx(-0.5, abs=0.05) and loss["level"] <= 0.05
    solo = by[("pre", "solo", "lr_sensitivity")]
    assert solo["verdict"] == "inconclusive" and "needs >= 2 seeds" in solo["note"]
    line = next(x for x in printed.splitlines() if x.startswith("pre vs post [-] loss_at_best_lr"))
    assert "A lower" in line and "level" in line and "rule:" in line and "[" in line
    assert "Exploratory" in (out / "verdicts.md").read_text()
    # a second run into the same folder replaces the verdicts files
    assert main(["verdicts", str(_runs(tmp_path)), "--out", str(out)]) == 0


def test_claims_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "- {a: pre, b: post, statistic: loss_at_best_lr, expect: a_lower}\n"
        "- {a: pre, b: missing, statistic: lr_sensitivity, expect: equivalent}\n"
    )
    out = tmp_path / "v"
    assert main(["verdicts", str(_runs(tmp_path)), "--claims", str(claims), "--out", str(out)]) == 0
    data = json.loads((out / "verdicts.json").read_text())
    assert [d["verdict"] for d in data] == ["a_lower", "not_tested"]
    assert data[0]["agrees"] == "as expected"
    assert data[0]["level"] == pytest.approx(0.05)  # the family is the one testable claim


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda r: r[1].update(lr="fast"), ["row 2", "column lr", "'fast'"]),
        (lambda r: r[2].update(status="exploded"), ["row 3", "column status"]),
        (lambda r: r[0].update(eval_loss=""), ["row 1", "column eval_loss"]),
        (lambda r: r[4].update(seed="x"), ["row 5", "column seed"]),
        (lambda r: r[3].update(seed=r[2]["seed"], lr=r[2]["lr"]), ["row 4", "repeats row 3"]),
    ],
)
def test_malformed_table(tmp_path: Path, capsys: pytest.CaptureFixture, edit, words) -> None:
    rows = rows_of("pre", np.tile(MU, (2, 1)), l0=8.3)
    edit(rows)
    path = write_table(tmp_path / "bad.csv", rows)
    assert main(["verdicts", str(path), "--out", str(tmp_path / "v")]) == 2
    line = _one_error_line(capsys)
    for w in words:
        assert w in line, line
    assert not (tmp_path / "v").exists()


def test_missing_column_and_bad_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = rows_of("pre", np.tile(MU, (2, 1)))
    path = write_table(tmp_path / "bad.csv", rows, ["recipe", "lr", "seed", "eval_loss"])
    assert main(["verdicts", str(path)]) == 2
    assert "missing column status" in _one_error_line(capsys)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert main(["verdicts", str(_runs(tmp_path)), "--out", str(busy)]) == 2
    assert "notes.txt" in _one_error_line(capsys)
    bad = tmp_path / "claims.yaml"
    bad.write_text("- {a: pre, b: post, statistic: speed}\n")
    out = str(tmp_path / "v")
    assert main(["verdicts", str(_runs(tmp_path)), "--claims", str(bad), "--out", out]) == 2
    assert "claim 1" in _one_error_line(capsys)
    assert main(["verdicts", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in _one_error_line(capsys)
    assert len(LRS) == 7


def test_aa_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "v"
    assert main(["verdicts", str(_runs(tmp_path)), "--out", str(out), "--aa", "500"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("A/A ")]
    assert [x.split()[1] for x in lines] == ["pre", "post"]  # "solo" has one seed
    assert all("<= 0.0695: pass" in x for x in lines), lines  # .05 + 2 sqrt(.05 .95 / 500)
    assert "Simulated A/A" in (out / "verdicts.md").read_text()
    assert main(["verdicts", str(_runs(tmp_path)), "--out", str(out), "--aa", "5"]) == 2
    assert "--aa" in _one_error_line(capsys)
