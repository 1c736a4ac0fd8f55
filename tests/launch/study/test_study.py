"""normlab study on two tiny recipes with very few steps: runs trained with the instruments on,
report written, timings recorded; re-running reuses finished runs; bad recipes exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.rundir.metrics import read_jsonl
from normlab.launch.study.plan import DEFAULT_RECIPES, spike_window, study_configs
from normlab.launch.study.run import run_study
from rich.console import Console

from tests.conftest import tiny_overrides


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def overrides(data: Path) -> list[str]:
    """The tiny shape without run_dir (the study places runs) or warm-up (recipes differ)."""
    return [
        o
        for o in tiny_overrides(data, Path("unused"))
        if not o.startswith(("run_dir=", "schedule.warmup_steps="))
    ]


def test_study_trains_and_reports(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "study"
    console = Console(record=True, width=250)
    sets = [*overrides(tiny_data), "schedule.warmup_steps=0"]
    result = run_study(["pre", "post_nowarmup"], out, sets, steps=6, console=console)
    assert [r["recipe"] for r in result["runs"]] == ["pre", "post_nowarmup"]
    assert all(r["status"] == "completed" for r in result["runs"])
    timing = json.loads((out / "study.json").read_text())
    assert timing["total_s"] >= sum(r["seconds"] for r in timing["runs"]) - 1
    for name in ("pre", "post_nowarmup"):
        rows = [r for r in read_jsonl(out / "runs" / name / "metrics.jsonl") if "loss" in r]
        assert rows[-1]["step"] == 6
        assert {"resid_rms/00", "grad_norm/01", "max_logit", "spike_score/loss"} <= rows[-1].keys()
    md = (out / "compare.md").read_text()
    assert "| pre | pre | pre |" in md and "| post_nowarmup | post_nowarmup | post |" in md
    assert (out / "resid_rms_by_depth.png").is_file()
    again = run_study(["pre"], out, sets, steps=6, console=console)  # reuses the finished run
    assert again["runs"][0]["seconds"] < result["runs"][0]["seconds"] + 5
    assert "already trained to step 6" in console.export_text()


def test_default_set_and_spike_window() -> None:
    claims = {"post_warmup", "post_nowarmup", "pre", "pre_nowarmup", "deepnorm", "peri"}
    assert claims | {"ln_scaling"} <= set(DEFAULT_RECIPES)
    assert spike_window(300, None) == 60 and spike_window(20000, None) == 1000
    assert spike_window(300, 7) == 7
    cfgs = study_configs(["peri"], Path("o"), [], steps=200, window=None)
    assert cfgs[0].instruments["spike_score"] == {"window": 40, "k": 7.0}  # k from the recipe
    assert cfgs[0].instruments["activations"] is True
    assert cfgs[0].run_dir == str(Path("o") / "runs" / "peri")


def test_unknown_recipe_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["study", "no_such_recipe", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "no recipe file or recipe name 'no_such_recipe'" in err and "post_warmup" in err
    assert main(["study", "pre", "--steps", "0", "--out", str(tmp_path / "s")]) == 2
    assert not (tmp_path / "s").exists()


def test_lrs_by_seeds_mean_spread_and_verdicts(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "study"
    console = Console(record=True, width=250)
    sets = [*overrides(tiny_data), "training.log_every=10", "training.eval_every=0"]
    result = run_study(  # 30 steps: the pre recipe's own 30 warm-up steps must fit
        ["pre_nowarmup", "pre"], out, sets, steps=30, console=console, lrs=[2e-3], seeds=[0, 1]
    )
    labels = [Path(r["run_dir"]).name for r in result["runs"]]
    assert labels == [
        "pre_nowarmup_lr0.002_s0",
        "pre_nowarmup_lr0.002_s1",
        "pre_lr0.002_s0",
        "pre_lr0.002_s1",
    ]
    evals = {}
    for label in labels:
        rows = [r for r in read_jsonl(out / "runs" / label / "metrics.jsonl") if "eval_loss" in r]
        evals[label] = rows[-1]["eval_loss"]
    assert evals["pre_lr0.002_s0"] != evals["pre_lr0.002_s1"]  # the seed reached the run
    md = (out / "study.md").read_text()
    mean = (evals["pre_lr0.002_s0"] + evals["pre_lr0.002_s1"]) / 2
    sd = abs(evals["pre_lr0.002_s0"] - evals["pre_lr0.002_s1"]) / 2**0.5  # n-1 over 2 seeds
    row = next(line for line in md.splitlines() if line.startswith("| pre | lr 0.002 | 0,1 |"))
    assert f"{mean:.3f} +- {sd:.3f}" in row
    verdict = next(line for line in md.splitlines() if line.startswith("| Pre-LN trains without"))
    cells = [c.strip() for c in verdict.split("|")]
    assert cells[2:5] == ["pre_nowarmup vs pre", "-", "loss_at_best_lr"]  # SCIENCE.md 22
    assert cells[5].split(" (")[0] in ("A lower", "B lower", "equivalent", "inconclusive")
    assert "| not tested (not run: post_nowarmup, post_warmup) |" in md  # claims without runs
    decided = json.loads((out / "verdicts.json").read_text())
    assert [v["verdict"] for v in decided].count("not_tested") == 2
    assert "![mean training loss per recipe](study_loss.png)" in md
    assert (out / "study_loss.png").is_file() and (out / "study_depth.png").is_file()
    assert "decided 3 claims in" in console.export_text()


def test_bad_lrs_and_seeds_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = str(tmp_path / "s")
    assert main(["study", "pre", "--lrs", "1e-3,x", "--out", out]) == 2
    assert "--lrs must be comma-separated numbers" in capsys.readouterr().err
    assert main(["study", "pre", "--lrs", "0", "--out", out]) == 2
    assert main(["study", "pre", "--seeds", "-1", "--out", out]) == 2
    assert "--seeds must be integers >= 0" in capsys.readouterr().err
    assert main(["study", "pre", "pre", "--out", out]) == 2
    assert "given twice" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--set", "optim.lr=-1"], "--lrs"),
        (["--set", "training.seed=4"], "--seeds"),
        (["--set", "run_dir=/tmp/elsewhere"], "--out"),
        (["--steps", "5", "--set", "training.steps=7"], "--steps"),
    ],
)
def test_a_set_the_study_would_replace_exits_2(
    args: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--set of a value the study's own axes overwrite is refused instead of silently dropped."""
    out = tmp_path / "s"
    assert main(["study", "pre", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"replaced by the study's {flag}" in err, err
    assert not out.exists()


def test_set_lr_is_kept_with_lrs_recipe_and_steps_without_steps_flag(tmp_path: Path) -> None:
    sets = ["optim.lr=2e-3", "training.steps=70"]
    cfgs = study_configs(["pre"], tmp_path, sets, None, None)
    assert [(c.optim.lr, c.training.steps) for c in cfgs] == [(2e-3, 70)]


def test_jobs_train_in_worker_processes_as_one_at_a_time(tiny_data: Path, tmp_path: Path) -> None:
    """--jobs 2: the same runs (config, seed, lr carried to the workers) as one at a time."""
    sets = [*overrides(tiny_data), "training.eval_every=0", "schedule.warmup_steps=0"]
    finals = {}
    for jobs in (2, 1):
        out = tmp_path / f"jobs{jobs}"
        console = Console(record=True, width=250)
        result = run_study(
            ["pre_nowarmup"],
            out,
            sets,
            steps=4,
            console=console,
            lrs=[2e-3],
            seeds=[0, 1],
            jobs=jobs,
        )
        assert [r["seed"] for r in result["runs"]] == [0, 1]
        assert json.loads((out / "study.json").read_text())["jobs"] == jobs
        finals[jobs] = [
            [r for r in read_jsonl(Path(r["run_dir"]) / "metrics.jsonl") if "loss" in r][-1]["loss"]
            for r in result["runs"]
        ]
    assert finals[2] == finals[1] and finals[1][0] != finals[1][1]
    assert "(2 at a time)" in (tmp_path / "jobs2" / "study.md").read_text()


def test_jobs_below_one_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["study", "pre", "--jobs", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_signal_stops_the_parallel_study_before_the_next_run(
    tiny_data: Path, tmp_path: Path
) -> None:
    """SIGTERM to the study process: the runs being trained stop, no queued run starts, no
    report."""
    import signal
    import threading

    out = tmp_path / "study"
    sets = [*overrides(tiny_data), "training.eval_every=0", "schedule.warmup_steps=0"]
    original = signal.getsignal(signal.SIGTERM)

    def fire() -> None:  # once the study's own handler is in place (never the default: fatal)
        deadline = time.monotonic() + 120
        while signal.getsignal(signal.SIGTERM) == original and time.monotonic() < deadline:
            time.sleep(0.01)
        if signal.getsignal(signal.SIGTERM) != original:
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=fire)
    thread.start()
    result = run_study(
        ["pre_nowarmup"], out, sets, steps=4, lrs=[2e-3], seeds=[0, 1, 2], jobs=2, window=2
    )
    thread.join()
    assert result["stopped"] and len(result["runs"]) < 3
    assert not (out / "runs" / "pre_nowarmup_lr0.002_s2").exists()  # queued, never started
    assert not (out / "study.md").exists()
    assert signal.getsignal(signal.SIGTERM) == original  # the study's handler is gone again


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _start_two_long_runs(
    out: Path, tiny_data: Path, seeds: str = "0,1"
) -> tuple[subprocess.Popen[bytes], list[Path], Path]:
    """A `normlab study` process (its own process group) training 100000-step runs 2 at a time,
    once seeds 0 and 1 train; its output goes to study.log beside `out` (a pipe nobody reads
    would block it)."""

    mine = ("training.steps=", "checkpoint.every=")  # --steps, and the one below
    tiny = [o for o in overrides(tiny_data) if not o.startswith(mine)]
    sets = [f"--set={o}" for o in tiny] + ["--set=checkpoint.every=100000"]
    cmd = [sys.executable, "-m", "normlab.launch.cli", "study", "pre_nowarmup", "--lrs", "2e-3"]
    cmd += ["--seeds", seeds, "--jobs", "2", "--steps", "100000", "--out", str(out), *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = out.parent / "study.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    runs = [out / "runs" / f"pre_nowarmup_lr0.002_s{s}" for s in (0, 1)]
    deadline = time.monotonic() + 120
    while not all((r / "metrics.jsonl").is_file() for r in runs):  # both are training
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no two runs started: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, runs, log


def _stopped_cleanly(proc: subprocess.Popen[bytes], log: Path, says: str, signum: int) -> None:
    """The signalled study exits 128 + signum within 90 s (as `launch` does: 130 for Ctrl-C, 143
    for SIGTERM), saying `says`, with no traceback."""
    try:
        proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    output = log.read_text()
    assert proc.returncode == 128 + signum, output[-2000:]
    assert says in output and "Traceback" not in output, output[-2000:]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_sigterm_to_the_study_stops_its_running_runs_with_a_checkpoint(
    tiny_data: Path, tmp_path: Path
) -> None:
    """`kill STUDY_PID` stops the study the way a preemption does: the running runs checkpoint
    after their step and stop (they used to train on to their end), the study exits 1 saying
    how to go on, and no worker is left behind."""
    import signal

    proc, runs, log = _start_two_long_runs(tmp_path / "study", tiny_data)
    workers = [c for c in _children(proc.pid) if b"spawn_main" in _cmdline(c)]
    proc.send_signal(signal.SIGTERM)
    _stopped_cleanly(proc, log, "study stopped after 2 of 2 runs (a signal)", signal.SIGTERM)
    assert workers and not any(_alive(w) for w in workers)
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "preempted", summary
        assert summary["steps"] < 100000
        assert (run / "checkpoints" / "latest").is_file()  # the stop's own checkpoint


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_ctrl_c_stops_the_running_runs_and_starts_no_queued_one(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Ctrl-C in the terminal (SIGINT to the whole process group): both running runs checkpoint
    and stop; the queued third never starts, although a worker is free before the study has
    read the first stopped result (the worker itself marks the study stopped)."""
    import signal

    out = tmp_path / "study"
    proc, runs, log = _start_two_long_runs(out, tiny_data, seeds="0,1,2")
    os.killpg(proc.pid, signal.SIGINT)
    _stopped_cleanly(proc, log, "study stopped after 2 of 3 runs (a signal)", signal.SIGINT)
    assert not (out / "runs" / "pre_nowarmup_lr0.002_s2").exists()
    for run in runs:
        assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_workers_checkpoint_and_exit_when_the_study_is_sigkilled(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A SIGKILLed study leaves no run training on unsupervised: each worker sees its parent
    gone and SIGTERMs itself once, its trainer checkpoints and stops, the worker exits."""
    proc, runs, _ = _start_two_long_runs(tmp_path / "study", tiny_data)
    try:
        workers = [c for c in _children(proc.pid) if b"spawn_main" in _cmdline(c)]
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers and not any(_alive(w) for w in workers)
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "preempted", summary
        assert (run / "checkpoints" / "latest").is_file()  # the stop's own checkpoint
