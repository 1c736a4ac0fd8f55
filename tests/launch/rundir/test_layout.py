"""A sharded checkpoint missing a file from both the disk and manifest.json is refused naming
that file: DCP's .metadata (FSDP2) and engine.json's world size and ZeRO stage (DeepSpeed) say
which files the load reads. Unit cases on checkpoints built here; the 2-rank runs are in
tests/launch/rundir/test_layout_dist.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from normlab.launch.rundir.layout import missing_file
from normlab.launch.rundir.manifest import MANIFEST, find_damage, write_manifest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def drop(ckpt: Path, rel: str) -> None:
    """Delete `rel` from the disk and from manifest.json (a loss the manifest cannot see)."""
    (ckpt / rel).unlink()
    manifest = json.loads((ckpt / MANIFEST).read_text())
    del manifest["files"][rel]
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def _dcp_ckpt(root: Path) -> Path:
    ckpt = root / "step_00000004"
    ckpt.mkdir()
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4)}, "optim": {"m": torch.ones(5)}}
    dcp.save(state, checkpoint_id=ckpt / "dcp")  # one process: no process group needed
    (ckpt / "engine.json").write_text(json.dumps({"format": "dcp", "world_size": 1}))
    torch.save({"step": 4}, ckpt / "trainer_rank0.pt")
    write_manifest(ckpt)
    return ckpt


def test_a_complete_dcp_checkpoint_passes(tmp_path: Path) -> None:
    ckpt = _dcp_ckpt(tmp_path)
    assert find_damage(ckpt) is None


def test_a_dcp_shard_missing_from_disk_and_manifest_is_named(tmp_path: Path) -> None:
    ckpt = _dcp_ckpt(tmp_path)
    shards = sorted(p.name for p in (ckpt / "dcp").glob("*.distcp"))
    assert shards, "DCP wrote no storage file"
    drop(ckpt, f"dcp/{shards[0]}")
    assert find_damage(ckpt) == (
        f"{ckpt / 'dcp' / shards[0]} is missing (DCP's .metadata needs it; manifest.json does "
        "not list it either)"
    )


def test_a_truncated_unlisted_shard_and_a_missing_metadata_are_named(tmp_path: Path) -> None:
    ckpt = _dcp_ckpt(tmp_path)
    shard = sorted((ckpt / "dcp").glob("*.distcp"))[0]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size - 8])
    write_manifest(ckpt)  # the manifest agrees with the damaged file: only .metadata knows
    got = find_damage(ckpt)
    assert (
        got == f"{shard} is truncated ({size - 8} bytes; DCP's .metadata reads up to byte {size})"
    )
    drop(ckpt, "dcp/.metadata")
    assert find_damage(ckpt) == (
        f"{ckpt / 'dcp' / '.metadata'} is missing (a DCP checkpoint needs it; manifest.json does "
        "not list it either)"
    )


def test_a_missing_rank_trainer_state_is_named(tmp_path: Path) -> None:
    ckpt = _dcp_ckpt(tmp_path)
    drop(ckpt, "trainer_rank0.pt")
    assert find_damage(ckpt) == (
        f"{ckpt / 'trainer_rank0.pt'} is missing (engine.json needs it; manifest.json does not "
        "list it either)"
    )


@pytest.mark.parametrize(("stage", "gone"), [
    (1, "deepspeed/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    (2, "deepspeed/mp_rank_00_model_states.pt"),
    (3, "deepspeed/zero_pp_rank_0_mp_rank_00_model_states.pt"),
])  # fmt: skip
def test_deepspeed_files_of_every_rank_are_required(tmp_path: Path, stage: int, gone: str) -> None:
    ckpt = tmp_path / "step_00000002"
    (ckpt / "deepspeed").mkdir(parents=True)
    meta = {"format": "deepspeed", "world_size": 2, "zero_stage": stage}
    (ckpt / "engine.json").write_text(json.dumps(meta))
    files = [f"trainer_rank{r}.pt" for r in range(2)]
    files += [f"deepspeed/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]
    files += (
        [f"deepspeed/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(2)]
        if stage == 3
        else ["deepspeed/mp_rank_00_model_states.pt"]
    )
    for rel in files:
        (ckpt / rel).write_bytes(b"x")
    assert missing_file(ckpt, set(files)) is None
    present = gone.replace("zero_pp", "bf16_zero_pp") if "optim" in gone else gone
    (ckpt / present).unlink()
    listed = set(files) - {present}
    who = "ZeRO rank 1" if "optim" in gone else "DeepSpeed"
    assert missing_file(ckpt, listed) == (
        f"{ckpt / gone} is missing ({who} needs it; manifest.json does not list it either)"
    )
