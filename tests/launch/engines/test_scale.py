"""Scaling past one node on CPU with gloo: sharded construction with world-size-independent
init (FSDP2 meta device, DeepSpeed zero.Init), its memory, HSDP (engine.replicate) and
asynchronous checkpoints.

Tolerance of loss curves: 1e-5 in fp32 (dist_helpers.LOSS_TOL; only reduction order differs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import normlab.model.init as model_init
import pytest
import torch
from normlab.launch.engines.construct import build_on_meta, materialize
from normlab.model import Transformer

from tests.conftest import TESTS
from tests.dist_helpers import (
    assert_same_curve,
    check_ok,
    env,
    free_port,
    kill_tree,
    latest_step,
    launch,
    losses,
    normlab,
    prepare_tiny,
    write_recipe,
)

pytestmark = pytest.mark.distributed
HERE = TESTS  # the worker scripts
HALF, QUARTER = "data.batch_size=2", "data.batch_size=1"  # per rank: the single run's batch of 4


def _torchrun(worker: str, *args: str, nproc: int = 2, extra_env: dict | None = None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    proc = subprocess.run(
        [*cmd, str(HERE / worker), *args],
        env={**env(), "PYTHONPATH": str(HERE.parent), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    check_ok(proc)
    return proc


# --- 1. world-size-independent init ----------------------------------------------------------
def test_sharded_init_equals_single_process_init_for_every_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 ranks, FSDP2 (meta + fully_shard + local shards) and ZeRO-3 (zero.Init + local flat
    partitions), with generator chunks of 64 elements so shards cut through chunks: the gathered
    weights equal one process's init bit for bit, for every scheme in model.init.SCHEMES and the
    norm-side parameter kinds (DyT/Derf, residual scales, HybridNorm's N_v, Keel)."""
    from tests.dist_worker_init import SEED, all_configs

    _torchrun("dist_worker_init.py", str(tmp_path), "64")
    monkeypatch.setattr(model_init, "CHUNK", 64)
    for scheme, cfg in all_configs().items():
        torch.manual_seed(SEED)  # Transformer's own init draws from torch.initial_seed()
        expected = Transformer(cfg).state_dict()
        for engine in ("fsdp", "zero3"):
            got = torch.load(tmp_path / f"{engine}_{scheme}.pt")
            assert set(got) == set(expected), (engine, scheme)
            for key, value in expected.items():
                assert torch.equal(got[key], value), (engine, scheme, key)


