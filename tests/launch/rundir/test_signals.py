"""Checkpoint-on-signal and launcher supervision, on this machine (no SLURM).

SIGTERM / SIGINT to `normlab train` finish the step, write one checkpoint, mark summary.json
("preempted" / "interrupted") and name the checkpoint in the exit line; the resumed run ends with
per-step losses bit-identical to an uninterrupted one. More signals, of any kind and in any
order, change nothing: one checkpoint, a clean exit. Ctrl-C (and more) to `normlab launch`
reaches torchrun and every rank and ends on the checkpoint line; SIGKILL of the launcher alone
leaves no rank; SIGKILL of torchrun still gives the checkpoint, trial after trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from normlab.launch.rundir.signals import STOP_SIGNALS, GracefulStop

from tests.dist_helpers import check_ok, env, free_port, losses, normlab, prepare_tiny, write_recipe

LONG = 100_000  # steps: a run that is still training whenever the signal comes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("signals")
    data = prepare_tiny(root)
    return {"root": root, "data": data, "long": write_recipe(root, data, LONG, 0)}


def start(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "normlab.launch.cli", *args]
    return subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_step(proc: subprocess.Popen, run: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    path = run / "metrics.jsonl"
    while not (path.is_file() and max(losses(run) or {0: 0}) >= step):
        if proc.poll() is not None:
            raise AssertionError(f"exited early: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.02)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def latest(run: Path) -> str:
    return (run / "checkpoints" / "latest").read_text().strip()


@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGTERM, "preempted"), (signal.SIGINT, "interrupted")]
)
def test_signal_checkpoints_and_marks_summary(tiny: dict[str, Path], sig: int, status: str) -> None:
    run = tiny["root"] / f"train_{signal.Signals(sig).name}"
    proc = start("train", str(tiny["long"]), "--run-dir", str(run))
    wait_for_step(proc, run, 3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err[-3000:]
    s = summary(run)
    step = s["steps"]
    assert s["status"] == status and 3 <= step < LONG
    assert latest(run) == f"step_{step:08d}"  # the checkpoint is of the step it stopped after
    assert max(losses(run)) == step  # the stop step was logged, nothing after it
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    assert str(ckpt) in err.strip().splitlines()[-1]  # the exit line names the checkpoint


ORDERS = [
    (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGTERM),
    (signal.SIGUSR1, signal.SIGUSR1, signal.SIGUSR1),
    (signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGINT),
]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(signal.Signals(s).name for s in o))
def test_repeated_signals_change_nothing_in_process(order: tuple[int, ...]) -> None:
    """The first stop signal is the one the run stops for; any number of others, of any kind,
    are counted and change nothing (this process survives them all)."""
    # every stop signal, not only the ones sent: after a stop GracefulStop leaves all of them
    # absorbed, and a SIG_IGN left in this worker would pass to every child it starts later
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        with GracefulStop() as stop:
            for sig in order:
                os.kill(os.getpid(), sig)
                time.sleep(0.01)  # Python runs the handler between bytecodes
            assert stop.received == order[0] and stop.repeats == len(order) - 1
            assert stop.agreed() == order[0]  # one process: its own signal
        for sig in order:  # after the stop, late repeats stay absorbed (the process is exiting)
            assert signal.getsignal(sig) == signal.SIG_IGN
            os.kill(os.getpid(), sig)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_repeated_signals_give_one_checkpoint(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "repeated"
    proc = start("train", str(tiny["long"]), "--run-dir", str(run))
    wait_for_step(proc, run, 3)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
        proc.send_signal(sig)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    s = summary(run)
    step = s["steps"]
    assert s["status"] == "interrupted" and latest(run) == f"step_{step:08d}", s
    saved = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert saved == [f"step_{step:08d}"]  # one checkpoint, of the step it stopped after
    assert err.count("checkpoint /") == 1 and "Traceback" not in err, err[-3000:]
    assert str(run / "checkpoints" / f"step_{step:08d}") in err.strip().splitlines()[-1]


def test_resume_after_sigterm_is_bit_identical(tiny: dict[str, Path]) -> None:
    recipe = write_recipe(tiny["root"], tiny["data"], 200, 0)
    ref = tiny["root"] / "uninterrupted"
    check_ok(normlab("train", str(recipe), "--run-dir", str(ref)))
    run = tiny["root"] / "stopped"
    proc = start("train", str(recipe), "--run-dir", str(run))
    wait_for_step(proc, run, 5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    stopped_at = summary(run)["steps"]
    assert proc.returncode == 143 and stopped_at < 200, "the run ended before the signal"
    resumed = normlab("train", str(run))
    check_ok(resumed)
    assert f"from step_{stopped_at:08d}" in resumed.stdout
    assert losses(run) == losses(ref)  # exact equality of every step's loss
    assert summary(run)["status"] == "completed"


def survivors(run: Path) -> list[psutil.Process]:
    """Processes (launcher, torchrun, ranks) whose command line names this run directory."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if str(run) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
            found.append(p)
    return found


