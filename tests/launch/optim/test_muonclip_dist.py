"""MuonClip across engines and restarts, sharing one single-process and one 2-rank run per engine.

Recipe: 2 layers, d 64, 20 fp32 steps, Muon at lr 0.05 with QK-Clip at tau 0.3 (clips from about
step 5 on: the logits start near 0.12), Newton-Schulz in fp32 so that the only difference between
the runs is the gradient reduction order. On 2 gloo ranks every matrix is orthogonalised whole by
one owner rank (FSDP2: gathered from DTensor row shards; ZeRO 1/2/3: reassembled from the ranges
of the flat fp32 partitions), QK-Clip rescales DTensor rows or ZeRO partitions and their fp32
masters, S_max is MAX-reduced: the loss curve and every per-head S_max equal the single process
within 1e-5. A run SIGKILLed after its step-10 checkpoint resumes bit-identically (momentum
buffers in the checkpoint), on one process, FSDP2 and ZeRO 1, 2 and 3. (QK-Clip with AdamW:
test_qk_clip; on ZeRO partitions it is the same clip code as here.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from normlab.launch.cli import main

from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    env,
    free_port,
    kill_tree,
    latest_step,
    losses,
    normlab,
    prepare_tiny,
    start_and_kill,
    write_recipe,
)

pytestmark = pytest.mark.distributed
MUONCLIP = (
    "optim.name=muon",
    "optim.lr=0.05",
    "optim.muon_ns_dtype=fp32",
    "optim.qk_clip={tau: 0.3, alpha: 0.5}",
)
HALF = "data.batch_size=2"


def rows(run: Path) -> dict[int, dict[str, float]]:
    """Logged training rows by step (a line cut by a SIGKILL is skipped)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in row:
            out[row["step"]] = row
    return out


def kill_past_checkpoint(cmd: list[str], run: Path, timeout: float = 300) -> dict[int, dict]:
    """Start `cmd`; SIGKILL it with every descendant once it has logged two steps past its
    step-10 checkpoint (the next one is at 20). Returns the rows it logged before dying: the
    uninterrupted run's values for the steps the resumed run recomputes."""
    log = run.parent / f"{run.name}.stderr"
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while not (latest_step(run) == 10 and max(_rows_if_any(run), default=0) >= 12):
                if proc.poll() is not None:
                    raise AssertionError(f"exited before the kill: {log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no step 12 within {timeout} s")
                time.sleep(0.01)
        finally:
            kill_tree(proc.pid)
            proc.wait()
    return rows(run)


def _rows_if_any(run: Path) -> dict[int, dict]:
    return rows(run) if (run / "metrics.jsonl").is_file() else {}


def killed_and_resumed(runs: dict, name: str, *overrides: str) -> Path:
    """A 2-rank MuonClip run SIGKILLed past its step-10 checkpoint and resumed to step 20; the
    rows of the killed process are kept in runs[name + '_killed'], the resume's stdout too."""
    run = runs["root"] / name
    cmd = [sys.executable, "-m", "normlab.launch.cli", "launch", str(runs["recipe"]), *MUONCLIP]
    cmd += [*overrides, HALF, "--nproc-per-node", "2", "--run-dir", str(run)]
    runs[f"{name}_killed"] = kill_past_checkpoint([*cmd, "--master-port", str(free_port())], run)
    proc = normlab(*cmd[3:], "--master-port", str(free_port()))
    check_ok(proc)
    runs[f"{name}_stdout"] = proc.stdout
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("muonclip")
    recipe = write_recipe(root, prepare_tiny(root), steps=20, every=10)
    out: dict = {"root": root, "recipe": recipe, "single": root / "single"}
    assert main(["train", str(recipe), *MUONCLIP, "--run-dir", str(out["single"])]) == 0
    out["fsdp"] = killed_and_resumed(out, "fsdp", "engine.name=fsdp")
    return out


ZERO = {s: ("engine.name=deepspeed", f"engine.zero_stage={s}") for s in (1, 2, 3)}


def zero_run(runs: dict, stage: int) -> Path:
    """The 2-rank MuonClip run on ZeRO-`stage`, launched once per module: killed after its
    step-10 checkpoint and resumed, like the FSDP2 run."""
    name = f"zero{stage}"
    if name not in runs:
        runs[name] = killed_and_resumed(runs, name, *ZERO[stage])
    return runs[name]


def assert_same_as_single(runs: dict, run: Path) -> None:
    single, got = rows(runs["single"]), rows(run)
    assert_same_curve(run, losses(runs["single"]))
    assert single[20]["qk_clip_events"] > 10  # QK-Clip really acted
    assert single[20]["qk_clip_events"] == got[20]["qk_clip_events"]
    heads = [k for k in single[20] if k.startswith("s_max/") and "/h" in k]
    assert len(heads) == 2 * 4
    worst = max(abs(single[s][k] - got[s][k]) for s in single for k in heads)
    assert worst < 1e-5, worst


