"""`normlab launch`: the torchrun command it builds, the errors it raises before any rank starts
(a changed config on an existing run among them), a refusal only the ranks find printed once,
a simulated 2-node job (two torchrun agents on 127.0.0.1, node ranks 0 and 1) that reproduces
the single-process curve, and nodes started with mismatched world sizes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from normlab.launch.cli import main
from normlab.launch.config import load_config
from normlab.launch.rundir.directory import write_config

from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    env,
    free_port,
    launch,
    losses,
    normlab,
    prepare_tiny,
    write_recipe,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("launch")
    recipe = write_recipe(root, prepare_tiny(root), 8, 8)
    return {"root": root, "recipe": recipe}


def node(recipe: Path, run: Path, rank: int, port: int, nproc: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "normlab.launch.cli", "launch", str(recipe), "engine.name=fsdp"]
    cmd += ["data.batch_size=2", "--nnodes", "2", "--node-rank", str(rank)]
    cmd += ["--nproc-per-node", str(nproc), "--master-port", str(port), "--run-dir", str(run)]
    cmd += ["--rdzv-timeout", "60"]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    return [(p.wait(timeout=240), p.stdout.read().decode()) for p in procs]


def test_dry_run_prints_the_torchrun_command(tiny: dict[str, Path]) -> None:
    proc = normlab(
        "launch", str(tiny["recipe"]), "engine.name=fsdp", "optim.lr=1e-3", "--nproc-per-node",
        "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.5", "--master-port",
        "29400", "--run-dir", "runs/x", "--dry-run",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.split()
    assert cmd[1:4] == ["-P", "-m", "normlab.launch.cluster.agent"]  # torchrun, quiet at exit
    pairs = dict(zip(cmd[4::2], cmd[5::2], strict=False))
    assert pairs["--nnodes"] == "2" and pairs["--nproc-per-node"] == "4"
    assert pairs["--rdzv-backend"] == "c10d" and pairs["--rdzv-endpoint"] == "10.0.0.5:29400"
    assert pairs["--rdzv-conf"] == "is_host=0,join_timeout=600"
    # the ranks run the entry point next to this Python, not `-m` from the working directory
    at = cmd.index("--no-python")
    assert cmd[at + 1] == str(Path(sys.executable).parent / "normlab")
    tail = cmd[at + 2 :]
    assert tail == ["train", str(tiny["recipe"]), "engine.name=fsdp", "optim.lr=1e-3"] + [
        "--run-dir",
        "runs/x",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc-per-node", "2"], "engine.name is 'single' but the launch asks for 2"),
        (["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2"], "--node-rank must lie"),
        (["--nproc-per-node", "0"], "--nproc-per-node and --nnodes must be >= 1"),
        (
            ["--nproc-per-node", "2", "engine.name=deepspeed"],
            "engine deepspeed needs engine.zero_stage 1, 2 or 3",
        ),
        (["--nproc-per-node", "2", "engine.name=fdsp"], "did you mean 'fsdp'"),
        (
            ["--nproc-per-node", "2", "engine.name=deepspeed", "engine.zero_stage=2"]
            + ["precision.dtype=fp16", "training.device=cpu"],
            "DeepSpeed's CPU accelerator has no fp16 support",
        ),
    ],
)
def test_bad_launch_arguments_fail_before_torchrun(
    tiny: dict[str, Path], args: list[str], message: str
) -> None:
    run = tiny["root"] / "never"
    proc = normlab("launch", str(tiny["recipe"]), *args, "--run-dir", str(run), "--dry-run")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not run.exists()


def test_a_changed_config_is_refused_before_torchrun(tiny: dict[str, Path], capsys) -> None:
    """No dry run: torchrun would start if the launcher did not refuse first (in-process)."""
    run = tiny["root"] / "changed"
    cfg = load_config(tiny["recipe"], ["engine.name=fsdp", f"run_dir={run}"])
    write_config(run, cfg, replaced=False)
    before = (run / "config.yaml").read_bytes()
    argv = ["launch", str(tiny["recipe"]), "engine.name=fsdp", "optim.lr=1e-3"]
    assert main([*argv, "--nproc-per-node", "2", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normlab launch: error: run_dir") and "optim.lr: 0.003 -> 0.001" in err
    assert len(err.strip().splitlines()) == 1, err
    assert (run / "config.yaml").read_bytes() == before and sorted(os.listdir(run)) == [
        "config.yaml"
    ]


def test_a_broken_latest_pointer_is_refused_before_torchrun(tiny: dict[str, Path], capsys) -> None:
    run = tiny["root"] / "pointer"
    write_config(run, load_config(tiny["recipe"], ["engine.name=fsdp", f"run_dir={run}"]), False)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step_00000009\n")
    argv = ["launch", str(tiny["recipe"]), "engine.name=fsdp", "--nproc-per-node", "2"]
    assert main([*argv, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "names 'step_00000009', which is not a checkpoint directory" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_refusal_inside_the_ranks_is_printed_once(tiny: dict[str, Path]) -> None:
    """A damaged checkpoint is found only when the ranks load it: one line, exit 2, neither
    torchrun's traceback nor its failure report."""
    run = tiny["root"] / "damaged"
    check_ok(normlab("train", str(tiny["recipe"]), "engine.name=fsdp", "--run-dir", str(run)))
    shard = sorted((run / "checkpoints" / "step_00000008" / "dcp").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = launch(tiny["recipe"], run, 2, "engine.name=fsdp", "data.batch_size=2",
                  "training.steps=12", extra=("--force",))  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("normlab launch: error: checkpoint"), lines
    assert "is damaged" in lines[0] and "Traceback" not in proc.stdout + proc.stderr


def test_unreachable_rendezvous_is_a_clear_error(tiny: dict[str, Path]) -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    proc = normlab(
        "launch", str(tiny["recipe"]), "engine.name=fsdp", "--nproc-per-node", "1", "--nnodes",
        "2", "--node-rank", "1", "--master-port", str(port), "--connect-timeout", "1",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"cannot reach the rendezvous at 127.0.0.1:{port} after 1 s" in proc.stderr
    assert "start node 0 first" in proc.stderr and time.monotonic() - start < 30


def test_two_nodes_on_localhost_reproduce_single_curve(tiny: dict[str, Path]) -> None:
    ref = tiny["root"] / "single"
    check_ok(normlab("train", str(tiny["recipe"]), "--run-dir", str(ref)))
    run, port = tiny["root"] / "two_nodes", free_port()
    results = finish([node(tiny["recipe"], run, r, port) for r in (0, 1)])
    for code, out in results:
        assert code == 0 and "terminate called" not in out, out[-3000:]
    assert_same_curve(run, losses(ref))


def test_mismatched_world_sizes_are_refused(tiny: dict[str, Path]) -> None:
    """Node 0 expects 2 x 1 processes, node 1 was started with 2 x 2: no rank trains."""
    run, port = tiny["root"] / "mismatch", free_port()
    results = finish([node(tiny["recipe"], run, 0, port, 1), node(tiny["recipe"], run, 1, port, 2)])
    for (code, out), expected in zip(results, (2, 4), strict=True):
        assert code != 0
        assert f"formed a world of 3 processes but this node was launched for {expected}" in out
    assert not (run / "checkpoints").exists()