def launch_long(tiny: dict[str, Path], run: Path) -> subprocess.Popen:
    return start(
        "launch", str(tiny["long"]), "engine.name=fsdp", "data.batch_size=2",
        "--nproc-per-node", "2", "--master-port", str(free_port()), "--run-dir", str(run),
    )  # fmt: skip


@pytest.mark.distributed
def test_ctrl_c_and_more_signals_to_launcher_give_one_checkpoint(tiny: dict[str, Path]) -> None:
    """Ctrl-C, then TERM, USR1 and INT again: every rank stops after the same step with one
    checkpoint; the output ends with the checkpoint line, without torchrun's traceback."""
    run = tiny["root"] / "launch_int"
    proc = launch_long(tiny, run)
    wait_for_step(proc, run, 3)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        proc.send_signal(sig)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    s = summary(run)
    assert s["status"] == "interrupted" and latest(run) == f"step_{s['steps']:08d}"
    last = err.strip().splitlines()[-1]
    assert last.startswith("normlab: interrupted by SIGINT") and s["message"] in last, last
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    assert not survivors(run)


TRIALS = 2


@pytest.mark.distributed
def test_sigkilled_torchrun_gives_one_checkpoint_every_time(tiny: dict[str, Path]) -> None:
    """torchrun SIGKILLed (the launcher lives on): its ranks get the parent-death signal, at
    times more than once, and each trial still ends with the stop step's checkpoint, a
    "preempted" summary and no process left. Each trial resumes the previous one's checkpoint."""
    run, stopped = tiny["root"] / "torchrun_kill", 0
    for trial in range(TRIALS):
        proc = launch_long(tiny, run)
        wait_for_step(proc, run, stopped + 3)
        launcher = psutil.Process(proc.pid)
        (torchrun,) = launcher.children()
        torchrun.kill()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGKILL, f"trial {trial}: {err[-3000:]}"
        s = summary(run)
        assert s["status"] == "preempted", f"trial {trial}: {s} {err[-3000:]}"
        assert s["steps"] > stopped and latest(run) == f"step_{s['steps']:08d}", (trial, s)
        assert max(losses(run)) == s["steps"], trial  # nothing trained past the checkpoint
        assert "Traceback" not in err, f"trial {trial}: {err[-3000:]}"
        assert not survivors(run), trial
        stopped = s["steps"]


@pytest.mark.distributed
def test_sigkilled_launcher_leaves_no_rank(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "launch_kill"
    proc = launch_long(tiny, run)
    wait_for_step(proc, run, 3)
    tree = survivors(run)
    assert len(tree) >= 4  # launcher, torchrun, two ranks
    proc.kill()  # the launcher's PID alone
    proc.communicate()
    gone, alive = psutil.wait_procs([p for p in tree if p.pid != proc.pid], timeout=20)
    assert not alive, [p.info["cmdline"] for p in alive]
    assert summary(run)["status"] == "preempted"  # torchrun's death signal let the ranks save
