"""Every resume command normlab prints is run as printed (issue 30, item 8): the stop line's
backquoted command, split as a shell would and run from PATH, resumes the run to its end.

* one process (`normlab train RECIPE overrides`): the printed `normlab train RUN` continues the
  same loss curve as an uninterrupted run with the same overrides;
* 2 ranks with overrides (`normlab launch ... engine.name=fsdp data.batch_size=4`, the case that
  used to print a command refused for another global batch): `normlab launch RUN
  --nproc-per-node 2` resumes it (the run directory's config.yaml holds the overrides);
* a SLURM job of `normlab submit` (sbatch, srun and scontrol faked on PATH; the local cluster of
  tests/launch/cluster/test_slurm.py is not needed): the printed `sbatch RUN/submit.sbatch`
  resubmits the job, whose script resumes the run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cluster.script import SCRIPT_NAME
from normlab.launch.rundir.signals import BATCH_SCRIPT

from tests.dist_helpers import assert_same_curve, env, losses, prepare_tiny, write_recipe

BIN = str(Path(sys.executable).parent)  # where `normlab` is installed


def _path_env(*dirs: str) -> dict[str, str]:
    return {**env(), "PATH": os.pathsep.join([*dirs, BIN, os.environ["PATH"]])}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("as_printed")
    data = prepare_tiny(root)
    return {"root": root, "recipe": write_recipe(root, data, 16, 0)}


def _stop_at_step(cmd: list[str], run: Path, step: int, extra_env: dict[str, str]) -> str:
    """Start `cmd`, SIGTERM it once `run` logged `step`; return the backquoted resume command."""
    proc = subprocess.Popen(cmd, env=extra_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while not (run / "metrics.jsonl").is_file() or max(losses(run) or {0: 0}) < step:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    text = (out + err).decode()
    found = re.search(r"resume with `([^`]+)`", text)
    assert found, text[-3000:]
    return found.group(1)


def _run_as_printed(command: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(shlex.split(command), env=extra_env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def test_one_process_resume_as_printed(tiny: dict[str, Path]) -> None:
    root, recipe = tiny["root"], tiny["recipe"]
    over = ["training.seed=3", "optim.lr=2e-3"]  # overrides the printed command must not need
    ref = root / "single_ref"
    whole = _run_as_printed(shlex.join(["normlab", "train", str(recipe), *over, "--run-dir",
                                        str(ref)]), _path_env())  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    run = root / "single_stopped"
    cmd = ["normlab", "train", str(recipe), *over, "--run-dir", str(run)]
    printed = _stop_at_step(cmd, run, 3, _path_env())
    assert printed == f"normlab train {run}"
    done = _run_as_printed(printed, _path_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_curve(run, losses(ref))


@pytest.mark.distributed
def test_two_ranks_with_overrides_resume_as_printed(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "fsdp_b4"
    cmd = ["normlab", "launch", str(tiny["recipe"]), "engine.name=fsdp", "data.batch_size=4",
           "--nproc-per-node", "2", "--run-dir", str(run)]  # fmt: skip
    printed = _stop_at_step(cmd, run, 3, _path_env())
    assert printed == f"normlab launch {run} --nproc-per-node 2"
    done = _run_as_printed(printed, _path_env())
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "resuming" in done.stdout and max(losses(run)) == 16


def _fake_slurm(bin_dir: Path, job: int, stop_file: Path) -> None:
    """sbatch runs the script at once as job `job` (as a cluster would, later); srun runs the step
    as node 0 and, the first time, SIGTERMs every process of the step once `stop_file` exists
    (scancel of the step: slurmstepd signals them all); scontrol: this host; scancel: nothing."""
    srun = (
        'while [[ "$1" == --* ]]; do [[ "$1" == *=* ]] && shift || shift 2; done\n'
        "export SLURM_NODEID=0\n"
        'setsid "$@" & pid=$!\n'  # the step's own process group, as slurmstepd keeps it
        f"if [ ! -e {stop_file}.done ]; then touch {stop_file}.done\n"
        f'  ( while [ ! -e {stop_file} ]; do sleep 0.1; done; kill -TERM -- "-$pid" ) & fi\n'
        'wait "$pid"; code=$?; while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done\n'
        "exit $code\n"
    )
    tools = {
        "sbatch": f'echo {job}\nSLURM_JOB_ID={job} SLURM_JOB_NODELIST=localhost bash "${{@: -1}}" '
        f">>{bin_dir}/job.log 2>&1 &\n",
        "srun": srun,
        "scontrol": 'case "$1 $2" in\n  "show hostnames") echo localhost ;;\n'
        '  "show node") echo "NodeName=localhost NodeAddr=127.0.0.1" ;;\nesac\nexit 0\n',
        "scancel": "exit 0\n",
        "squeue": "exit 0\n",
        "sinfo": "exit 0\n",
    }
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.distributed
def test_slurm_job_resume_as_printed(tiny: dict[str, Path]) -> None:
    assert BATCH_SCRIPT == SCRIPT_NAME
    root, run, bin_dir = tiny["root"], tiny["root"] / "slurm_run", tiny["root"] / "slurm_bin"
    stop = root / "stop_now"
    _fake_slurm(bin_dir, 4242 + os.getpid() % 1000, stop)
    job_env = _path_env(str(bin_dir))
    recipe = write_recipe(root, root / "prepared", 80, 0)  # time to stop it mid-run
    submit = subprocess.run(["normlab", "submit", str(recipe), "--run-dir", str(run),
                             "--gpus-per-node", "0"], env=job_env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert submit.returncode == 0, submit.stderr[-3000:]
    log = bin_dir / "job.log"
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").is_file() or max(losses(run) or {0: 0}) < 3:
        assert time.monotonic() < deadline, log.read_text()[-3000:] if log.exists() else ""
        time.sleep(0.1)
    stop.touch()  # the step is SIGTERMed, as scancel does: it checkpoints, no requeue
    while "the run is" not in (text := log.read_text()) and "requeue" not in text:
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.1)
    found = re.search(r"resume with `([^`]+)`", text)
    assert found, text[-3000:]
    assert found.group(1) == f"sbatch {run / SCRIPT_NAME}"
    assert max(losses(run)) < 80
    again = _run_as_printed(found.group(1), job_env)
    assert again.returncode == 0, again.stderr
    while "the run is complete" not in log.read_text():
        assert time.monotonic() < deadline + 300, log.read_text()[-3000:]
        time.sleep(0.2)
    assert max(losses(run)) == 80


# --- several nodes (issue 47, item 4): cannot start here, so the printed command is parsed by
# the real `normlab` parser and checked to name what this node was started with; it used to end
# in "(each node with its --node-rank)" inside the backquotes, which no shell runs.


def _parsed(command: str):
    from normlab.launch.cli import build_parser

    argv = shlex.split(command)
    assert argv[0] == "normlab"
    return build_parser().parse_args(argv[1:])


@pytest.mark.parametrize("launched", [True, False], ids=["normlab-launch", "torchrun-by-hand"])
def test_multi_node_resume_command_runs_as_printed_on_its_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, launched: bool
) -> None:
    import argparse

    from normlab.launch.commands import launch as launch_cmd
    from normlab.launch.rundir import signals

    assert launch_cmd.NODE_ARGS_ENV == signals.NODE_ARGS_ENV
    run = tmp_path / "my run"  # a space: quoted as a shell needs
    for key, value in {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x",
                       "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.5"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if launched:
        node = argparse.Namespace(nnodes=2, node_rank=1, master_addr="10.0.0.5")
        monkeypatch.setenv(signals.NODE_ARGS_ENV, launch_cmd.node_args(node, 29555))
    else:
        monkeypatch.delenv(signals.NODE_ARGS_ENV, raising=False)
    printed = signals.resume_command(run)
    args = _parsed(printed)
    assert args.command == "launch"
    assert Path(args.recipe) == run and args.overrides == []
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == (4, 2, 1)
    assert args.master_addr == "10.0.0.5"
    assert args.master_port == (29555 if launched else None)
    line = signals.stop_message(signal.SIGTERM, 3, 10, run / "ckpt", printed)
    assert f"resume with `{printed}` on this node" in line
