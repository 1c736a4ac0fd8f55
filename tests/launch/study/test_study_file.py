"""Study files (recipes/studies/): the shipped ones plan and validate; unknown keys and impossible
grids are refused on one line with exit 2 and nothing written; flags override the file; a study
trains, measures l_0 before step 0 and writes sensitivity.csv by the formula; a SIGKILLed study
started again skips its finished runs and resumes the one it was training."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.commands.study import spec_from_args
from normlab.launch.lr_sensitivity.curves import lr_sensitivity
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.study.plan import plan
from normlab.launch.study.spec import STUDIES_DIR, load_study

from tests.conftest import tiny_overrides


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def tiny_set(data: Path) -> dict[str, object]:
    """The tiny shape as a study's `set:` (the study places runs and owns steps and seeds)."""
    out = {}
    for item in tiny_overrides(data, Path("unused")):
        key, _, value = item.partition("=")
        if key not in ("run_dir", "training.steps", "schedule.warmup_steps", "model.n_layers"):
            out[key] = yaml.safe_load(value)
    return out


def write_study(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(p.stem for p in STUDIES_DIR.glob("*.yaml")))
def test_shipped_studies_plan_and_validate(name: str, tmp_path: Path) -> None:
    spec = load_study(name)
    planned = plan(spec, tmp_path)  # every run's config validated
    lrs = sorted({p.lr for p in planned})
    assert len(lrs) >= 3 and len(spec.seeds) >= 2
    assert all(p.cfg.instruments.get("init_loss") for p in planned)
    assert len({p.cfg.run_dir for p in planned}) == len(planned)


def test_the_shipped_set_has_the_three_studies() -> None:
    names = {p.stem for p in STUDIES_DIR.glob("*.yaml")}
    assert {"wortsman", "lr12", "depth"} <= names
    assert load_study("depth").size == "model.n_layers"
    assert len(load_study("depth").grid["model.n_layers"]) >= 3
    quick = load_study("lr12")
    assert all("quickstart" in str(r.path) for r in quick.recipes)
    assert 1e-3 in quick.grid["optim.lr"]


