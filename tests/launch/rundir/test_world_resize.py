"""Resume on another number of ranks, every engine, CPU with gloo: a checkpoint written on 2 ranks
continues on 1 and on 4, one written on 1 or 4 continues on 2 (FSDP2 through DCP's resharding,
DeepSpeed ZeRO 1-3 through its universal checkpoint), with the same global batch of 4 (per-rank
batch 4 / world), so the loader continues the same global sample order and every step's loss
matches the uninterrupted single-process run within fp32 tolerance (LOSS_TOL). Another global
batch is refused on one line naming the fix; the stop message names the `normlab launch`
command that resumes the run, and that command resumes it.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
GLOBAL = 4  # sequences per step: data.batch_size = GLOBAL // world
ENGINES = {
    "fsdp": ("engine.name=fsdp",),
    "zero1": ("engine.name=deepspeed", "engine.zero_stage=1"),
    "zero2": ("engine.name=deepspeed", "engine.zero_stage=2"),
    "zero3": ("engine.name=deepspeed", "engine.zero_stage=3"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("resize")
    data = prepare_tiny(root)
    out = {"root": root, "r8": write_recipe(root, data, 8, 4), "ref8": root / "single8"}
    check_ok(normlab("train", str(out["r8"]), "--run-dir", str(out["ref8"])))
    return out


_BASES: dict[tuple[str, int], Path] = {}


def _base(tiny: dict[str, Path], engine: str, world: int) -> Path:
    """The engine's 8-step run on `world` ranks (checkpoints at steps 4 and 8), made once."""
    key = (engine, world)
    if key not in _BASES:
        run = tiny["root"] / f"{engine}_w{world}"
        batch = f"data.batch_size={GLOBAL // world}"
        check_ok(launch(tiny["r8"], run, world, *ENGINES[engine], batch))
        assert_same_curve(run, losses(tiny["ref8"]))
        _BASES[key] = run
    return _BASES[key]


def _resume(run: Path, world: int, *extra: str) -> subprocess.CompletedProcess:
    """`normlab launch RUN --nproc-per-node N --from 4` with the per-rank batch of N ranks."""
    return normlab(
        "launch", str(run), f"data.batch_size={GLOBAL // world}", *extra,
        "--nproc-per-node", str(world), "--master-port", str(free_port()), "--from", "4",
    )  # fmt: skip


# CI runs one resize per checkpoint format: a shrink 2 -> 1 of FSDP2's DCP checkpoint and a growth
# 1 -> 2 of DeepSpeed's universal checkpoint (three rank starts; 2 -> 4 needs six, four at once on
# CI's two cores; ZeRO-1 and 2 write the same optimizer partitions, and a shrink goes through the
# same conversion); `-m slow` the rest of the matrix, ZeRO-2's shrink and 4-rank starts included.
# CI: one resize (ZeRO-3, 1 -> 2 ranks: the harder direction, states re-partitioned); the
# other engine and directions with `-m slow` (tests/launch/rundir/test_layout_dist.py and
# test_distributed.py resume FSDP2 checkpoints of 2 ranks on 1 in CI)
CI_CASES = {("zero3", 1, 2)}
CASES = [
    pytest.param(
        e, s, r, id=f"{s}-{r}-{e}", marks=() if (e, s, r) in CI_CASES else pytest.mark.slow
    )
    for s, r in [(2, 1), (1, 2), (2, 4), (4, 2)]
    for e in ENGINES
]


@pytest.mark.parametrize(("engine", "saved", "resumed"), CASES)
def test_resume_on_another_world_size_follows_the_curve(
    tiny: dict[str, Path], engine: str, saved: int, resumed: int
) -> None:
    run = tiny["root"] / f"{engine}_{saved}to{resumed}"
    shutil.copytree(_base(tiny, engine, saved), run)
    proc = _resume(run, resumed)
    check_ok(proc)
    assert "from step_00000004" in proc.stdout
    assert_same_curve(run, losses(tiny["ref8"]))  # steps 1-4 on `saved`, 5-8 on `resumed` ranks
    # recorded and shown: summary.json's stretches, the resume notice, compare's engine column
    assert json.loads((run / "summary.json").read_text())["ranks"] == [[0, saved], [4, resumed]]
    assert f"resumed on {resumed} rank(s) from step 4 (written on {saved})" in proc.stdout
    shown = normlab("compare", str(run), "--out", str(run.parent / f"{run.name}_compare"))
    check_ok(shown)
    table = (run.parent / f"{run.name}_compare" / "compare.md").read_text()
    assert f", ranks {saved} -> {resumed} at step 4 |" in table, table


def test_another_global_batch_is_refused_naming_the_fix(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "fsdp_refused"
    shutil.copytree(_base(tiny, "fsdp", 2), run)
    proc = normlab(
        "launch",
        str(run),
        "--nproc-per-node",
        "1",
        "--master-port",
        str(free_port()),
        "--from",
        "4",
    )  # fmt: skip  (data.batch_size stays 2: 2 sequences per step instead of 4)
    assert proc.returncode != 0
    line = [ln for ln in proc.stderr.splitlines() if "global batch" in ln]
    assert line and "data.batch_size=4 or training.grad_accum=2" in line[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # CI: test_resume_as_printed's two-rank case resumes a printed command
def test_stop_message_names_the_launch_command_that_resumes(tiny: dict[str, Path]) -> None:
    run = tiny["root"] / "stopped"
    r16 = write_recipe(tiny["root"], Path(tiny["ref8"]).parent / "prepared", 16, 0)
    ref = tiny["root"] / "single16"
    check_ok(normlab("train", str(r16), "--run-dir", str(ref)))
    cmd = [sys.executable, "-m", "normlab.launch.cli", "launch", str(r16), "engine.name=fsdp"]
    cmd += ["data.batch_size=2", "--nproc-per-node", "2", "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import time

    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").is_file() or max(losses(run) or {0: 0}) < 3:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    found = re.search(r"resume with `([^`]+)`", text)
    assert found, text[-2000:]
    assert found.group(1) == f"normlab launch {run} --nproc-per-node 2"
    argv = shlex.split(found.group(1))
    resumed = subprocess.run(
        [sys.executable, "-m", "normlab.launch.cli", *argv[1:]],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    check_ok(resumed)
    assert_same_curve(run, losses(ref))
