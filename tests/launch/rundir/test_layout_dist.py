"""2 ranks on CPU (gloo): a checkpoint whose shard is gone from both the disk and manifest.json
is refused by `normlab launch` on one line naming the file, before any rank loads it, for FSDP2
(a DCP storage file) and DeepSpeed ZeRO-1 (rank 1's optimizer partition)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist_helpers import check_ok, launch, prepare_tiny, write_recipe
from tests.launch.rundir.test_layout import drop

pytestmark = pytest.mark.distributed
ENGINES = {
    "fsdp": (("engine.name=fsdp",), "dcp/__1_0.distcp", "DCP's .metadata"),
    "zero1": (
        ("engine.name=deepspeed", "engine.zero_stage=1"),
        "deepspeed/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "ZeRO rank 1",
    ),
}


# CI: FSDP2's DCP shards; `-m slow`: DeepSpeed's ZeRO files (the same manifest check)
@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=pytest.mark.slow) if e != "fsdp" else e for e in ENGINES]
)
def test_a_shard_missing_from_disk_and_manifest_is_named(tmp_path: Path, engine: str) -> None:
    over, gone, who = ENGINES[engine]
    recipe = write_recipe(tmp_path, prepare_tiny(tmp_path), steps=2, every=2)
    run = tmp_path / "run"
    check_ok(launch(recipe, run, 2, *over, "data.batch_size=2"))
    ckpt = run / "checkpoints" / "step_00000002"
    drop(ckpt, gone)
    more = (*over, "data.batch_size=2", "training.steps=4")
    proc = launch(recipe, run, 2, *more, extra=("--force",))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "is damaged" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"{ckpt / gone} is missing ({who} needs it; manifest.json does not list" in lines[0]
    assert "Traceback" not in proc.stderr and "FileNotFoundError" not in proc.stderr
