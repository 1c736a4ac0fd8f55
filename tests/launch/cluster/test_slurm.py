"""`normlab submit`, preemption with requeue, a 2-node job and `study --submit`, against a real
SLURM cluster: the local one of tests/slurm/cluster.sh (slurmctld + two slurmd on loopback),
which .ci/run starts. Where no cluster answers, every test here is skipped with the reason.

Preemption is what SLURM does before a time limit with `--signal=B:USR1@grace`, triggered
early: `scancel --batch --signal=USR1 JOB` (the batch shell's trap passes USR1 to the steps).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TESTS
from tests.dist_helpers import check_ok, env, free_port, losses, normlab, prepare_tiny, write_recipe

pytestmark = [pytest.mark.slurm, pytest.mark.distributed]
CLUSTER = TESTS / "slurm" / "cluster.sh"


def cluster_problem() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return f"SLURM is not installed (start the test cluster: {CLUSTER} start)"
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"no SLURM controller answers ({done.stderr.strip()}); run {CLUSTER} start"
    up = [
        ln
        for ln in done.stdout.splitlines()
        if ln.split()[-1].rstrip("*") in ("idle", "mix", "alloc")
    ]
    if len(up) < 2:
        return f"the test cluster needs 2 nodes up, sinfo says: {done.stdout.strip()!r}"
    return None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    root = tmp_path_factory.mktemp("slurm")
    data = prepare_tiny(root)
    return {"root": root, "data": data, "short": write_recipe(root, data, 8, 4)}


def submit(recipe: Path, run: Path, *args: str) -> str:
    proc = normlab("submit", str(recipe), "--run-dir", str(run), "--gpus-per-node", "0", *args)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run / "slurm.json").read_text())
    job = record["jobs"][-1]["job_id"]
    assert f"submitted job {job}" in proc.stdout
    return job


def state(job: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-t", "all", "-o", "%T"], capture_output=True, text=True
    )
    return out.stdout.strip()


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "")


def wait_done(job: str, run: Path, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while state(job) not in FINISHED:
        assert time.monotonic() < deadline, f"job {job} still {state(job)}: {log(run, job)[-3000:]}"
        time.sleep(0.5)
    assert state(job) == "COMPLETED", log(run, job)[-4000:]


def wait_step(job: str, run: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while max(losses(run), default=0) < step if (run / "metrics.jsonl").is_file() else True:
        assert state(job) in ("PENDING", "RUNNING", "CONFIGURING"), log(run, job)[-3000:]
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.1)


def log(run: Path, job: str) -> str:
    path = run / f"slurm-{job}.out"
    return path.read_text() if path.is_file() else f"(no {path})"


def test_submitted_tiny_recipe_completes(tiny: dict[str, Path]) -> None:
    """With the CPUs and memory given to srun again (Slurm 22.05 does not pass them on)."""
    run = tiny["root"] / "one"
    job = submit(tiny["short"], run, "--cpus-per-task", "2", "--mem", "1000M")
    srun = [ln for ln in (run / "submit.sbatch").read_text().splitlines() if ln.startswith("srun")]
    assert "--cpus-per-task=2 --mem=1000M" in srun[0], srun
    wait_done(job, run)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert sorted(losses(run)) == list(range(1, 9))
    status = normlab("status", str(run))
    assert status.returncode == 0, status.stderr
    assert f"job {job} COMPLETED" in status.stdout and "step 8/8" in status.stdout


def preempt(job: str) -> None:
    done = subprocess.run(
        ["scancel", "--batch", "--signal=USR1", job], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_preempted_job_requeues_and_resumes_bit_identically(tiny: dict[str, Path]) -> None:
    recipe = write_recipe(tiny["root"], tiny["data"], 400, 0)
    ref = tiny["root"] / "reference"
    check_ok(normlab("train", str(recipe), "--run-dir", str(ref)))
    run = tiny["root"] / "preempted"
    job = submit(recipe, run)
    wait_step(job, run, 10)
    preempt(job)
    # while the job checkpoints, requeues and restarts it still owns the run directory
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.suffix != ".out"}
    taken = normlab("submit", str(recipe), "--run-dir", str(run), "--gpus-per-node", "0")
    assert taken.returncode == 2 and f"belongs to SLURM job {job}" in taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1
    assert json.loads((run / "slurm.json").read_text())["jobs"][-1]["job_id"] == job
    for command in ("train", "launch"):  # nor does a local trainer get it meanwhile
        if state(job) in FINISHED:  # a loaded machine: the restarted job may be done already,
            break  # and then nothing owns the run (each command costs seconds of start-up)
        extra = ["--nproc-per-node", "1"] if command == "launch" else []
        local = normlab(command, str(run), *extra)
        if local.returncode == 0:  # it can only have got the run once the job had finished
            assert state(job) in FINISHED, local.stdout[-2000:]
            break
        assert local.returncode == 2 and f"belongs to SLURM job {job}" in local.stderr, local.stderr
    assert all((run / name).stat().st_mtime_ns == t for name, t in before.items()
               if name in ("slurm.json", "submit.sbatch"))  # fmt: skip
    wait_done(job, run, timeout=180)
    text = log(run, job)
    assert "requeued" in text and "(restart 1)" in text, text[-4000:]
    stopped = int(text.split("from step_")[1][:8])  # "resuming ... from step_000000NN"
    assert 10 <= stopped < 400
    assert losses(run) == losses(ref)  # every step's loss, bit for bit
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_two_node_job_completes_and_resumes(tiny: dict[str, Path]) -> None:
    """One rank on each of two nodes (FSDP2 on gloo), preempted and requeued, against the same
    two ranks trained uninterrupted on one node by `normlab launch` (run meanwhile)."""
    recipe = write_recipe(tiny["root"], tiny["data"], 200, 0)
    shard = ["engine.name=fsdp", "data.batch_size=2"]
    ref = tiny["root"] / "reference_2ranks"
    reference = subprocess.Popen(
        [sys.executable, "-m", "normlab.launch.cli", "launch", str(recipe), *shard,
         "--nproc-per-node", "2", "--master-port", str(free_port()), "--run-dir", str(ref)],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run = tiny["root"] / "two_nodes"
    job = submit(recipe, run, "--nodes", "2", *shard)
    wait_step(job, run, 10)
    preempt(job)
    wait_done(job, run, timeout=240)
    text = log(run, job)
    assert "(restart 1)" in text and "resuming" in text, text[-4000:]
    assert text.count("normlab: preempted by SIGUSR1") == 1  # rank 0 speaks for both
    assert reference.wait(timeout=240) == 0, reference.stderr.read()[-3000:]
    assert losses(run) == losses(ref)  # bit for bit across the preemption


def test_study_submit_then_compare(tiny: dict[str, Path]) -> None:
    out = tiny["root"] / "study"
    proc = normlab(
        "study", str(tiny["short"]), str(write_recipe(tiny["root"], tiny["data"], 6, 3)),
        "--out", str(out), "--lrs", "recipe", "--seeds", "0", "--submit", "--gpus-per-node", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = sorted(p for p in (out / "runs").iterdir())
    assert len(runs) == 2, runs
    jobs = [json.loads((r / "slurm.json").read_text())["jobs"][-1]["job_id"] for r in runs]
    for run, job in zip(runs, jobs, strict=True):
        wait_done(job, run)
    report = normlab("compare", *map(str, runs), "--out", str(out))
    assert report.returncode == 0, report.stderr
    assert (out / "compare.csv").is_file()


def test_unknown_partition_submits_nothing(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "never"
    proc = normlab("submit", str(tiny["short"]), "--run-dir", str(run), "--gpus-per-node", "0",
                   "--partition", "nosuch")  # fmt: skip
    assert proc.returncode == 2 and "unknown partition 'nosuch'" in proc.stderr
    assert "debug" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not run.exists()


def test_refused_job_leaves_the_run_dir_as_it_was(tiny: dict[str, Path]) -> None:
    """Every local check passes but sbatch refuses (no node has that much memory)."""
    run = tiny["root"] / "refused"
    run.mkdir()
    (run / "notes.txt").write_text("a user's file")
    fresh = normlab("submit", str(tiny["short"]), "--run-dir", str(run / "new"),
                    "--gpus-per-node", "0", "--mem", "9999999G")  # fmt: skip
    assert fresh.returncode == 2 and "sbatch refused the job" in fresh.stderr, fresh.stderr
    assert len(fresh.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # run/new removed again