BASE = {"recipes": ["pre"], "grid": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"recipies": ["pre"]},
            "unknown study key 'recipies' (did you mean 'recipes'?); study keys: name,",
        ),
        ({"grid": {"optim.lr": [1e-3]}}, "needs grid.optim.lr with at least 2 learning rates"),
        ({"grid": {"optim.lr": [1e-3, 1e-3]}}, "grid.optim.lr has a value twice"),
        ({"grid": {"optim.lr": [1e-3, -1]}}, "grid.optim.lr must be positive numbers, got -1"),
        ({"grid": {"optim.lr": [1e-3, 3e-3], "model.n_layers": []}}, "must be a non-empty list"),
        ({"grid": {"optim.lr": [1e-3, 3e-3], "training.seed": [0, 1]}}, "is given by seeds"),
        ({"set": {"optim.lr": 1e-2}}, "grid.optim.lr is also given by set/--set"),
        ({"size": "model.n_layers"}, "size must name a grid key other than optim.lr"),
        (
            {"grid": {"optim.lr": [1e-3, 3e-3], "model.n_heads": [3]}},
            "pre at optim.lr=0.001, model.n_heads=3:",
        ),
        ({"grid": {"optim.lr": [1e-3, 3e-3], "model.no_such": [1]}}, "model.no_such"),
        ({"seeds": [0, -1]}, "seeds must be integers >= 0"),
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
        ({"protocol": {"margins": 0.1}}, "unknown key 'protocol.margins'"),
        ({"recipes": ["pre", "pre"]}, "recipes given twice: pre"),
        ({"recipes": [{"recipe": "pre", "als": "x"}]}, "unknown recipes entry key 'als'"),
        ({"recipes": ["no_such_recipe"]}, "no recipe file or recipe name 'no_such_recipe'"),
    ],  # fmt: skip
)
def test_bad_study_files_exit_2_on_one_line(
    change: dict, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_study(tmp_path / "bad.yaml", {**BASE, **change})
    out = tmp_path / "out"
    assert main(["study", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not out.exists()


def test_unknown_study_name_and_a_set_on_a_grid_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = str(tmp_path / "out")
    assert main(["study", "depth", "--set", "model.n_layers=4", "--out", out]) == 2
    assert "grid.model.n_layers is also given by set/--set" in capsys.readouterr().err
    assert main(["study", "depth", "--set", "optim.lr=1e-3", "--out", out]) == 2
    assert "--set optim.lr is replaced by the study's --lrs" in capsys.readouterr().err
    assert not Path(out).exists()


def test_flags_override_the_file(tmp_path: Path) -> None:
    args = type("A", (), {})()
    args.recipes, args.lrs, args.seeds, args.steps, args.set = ["depth"], "1e-3,1e-2", "3", 170, []
    spec = spec_from_args(args)
    assert spec.grid["optim.lr"] == [1e-3, 1e-2] and spec.seeds == [3] and spec.steps == 170
    planned = plan(spec, tmp_path)
    assert len(planned) == 3 * 2 * 3  # recipes x lrs x depths, one seed
    assert {p.cfg.training.steps for p in planned} == {170}
    names = sorted(Path(p.cfg.run_dir).name for p in planned)
    assert "post_warmup_lr0.001_n_layers12_s3" in names
    assert {p.size for p in planned} == {"n_layers=2", "n_layers=6", "n_layers=12"}


def test_seeds_flag_replaces_the_seeds_recipes_give_themselves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--seeds` is every run's seeds: an entry's own `seeds:` (completep_placements, aa) gives way
    to it, and the command says which it replaced; without the flag the file's hold."""
    args = type("A", (), {})()
    args.recipes, args.lrs, args.seeds, args.steps, args.set = ["aa"], None, "8,9", None, []
    spec = spec_from_args(args)
    assert capsys.readouterr().out.strip() == (
        "--seeds 8,9 replaces the file's own seeds of (pre_a: 0 1 2 3; pre_b: 4 5 6 7)"
    )
    assert {(p.recipe, p.seed) for p in plan(spec, tmp_path)} == {
        (r, s) for r in ("pre_a", "pre_b") for s in (8, 9)
    }
    args.seeds = None
    own = {(p.recipe, p.seed) for p in plan(spec_from_args(args), tmp_path)}
    assert own == {("pre_a", s) for s in range(4)} | {("pre_b", s) for s in range(4, 8)}
    assert capsys.readouterr().out == ""


@pytest.fixture(scope="module")
def trained(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 recipe + a z-loss variant x 2 lrs x 2 depths x 2 seeds, 4 steps each (16 tiny runs)."""
    root = tmp_path_factory.mktemp("study_file")
    mp = pytest.MonkeyPatch()
    mp.setenv("NORMLAB_CACHE", str(root / "cache"))
    body = {
        "name": "tiny",
        "recipes": ["pre_nowarmup",
                    {"recipe": "pre_nowarmup", "name": "pre_z", "set": {"optim.z_loss": 1e-4}}],
        "set": {**tiny_set(tiny_data), "training.eval_every": 0},
        "grid": {"optim.lr": [1e-3, 3e-1], "model.n_layers": [1, 2]},
        "seeds": [0, 1],
        "steps": 4,
    }  # fmt: skip
    path = write_study(root / "tiny.yaml", body)
    try:
        assert main(["study", str(path), "--out", str(root / "out")]) == 0
    finally:
        mp.undo()
    return root / "out"


def test_sensitivity_csv_follows_the_formula_from_the_runs(trained: Path) -> None:
    rows = list(csv.DictReader((trained / "sensitivity.csv").open()))
    assert [(r["recipe"], r["size"]) for r in rows] == [
        ("pre_nowarmup", "n_layers=1"), ("pre_nowarmup", "n_layers=2"),
        ("pre_z", "n_layers=1"), ("pre_z", "n_layers=2"),
    ]  # fmt: skip
    plan_runs = json.loads((trained / "plan.json").read_text())["runs"]
    assert len(plan_runs) == 16
    for row in rows:
        curve = {}
        l0s = []
        for entry in plan_runs:
            if (entry["recipe"], entry["size"]) != (row["recipe"], row["size"]):
                continue
            metrics = read_jsonl(Path(entry["run_dir"]) / "metrics.jsonl")
            assert metrics[0]["step"] == 0 and "init_loss" in metrics[0]  # before step 1
            l0 = metrics[0]["init_loss"]
            assert abs(l0 - math.log(512)) < 0.3 and l0 != math.log(512)  # measured, not assumed
            l0s.append(l0)
            final = [r["eval_loss"] for r in metrics if "eval_loss" in r][-1]
            curve.setdefault(entry["lr"], []).append(min(final, l0))
        means = [sum(v) / len(v) for _, v in sorted(curve.items())]
        assert float(row["lr_sensitivity"]) == pytest.approx(lr_sensitivity(means), abs=1e-4)
        assert float(row["best_loss"]) == pytest.approx(min(means), abs=1e-4)
        assert float(row["init_loss"]) == pytest.approx(sum(l0s) / len(l0s), abs=1e-4)
        assert row["seeds"] == "0 1"
    grid = list(csv.DictReader((trained / "sensitivity_grid.csv").open()))
    assert len(grid) == 8 and {"max_logit_mean", "logz_mean_final_mean"} <= set(grid[0])
    z = [r for r in grid if r["recipe"] == "pre_z"]
    assert all(r["logz_min_mean"] != "" for r in z)
    # the output-embedding drift and log Z's peak per grid point: the runs' own logged values
    plan_runs = json.loads((trained / "plan.json").read_text())["runs"]
    for r in z:
        logged = [
            [m for m in read_jsonl(Path(e["run_dir"]) / "metrics.jsonl") if "head_mean_norm" in m]
            for e in plan_runs
            if e["recipe"] == "pre_z" and e["size"] == r["size"] and e["lr"] == float(r["lr"])
        ]
        assert len(logged) == 2 and all(logged)
        final = sum(m[-1]["head_mean_norm"] for m in logged) / 2
        peak = sum(max(x["logz_max"] for x in m) for m in logged) / 2
        assert float(r["head_mean_norm_final_mean"]) == pytest.approx(final, abs=1e-4)  # 4 places
        assert float(r["logz_max_mean"]) == pytest.approx(peak, abs=1e-4)
    md = (trained / "study.md").read_text()
    assert "## LR sensitivity (SCIENCE.md 19)" in md and "| pre_z | n_layers=2 |" in md
    assert "| pre_z | size n_layers=2, lr 0.3 | 0,1 |" in md  # every grid point, over seeds
    assert "## Verdicts (SCIENCE.md 22)" in md  # the seed articles' claims, none of them run
    assert "| not tested (not run: post_nowarmup, post_warmup) |" in md
    assert (trained / "lr_loss.png").is_file() and (trained / "lr_logits.png").is_file()


def test_status_of_the_finished_study(trained: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["status", str(trained)]) == 0
    out = capsys.readouterr().out
    assert "study tiny in" in out and "16 runs: 16 done" in out
    assert "pre_z_lr0.3_n_layers2_s1  step 4/4" in out


def test_a_sigkilled_study_skips_finished_runs_and_resumes_the_running_one(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """SIGKILL (no handler runs, no stop checkpoint) while the second of two runs trains; the
    same command again: the first is reused, the second resumes from its last checkpoint."""
    body = {
        "recipes": ["pre_nowarmup"],
        "set": {**tiny_set(tiny_data), "model.n_layers": 1, "training.eval_every": 0,
                "checkpoint.every": 5, "training.log_every": 5},
        "grid": {"optim.lr": [1e-3, 2e-3]},
        "seeds": [0],
        "steps": 60,
        "protocol": {"claims": False},
    }  # fmt: skip
    path = write_study(tmp_path / "s.yaml", body)
    out = tmp_path / "out"
    first, second = (out / "runs" / f"pre_nowarmup_lr{lr}_s0" for lr in ("0.001", "0.002"))
    cmd = [sys.executable, "-m", "normlab.launch.cli", "study", str(path), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while not (second / "checkpoints" / "step_00000005").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, "the second run never began"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads((first / "summary.json").read_text())["status"] == "completed"
    assert json.loads((second / "summary.json").read_text())["status"] == "running"  # killed
    assert main(["status", str(out)]) == 0
    status = capsys.readouterr().out
    assert "2 runs: 1 done, 1 stopped" in status and "resume when the same study command" in status
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    text = " ".join(again.stdout.split())  # rich may wrap long paths
    assert f"{first}: already trained to step 60" in text
    assert f"resuming {second} from step_000000" in text
    steps = [r["step"] for r in read_jsonl(second / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(5, 61, 5))  # no step lost or logged twice
    assert (out / "sensitivity.csv").is_file()
