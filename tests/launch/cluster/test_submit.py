"""`normlab submit` without a cluster: the rendered script (checked by bash -n and for every
line SLURM and the preemption logic rely on), cluster-file validation, bad input that must leave
the run directory untouched, the requeue decision, and `normlab status` on a local run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from normlab.launch.cli import main
from normlab.launch.cluster.requeue import decide
from normlab.launch.cluster.spec import time_limit_s

from tests.dist_helpers import check_ok, env, normlab, prepare_tiny, write_recipe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("submit")
    return {"root": root, "recipe": write_recipe(root, prepare_tiny(root), 8, 4)}


def dry_run(tiny: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    run = tiny["root"] / "dry"
    return normlab("submit", str(tiny["recipe"]), "--run-dir", str(run), "--dry-run", *args)


def test_dry_run_prints_the_script_and_writes_nothing(tiny: dict[str, Path]) -> None:
    proc = dry_run(
        tiny, "engine.name=fsdp", "--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu",
        "--time", "2-00:00:00", "--account", "proj", "--exclusive", "--mem", "0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    run = (tiny["root"] / "dry").resolve()
    for line in [
        "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu", "#SBATCH --time=2-00:00:00", "#SBATCH --account=proj",
        "#SBATCH --exclusive", "#SBATCH --mem=0", "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue", "#SBATCH --open-mode=append", f"#SBATCH --output={run}/slurm-%j.out",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "port=$(( 20000 + SLURM_JOB_ID % 20000 ))",
    ]:  # fmt: skip
        assert line in script.splitlines(), line
    assert 'launch "$RUN_DIR" --nnodes 4 --nproc-per-node 8' in script
    assert "scancel --signal=USR1" in script and "normlab.launch.cluster.requeue" in script
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr
    assert not run.exists()


def test_cluster_file_defaults_and_overrides(tiny: dict[str, Path]) -> None:
    cluster = tiny["root"] / "site.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {"partition": "cpu", "gpus_per_node": 0, "signal_grace_s": 30, "time": "1:00:00",
             "setup": ["module load gcc"], "env": {"NCCL_DEBUG": "WARN", "THREADS": 4}}
        )
    )  # fmt: skip
    proc = dry_run(tiny, "--cluster", str(cluster), "--partition", "big")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "#SBATCH --partition=big" in lines and "#SBATCH --signal=B:USR1@30" in lines
    assert "module load gcc" in lines and "export THREADS=4" in lines
    assert not any("gpus-per-node" in ln for ln in lines)  # a CPU job
    assert "--nproc-per-node 1" in proc.stdout


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (
            {"partitio": "gpu"},
            [],
            "unknown key 'cluster.partitio' (did you mean 'cluster.partition'?)",
        ),
        ({"env": {"SLURM_FOO": "1"}}, ["--gpus-per-node", "0"], "SLURM_FOO is reserved"),
        ({"time": 86400}, ["--gpus-per-node", "0"], "must be a quoted string"),
        ({"time": "1:00"}, ["--gpus-per-node", "0"], "not longer than signal_grace_s"),
        ({"time": "soon"}, ["--gpus-per-node", "0"], "cluster.time must be a SLURM time"),
        ({}, [], "give --gpus-per-node (0 for a CPU job)"),
        ({}, ["--gpus-per-node", "0", "--partition", "a b"], "is not a SLURM name"),
        ({}, ["--gpus-per-node", "-1"], "cluster.gpus_per_node must be >= 0"),
        ({}, ["--gpus-per-node", "2"], "engine.name is 'single' but the launch asks for 2"),
        ({"setup": ["a\nb"]}, ["--gpus-per-node", "0"], "cluster.setup[0] must be one line"),
    ],
)
def test_bad_cluster_settings_are_one_line(
    tiny: dict[str, Path], content: dict, args: list[str], message: str, capsys
) -> None:
    cluster = tiny["root"] / "bad.yaml"
    cluster.write_text(yaml.safe_dump(content))
    run = tiny["root"] / "never"
    argv = ["submit", str(tiny["recipe"]), "--run-dir", str(run), "--cluster", str(cluster), *args]
    assert main(argv) == 2  # in-process: the CLI's own error path, without a subprocess each
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run.exists()


def test_without_sbatch_nothing_is_submitted(tiny: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    no_slurm = {**env(), "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "normlab.launch.cli", "submit", str(tiny["recipe"]),
         "--run-dir", str(run), "--gpus-per-node", "0"],
        env=no_slurm, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and "sbatch is not installed" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not run.exists()


def test_requeue_only_after_usr1_and_a_clean_stop(tmp_path: Path) -> None:
    def status(value: str | None, stopped_by: str) -> bool:
        if value is not None:
            (tmp_path / "summary.json").write_text(json.dumps({"status": value}))
        return decide(tmp_path, stopped_by)[0]

    assert status("preempted", "USR1")
    assert not status("preempted", "TERM")  # scancel: the user wants it stopped
    assert not status("completed", "USR1")
    assert not status("running", "USR1")  # crashed, no clean checkpoint
    assert not status("diverged", "none")
    os.remove(tmp_path / "summary.json")
    assert not status(None, "USR1")


def test_slurm_time_limits() -> None:
    assert time_limit_s("30") == 1800 and time_limit_s("10:30") == 630
    assert time_limit_s("2:00:00") == 7200 and time_limit_s("1-12") == 129600
    assert time_limit_s("1-00:01:05") == 86465


def test_status_of_a_local_run(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "local"
    check_ok(normlab("train", str(tiny["recipe"]), "--run-dir", str(run)))
    proc = normlab("status", str(run), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "loss" in r][-1]
    assert info["step"] == 8 and info["total"] == 8 and info["status"] == "completed"
    assert info["loss"] == last["loss"] and info["tokens_per_s"] == last["tokens_per_s"]
    assert info["checkpoint"] == str(run / "checkpoints" / "step_00000008")
    assert info["job_id"] is None and info["eta_s"] is None
    text = normlab("status", str(run))
    assert "step 8/8" in text.stdout and "local" in text.stdout
    bad = normlab("status", str(tiny["root"]))
    assert bad.returncode == 2 and "is not a run directory" in bad.stderr


def test_run_dir_in_use_is_refused(tiny: dict[str, Path], capsys) -> None:
    """A live owner of the run directory (its lock held by this very process) blocks a submit."""
    from normlab.launch.rundir.directory import RunDirLock

    run = tiny["root"] / "busy"
    with RunDirLock(run, "normlab train"):
        before = sorted(p.name for p in run.iterdir())
        argv = ["submit", str(tiny["recipe"]), "--run-dir", str(run), "--gpus-per-node", "0"]
        assert main(argv) == 2
        assert sorted(p.name for p in run.iterdir()) == before
    err = capsys.readouterr().err
    assert "is in use by normlab train" in err and len(err.strip().splitlines()) == 1, err