def test_fsdp_muonclip_equals_single_process(runs: dict) -> None:
    assert_same_as_single(runs, runs["fsdp"])


# ZeRO 1, 2 and 3 share the flat-partition code; CI runs stage 3 (parameters partitioned too),
# `-m slow` stages 1 and 2
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "stage", [pytest.param(1, marks=SLOW), pytest.param(2, marks=SLOW), 3]
)
def test_zero_muonclip_equals_single_process(runs: dict, stage: int) -> None:
    """Muon really runs under ZeRO (normlab's, on the flat partitions; the self-check passed)."""
    assert_same_as_single(runs, zero_run(runs, stage))


@pytest.mark.parametrize(
    "engine",
    ["fsdp", pytest.param("zero1", marks=SLOW), pytest.param("zero2", marks=SLOW), "zero3"],
)
def test_two_rank_sigkill_then_resume_is_bit_identical(runs: dict, engine: str) -> None:
    """SIGKILL (launcher, torchrun and ranks) after the step-10 checkpoint and two or more logged
    steps; the resumed run recomputes those steps with bit-identical losses and S_max (Muon's
    momentum came back from the checkpoint), then finishes (its curve: the tests above)."""
    run = runs["fsdp"] if engine == "fsdp" else zero_run(runs, int(engine[-1]))
    before, after = runs[f"{engine}_killed"], rows(run)
    redone = [s for s in before if s > 10]
    assert len(redone) >= 2 and max(redone) < 20, sorted(before)
    for s in redone:
        assert after[s]["loss"] == before[s]["loss"], s
        assert after[s]["s_max"] == before[s]["s_max"], s
    assert sorted(after) == list(range(1, 21))
    # rich wraps the "resuming <run dir> from <step>" line at 80 columns: compare words
    assert "from step_00000010" in " ".join(runs[f"{engine}_stdout"].split())


def test_fsdp_muon_checkpoint_resumes_on_one_rank(runs: dict) -> None:
    """DCP reshards Muon's momentum with the weights: step 10 of 2 ranks continues on 1."""
    run = runs["root"] / "fsdp_2to1"
    shutil.copytree(runs["fsdp"], run)
    shutil.rmtree(run / "checkpoints" / "step_00000020")
    (run / "checkpoints" / "latest").write_text("step_00000010\n")
    args = ("train", str(runs["recipe"]), *MUONCLIP, "engine.name=fsdp", "--run-dir", str(run))
    proc = normlab(*args, "--force")
    check_ok(proc)
    assert "from step_00000010" in proc.stdout
    assert_same_curve(run, losses(runs["single"]))


def test_single_sigkill_then_resume_is_bit_identical(runs: dict) -> None:
    state = torch.load(
        runs["single"] / "checkpoints" / "step_00000010" / "optim.pt", weights_only=True
    )
    buffers = [s for s in state["state"].values() if "momentum_buffer" in s]
    assert len(buffers) == 2 * 7 and all(b["momentum_buffer"].abs().sum() > 0 for b in buffers)
    run = runs["root"] / "killed"
    cmd = [sys.executable, "-m", "normlab.launch.cli", "train", str(runs["recipe"]), *MUONCLIP]
    cmd += ["--run-dir", str(run)]
    killed_at = start_and_kill(cmd, run, at_step=10)
    assert 10 <= killed_at < 20 and latest_step(run) == killed_at
    assert main(cmd[3:]) == 0  # the resume, in this process
    assert losses(run) == losses(runs["single"])  # bit-identical, every step
    assert rows(run)[20]["qk_clip_events"] == rows(runs["single"])[20]["qk_clip_events"]


def test_compare_shows_clip_events_next_to_max_logit(runs: dict) -> None:
    from normlab.launch.report.compare import compare
    from normlab.launch.report.plots import max_logit_figure
    from normlab.launch.rundir.runs import load_run

    table = compare([runs["single"], runs["fsdp"]], None)["rows"]
    for row, run in zip(table, (runs["single"], runs["fsdp"]), strict=True):
        logged = rows(run)
        assert "max_logit" not in logged[20]  # no attention_logits instrument: QK-Clip's S_max
        assert row["qk_clips"] == logged[20]["qk_clip_events"] > 10
        assert row["max_logit"] == max(r["s_max"] for r in logged.values())
    run = load_run(runs["single"])
    assert run.series("max_logit") == ([], [])
    figure = max_logit_figure([run])  # drawn from s_max
    assert figure is not None and figure.axes[0].lines
    import matplotlib.pyplot as plt

    plt.close(figure)