@pytest.mark.parametrize(
    "scheme", [*sorted(model_init.SCHEMES), "dyt_layerscale", "derf_scalar", "hybrid_star", "keel"]
)
def test_meta_build_equals_eager_build(scheme: str) -> None:
    from tests.dist_worker_init import all_configs

    cfg = all_configs()[scheme]
    module, plan = build_on_meta(cfg)
    materialize(module, plan, 7, torch.device("cpu"))
    torch.manual_seed(7)
    eager = Transformer(cfg)
    for (name, a), b in zip(module.state_dict().items(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(module.buffers(), eager.buffers(), strict=True))


@pytest.mark.parametrize("kind", ["normal", "trunc_normal"])
def test_any_part_of_a_parameter_equals_that_part_of_the_whole(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_init, "CHUNK", 100)
    draw, n = model_init.Draw(kind, 0.02), 1037
    whole = torch.empty(n)
    draw.fill_(whole, 5, "blocks.0.w", n)
    for parts in (2, 3, 7, 16):
        size = -(-n // parts)
        pieces = []
        for r in range(parts):
            piece = torch.empty(max(0, min(n, (r + 1) * size) - r * size))
            draw.fill_(piece, 5, "blocks.0.w", n, r * size)
            pieces.append(piece)
        assert torch.equal(torch.cat(pieces), whole), parts
    other = torch.empty(n)
    draw.fill_(other, 5, "blocks.1.w", n)
    assert not torch.equal(other, whole)  # names key the streams
    if kind == "trunc_normal":
        assert whole.abs().max() <= 0.06


@pytest.mark.slow
def test_building_350m_on_two_ranks_holds_about_half_a_copy(tmp_path: Path) -> None:
    """Peak resident memory growth per rank while constructing the 350m preset (fp32, 1.47 GB
    whole) on 2 ranks, FSDP2 engine setup and ZeRO-3 construction: well under one copy."""
    _torchrun(
        "dist_worker_build_memory.py",
        str(tmp_path / "mem.json"),
        extra_env={"MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    result = json.loads((tmp_path / "mem.json").read_text())
    ratios = {e: [peak / result["full_bytes"] for peak in result[e]] for e in ("fsdp", "zero3")}
    print(f"peak growth per rank / full fp32 copy: {ratios}")
    assert all(r < 0.65 for rs in ratios.values() for r in rs), ratios


# --- 2. HSDP --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Data, 8- and 16-step recipes, and the one-process FSDP2 reference of each (DCP
    checkpoints every 4 steps; the same curve as the single engine)."""
    root = tmp_path_factory.mktemp("scale")
    data = prepare_tiny(root)
    out = {"root": root, "r8": write_recipe(root, data, 8, 4), "r16": write_recipe(root, data, 16)}
    for steps in (8, 16):
        out[f"ref{steps}"] = root / f"one{steps}"
        proc = normlab(
            "train", str(out[f"r{steps}"]), "engine.name=fsdp", "--run-dir", str(out[f"ref{steps}"])
        )
        check_ok(proc)
    return out


def _resume_from_step4(src: Path, dst: Path, recipe: Path, nproc: int, *overrides: str) -> None:
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "checkpoints" / "step_00000008")
    (dst / "checkpoints" / "latest").write_text("step_00000004\n")
    if nproc == 1:
        proc = normlab("train", str(recipe), "--run-dir", str(dst), *overrides, "--force")
    else:
        proc = launch(recipe, dst, nproc, *overrides, extra=("--force",))
    check_ok(proc)
    assert "from step_00000004" in proc.stdout


HSDP = ("engine.name=fsdp", "engine.replicate=2", QUARTER)


def _hsdp_run(tiny: dict[str, Path]) -> Path:
    """engine.replicate=2 on 4 ranks (2 replicas x 2 shards), trained once per module."""
    run = tiny["root"] / "hsdp"
    if not (run / "checkpoints" / "step_00000008").is_dir():
        check_ok(launch(tiny["r8"], run, 4, *HSDP))
    return run


def test_hsdp_2x2_follows_one_process_and_resumes_in_one(tiny: dict[str, Path]) -> None:
    """engine.replicate=2 on 4 ranks (2 replicas x 2 shards): the loss curve of one process;
    its step-4 checkpoint resumes in one process, continuing the same curve (DCP reshards)."""
    root, r8, ref = tiny["root"], tiny["r8"], losses(tiny["ref8"])
    run = _hsdp_run(tiny)
    assert_same_curve(run, ref)
    meta = json.loads((run / "checkpoints" / "step_00000008" / "engine.json").read_text())
    assert meta["world_size"] == 4 and meta.get("replicate") == 2
    _resume_from_step4(run, root / "hsdp_to_one", r8, 1, "engine.name=fsdp")
    assert_same_curve(root / "hsdp_to_one", ref)


@pytest.mark.slow  # CI: the HSDP checkpoint resumes in one process (above)
def test_hsdp_checkpoints_move_to_fsdp_and_back(tiny: dict[str, Path]) -> None:
    """The HSDP step-4 checkpoint resumes under plain FSDP on 2 ranks, and a one-process
    checkpoint resumes under HSDP on 4, each continuing the one-process curve."""
    root, r8, ref = tiny["root"], tiny["r8"], losses(tiny["ref8"])
    _resume_from_step4(_hsdp_run(tiny), root / "hsdp_to_fsdp", r8, 2, "engine.name=fsdp", HALF)
    _resume_from_step4(tiny["ref8"], root / "one_to_hsdp", r8, 4, *HSDP)
    for name in ("hsdp_to_fsdp", "one_to_hsdp"):
        assert_same_curve(root / name, ref)


def test_replicate_must_divide_the_world_size(tiny: dict[str, Path]) -> None:
    proc = launch(tiny["r8"], tiny["root"] / "bad", 2, "engine.name=fsdp", "engine.replicate=3")
    assert proc.returncode == 2 and "engine.replicate" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tiny["root"] / "bad").exists()


# --- 4. asynchronous checkpoints --------------------------------------------------------------
def _logged(run: Path) -> dict[int, float]:
    """Logged losses by step; a line cut short by the kill is left out."""
    path = run / "metrics.jsonl"
    out = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in row:
            out[row["step"]] = row["loss"]
    return out


def test_sigkill_during_async_save_keeps_latest_and_resumes_bit_identically(
    tiny: dict[str, Path],
) -> None:
    """Every DCP write sleeps 1.5 s (tests/slow_writes/sitecustomize.py), so the step-8 save is
    in flight while training goes on; the job is SIGKILLed then. `latest` still names step 4,
    and the resumed run recomputes the killed run's logged steps bit for bit."""
    run = tiny["root"] / "async_kill"
    cmd = [
        sys.executable,
        "-m",
        "normlab.launch.cli",
        "launch",
        str(tiny["r16"]),
        "engine.name=fsdp",
        "checkpoint.async=true",
        HALF,
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run),
    ]
    slow = {
        **env(),
        "NORMLAB_TEST_SLOW_WRITE_S": "1.5",
        "PYTHONPATH": os.pathsep.join([str(HERE / "slow_writes"), str(HERE.parent)]),
    }
    proc = subprocess.Popen(
        [*cmd, "--master-port", str(free_port())],
        env=slow,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    tmp8 = run / "checkpoints" / ".tmp-step_00000008"
    deadline = time.monotonic() + 180
    try:
        while not (tmp8.is_dir() and max(_logged(run), default=0) >= 10):
            assert proc.poll() is None, proc.stderr.read()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the step-8 save was never seen in flight"
            time.sleep(0.01)
        assert latest_step(run) == 4  # training ran on while step 8 was being written
    finally:
        kill_tree(proc.pid)
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
    assert latest_step(run) == 4 and tmp8.is_dir()
    before = _logged(run)
    resumed = normlab(*cmd[3:], "--master-port", str(free_port()))
    check_ok(resumed)
    assert "from step_00000004" in resumed.stdout and not tmp8.exists()
    after = _logged(run)
    assert all(after[s] == before[s] for s in before), "resume is not bit-identical"
    assert_same_curve(run, losses(tiny["ref16"]))


@pytest.mark.parametrize("engine", ["single", "deepspeed"])
def test_async_checkpoint_refused_where_unsupported(tiny: dict[str, Path], engine: str) -> None:
    proc = normlab("validate", str(tiny["r8"]), f"engine.name={engine}", "checkpoint.async=true")
    assert proc.returncode == 2 and "checkpoint.async" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
