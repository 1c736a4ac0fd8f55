"""The batch script as a cluster runs it, and who owns a run directory.

* srun is given the job's --cpus-per-task and --mem (Slurm 22.05+ does not pass them on from
  sbatch); a GPU job without them is warned about; the README's excerpt is what is rendered.
* From a working directory holding `model.py`, `data/`, `launch.py` and `normlab.py` that fail
  on import, `normlab train`, a `--dry-run` submit, a submit and its script work: the script,
  executed with stand-ins for sbatch/srun/scontrol/scancel, runs `normlab launch` through the
  entry point next to the cluster's Python and trains to completion.
* A run directory whose SLURM job is pending or running (squeue faked on PATH) is refused by
  `train` and `launch`, naming the job; the job itself refuses a directory a live local trainer
  holds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.cluster.port import PORT_BASE, PORT_SPAN
from normlab.launch.config import load_config
from normlab.launch.rundir.directory import RunDirLock, write_config
from normlab.launch.rundir.owner import check_owner_job

from tests.conftest import REPO
from tests.dist_helpers import env, losses, prepare_tiny, write_recipe

NORMLAB = Path(sys.executable).parent / "normlab"
SHADOW = "raise SystemExit('shadowed: the working directory was imported from')\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cluster_script")
    recipe = write_recipe(root, prepare_tiny(root), 6, 3)
    work = root / "work"  # a user's project directory whose files share normlab's module names
    (work / "data").mkdir(parents=True)
    for name in ("model.py", "launch.py", "normlab.py", "data/__init__.py"):
        (work / name).write_text(SHADOW)
    return {"root": root, "recipe": recipe, "work": work}


def run_in(work: Path, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [str(NORMLAB), *args], cwd=work, env={**env(), **(extra_env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def dry_script(tiny: dict[str, Path], capsys, *args: str) -> tuple[str, str]:
    argv = ["submit", str(tiny["recipe"]), "--run-dir", str(tiny["root"] / "dry"), "--dry-run"]
    assert main([*argv, *args]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def srun_line(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("srun "))


def test_srun_gets_the_jobs_cpus_and_memory(tiny: dict[str, Path], capsys) -> None:
    script, err = dry_script(
        tiny, capsys, "engine.name=fsdp", "--nodes", "2", "--gpus-per-node", "8",
        "--cpus-per-task", "48", "--mem", "200G",
    )  # fmt: skip
    lines = script.splitlines()
    assert "#SBATCH --cpus-per-task=48" in lines and "#SBATCH --mem=200G" in lines
    srun = srun_line(script).split()
    assert "--cpus-per-task=48" in srun and "--mem=200G" in srun, srun
    assert err == ""  # nothing to warn about
    script, _ = dry_script(tiny, capsys, "--gpus-per-node", "0", "--mem", "0")
    srun = srun_line(script).split()
    assert "--mem=0" in srun and not any(w.startswith("--cpus-per-task") for w in srun)


@pytest.mark.parametrize(
    ("args", "missing"),
    [
        ([], ["cpus_per_task", "mem"]),
        (["--mem", "0"], ["cpus_per_task"]),
        (["--cpus-per-task", "32"], ["mem"]),
    ],
)
def test_gpu_job_without_cpus_or_memory_is_warned(
    tiny: dict[str, Path], capsys, args: list[str], missing: list[str]
) -> None:
    _, err = dry_script(tiny, capsys, "engine.name=fsdp", "--gpus-per-node", "4", *args)
    assert len(err.strip().splitlines()) == 1 and "warning: a GPU job without" in err, err
    for key in ("cpus_per_task", "mem"):
        assert (f"{key} (--{key.replace('_', '-')})" in err) == (key in missing), err
    _, err = dry_script(tiny, capsys, "--gpus-per-node", "0")
    assert err == ""  # a CPU job: one rank, nothing to starve


def test_script_runs_the_entry_point_next_to_python(tiny: dict[str, Path], capsys) -> None:
    script, _ = dry_script(tiny, capsys, "--gpus-per-node", "0")
    assert f"PYTHON={sys.executable}" in script.splitlines()
    assert '"$NORMLAB" launch "$RUN_DIR"' in script
    assert "-m normlab.launch.cli" not in script  # nothing runs from the submit directory
    requeue = [ln for ln in script.splitlines() if "normlab.launch.cluster.requeue" in ln]
    assert requeue and all('"$PYTHON" -P -m' in ln for ln in requeue)


@pytest.mark.parametrize("doc", ["docs/guides/distributed.md", "README.md"])
def test_readme_slurm_excerpt_is_what_is_rendered(tiny: dict[str, Path], capsys, doc: str) -> None:
    readme = (REPO / doc).read_text()
    if doc == "README.md" and "## SLURM" not in readme:
        pytest.skip("the README links the guide instead of keeping the excerpt")
    section = readme[readme.index("## SLURM") :]
    match = re.search(r"An excerpt of the generated script\s+\(`([^`]*)`\):\s*```bash\n(.*?)```",
                      section, re.S)  # fmt: skip
    assert match, "the README's SLURM section lost its script excerpt"
    options, excerpt = match.group(1).split(), match.group(2).splitlines()
    script, _ = dry_script(tiny, capsys, "engine.name=fsdp", *options)
    rendered = script.splitlines()
    at = 0
    for line in (ln for ln in excerpt if ln.strip() != "..."):
        assert line in rendered[at:], f"README line not rendered (in this order): {line!r}"
        at = rendered.index(line, at) + 1


def test_train_and_dry_run_submit_from_a_directory_that_shadows_modules(
    tiny: dict[str, Path],
) -> None:
    run = tiny["root"] / "shadow_train"
    proc = run_in(tiny["work"], "train", str(tiny["recipe"]), "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max(losses(run)) == 6
    proc = run_in(tiny["work"], "submit", str(tiny["recipe"]), "--run-dir", str(run), "--dry-run",
                  "--gpus-per-node", "0")  # fmt: skip
    assert proc.returncode == 0 and "#SBATCH --nodes=1" in proc.stdout, proc.stderr


def fake_slurm(bin_dir: Path, job: int) -> None:
    """sbatch: accept the script as job `job`; srun: run the step once as node 0; scontrol: this
    host; scancel: nothing to do."""
    tools = {
        "sbatch": f"echo {job}\n",
        "srun": 'while [[ "$1" == --* ]]; do [[ "$1" == *=* ]] && shift || shift 2; done\n'
        'export SLURM_NODEID=0\nexec "$@"\n',  # the options render as --key=value or --nodes N
        "scontrol": 'case "$1 $2" in\n  "show hostnames") echo localhost ;;\n'
        '  "show node") echo "NodeName=localhost NodeAddr=127.0.0.1" ;;\nesac\n',
        "scancel": "exit 0\n",
    }
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def free_job_id() -> int:
    """A job id whose rendezvous port (PORT_BASE + id % PORT_SPAN) is free on this host."""
    for job in range(os.getpid() % PORT_SPAN, os.getpid() % PORT_SPAN + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", PORT_BASE + job % PORT_SPAN))
            except OSError:
                continue
        return job
    raise AssertionError("no free rendezvous port")


@pytest.mark.distributed
def test_submitted_script_trains_from_a_directory_that_shadows_modules(
    tiny: dict[str, Path],
) -> None:
    """`normlab submit` (sbatch faked) writes the run directory; its script, run by bash from the
    shadowing directory as SLURM would run it, trains to completion through the entry point."""
    run, job = tiny["root"] / "shadow_job", free_job_id()
    fake_slurm(tiny["root"] / "bin", job)
    path = f"{tiny['root'] / 'bin'}{os.pathsep}{os.environ['PATH']}"
    proc = run_in(tiny["work"], "submit", str(tiny["recipe"]), "--run-dir", str(run),
                  "--gpus-per-node", "0", extra_env={"PATH": path})  # fmt: skip
    assert proc.returncode == 0 and f"submitted job {job}" in proc.stdout, proc.stderr
    slurm_env = {**env(), "PATH": path, "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": "localhost"}
    done = subprocess.run(["bash", str(run / "submit.sbatch")], cwd=tiny["work"], env=slurm_env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "shadowed" not in out and f"job {job}: the run is complete" in out, out[-3000:]
    assert max(losses(run)) == 6
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


# --- who owns a run directory ---------------------------------------------------------------------


@pytest.fixture
def owned(tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run directory recorded as submitted as job 4711, and a squeue that says `state`."""
    run = tmp_path / "run"
    write_config(run, load_config(tiny["recipe"], [f"run_dir={run}"]), replaced=False)
    (run / "slurm.json").write_text(json.dumps({"jobs": [{"job_id": "4711"}]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def says(state: str) -> Path:
        squeue = bin_dir / "squeue"
        squeue.write_text(f"#!/bin/sh\n[ \"$3\" = 4711 ] && echo {state}\nexit 0\n")
        squeue.chmod(0o755)
        return run

    return says


@pytest.mark.parametrize("state", ["PENDING", "RUNNING"])
@pytest.mark.parametrize("command", ["train", "launch"])
def test_run_dir_of_a_live_job_is_refused(
    tiny: dict[str, Path], owned, capsys, state: str, command: str
) -> None:
    run = owned(state)
    before = sorted(p.name for p in run.iterdir())
    extra = ["--nproc-per-node", "1"] if command == "launch" else []
    assert main([command, str(tiny["recipe"]), "--run-dir", str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert f"belongs to SLURM job 4711, which is {state}" in err, err
    assert len(err.strip().splitlines()) == 1 and sorted(p.name for p in run.iterdir()) == before


def test_a_finished_job_or_the_job_itself_owns_nothing(owned, monkeypatch) -> None:
    check_owner_job(owned("COMPLETED"))  # squeue still lists it: not live
    check_owner_job(owned(""))  # squeue forgot it (and there is no sacct here): not live
    run = owned("RUNNING")
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    check_owner_job(run)  # the job (or its requeued restart) trains in its own directory


def test_the_job_refuses_a_directory_a_local_trainer_holds(
    tiny: dict[str, Path], owned, capsys, monkeypatch
) -> None:
    run = owned("RUNNING")
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    with RunDirLock(run, "normlab train"):  # a live local trainer (this process)
        argv = ["launch", str(run), "--nproc-per-node", "1"]  # what the batch script runs
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is in use by normlab train" in err and len(err.strip().splitlines()) == 1, err
