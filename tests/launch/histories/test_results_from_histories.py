"""Issue 51 item 3: `normlab verdicts DIR` builds the results table from histories laid out as
DIR/<recipe>/lr<lr>/seed<seed> (or named by --layout FILE.csv) and decides on it exactly as on
the same table written by hand; the table gets the verdicts' own checks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from normlab.launch.cli import main
from normlab.launch.errors import ConfigError
from normlab.launch.histories.options import HistoryOptions
from normlab.launch.histories.results import results_csv

LRS = ("0.001", "0.003")
SEEDS = (0, 1, 2)
L0 = 6.2


def final_eval(recipe: str, lr: str, seed: int) -> float:
    return 3.0 + (0.2 if recipe == "post" else 0.0) + (0.05 if lr == "0.003" else 0.0) + 0.01 * seed


def write_history(path: Path, recipe: str, lr: str, seed: int) -> list[float]:
    """OLMo-core names; evals every 10 steps, the last three spread around the final value."""
    evals = []
    with path.open("w") as fh:
        for step in range(0, 31):
            row: dict[str, float] = {"step": step, "train/CE loss": L0 - step * 0.1}
            if step and step % 10 == 0:
                value = final_eval(recipe, lr, seed) + 0.03 * (3 - step // 10)
                row["eval/lm/c4_en-validation/CE loss"] = value
                evals.append(value)
            fh.write(json.dumps(row) + "\n")
    return evals


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for recipe in ("pre", "post"):
        for lr in LRS:
            (root / recipe / f"lr{lr}").mkdir(parents=True)
            for seed in SEEDS:
                write_history(root / recipe / f"lr{lr}" / f"seed{seed}.jsonl", recipe, lr, seed)
    return root


def test_the_table_holds_each_runs_eval_loss(tree: Path) -> None:
    rows = list(csv.DictReader(results_csv(tree, None, HistoryOptions()).splitlines()))
    assert len(rows) == 2 * len(LRS) * len(SEEDS)
    for row in rows:
        expected = final_eval(row["recipe"], row["lr"], int(row["seed"]))
        assert float(row["eval_loss"]) == pytest.approx(expected, abs=1e-12)
        assert float(row["l0"]) == L0 and row["status"] == "completed"
    smoothed = list(
        csv.DictReader(results_csv(tree, None, HistoryOptions(), "smoothed").splitlines())
    )
    for row in smoothed:  # the median of the last three evals: the middle one
        expected = final_eval(row["recipe"], row["lr"], int(row["seed"])) + 0.03
        assert float(row["eval_loss"]) == pytest.approx(expected, abs=1e-12)


def test_verdicts_on_histories_equal_verdicts_on_the_table(tree: Path, tmp_path: Path) -> None:
    assert main(["verdicts", str(tree), "--out", str(tmp_path / "a")]) == 0
    built = tmp_path / "a" / "results_from_histories.csv"
    assert built.is_file()
    assert main(["verdicts", str(built), "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "verdicts.json").read_text())
    b = json.loads((tmp_path / "b" / "verdicts.json").read_text())
    assert a == b and a
    # the loss claim: post's best-lr mean is exactly 0.2 above pre's (final_eval), at lr 0.001
    loss = next(v for v in a if v["statistic"] == "loss_at_best_lr")
    mean = lambda r: np.mean([final_eval(r, "0.001", s) for s in SEEDS])  # noqa: E731
    assert loss["mean_a"] == pytest.approx(mean(loss["a"]), abs=1e-12)
    assert loss["delta"] == pytest.approx(mean(loss["a"]) - mean(loss["b"]), abs=1e-12)
    assert loss["best_lr_a"] == loss["best_lr_b"] == 0.001


def test_a_mapping_file(tree: Path, tmp_path: Path) -> None:
    mapping = tmp_path / "runs.csv"
    with mapping.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "recipe", "lr", "seed"])
        for f in sorted(tree.rglob("*.jsonl")):
            w.writerow([f.relative_to(tmp_path), f.parts[-3], f.parent.name[2:], f.stem[4:]])
    by_map = results_csv(tmp_path, mapping, HistoryOptions()).splitlines()
    by_dir = results_csv(tree, None, HistoryOptions()).splitlines()
    strip = lambda lines: sorted(",".join(x.split(",")[:7]) for x in lines)  # noqa: E731
    assert strip(by_map) == strip(by_dir)


def test_the_table_is_checked_as_any_table(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "pre" / "lr0.001").rename(tree / "pre" / "lr0")
    capsys.readouterr()
    assert main(["verdicts", str(tree), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "column lr" in err and "'0' is not a positive number" in err and len(err.splitlines()) == 1
    )
    assert not (tmp_path / "v").exists()


def test_a_diverged_run_needs_no_eval_loss(tree: Path) -> None:
    path = tree / "post" / "lr0.003" / "seed2.jsonl"
    path.write_text(
        path.read_text() + json.dumps({"step": 31, "train/CE loss": float("nan")}) + "\n"
    )
    rows = {
        (r["recipe"], r["lr"], r["seed"]): r
        for r in csv.DictReader(results_csv(tree, None, HistoryOptions()).splitlines())
    }
    assert rows[("post", "0.003", "2")]["status"] == "diverged"


def test_no_eval_loss_is_one_line(tmp_path: Path) -> None:
    leaf = tmp_path / "r" / "a" / "lr0.1"
    leaf.mkdir(parents=True)
    (leaf / "seed0.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(ConfigError, match="no eval loss"):
        results_csv(tmp_path / "r", None, HistoryOptions())
