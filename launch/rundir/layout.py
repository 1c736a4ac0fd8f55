"""The files a sharded checkpoint needs, checked against the disk before it is loaded.

manifest.json catches a file that was listed and is now missing, truncated or changed; it cannot
catch a file missing from both the disk and the manifest (a shard lost before the manifest was
written, or a manifest rewritten after the loss). The engines' own indexes name what they will
read, so that file is named here instead of surfacing as a FileNotFoundError on one rank (DCP)
or a tensor-shape RuntimeError (DeepSpeed):

- FSDP2 (`dcp/`): DCP's `.metadata` lists every storage file with the byte ranges it reads;
  each must exist, reach its last byte, and be in the manifest when there is one;
- DeepSpeed (`deepspeed/`): engine.json gives the world size and ZeRO stage; every data-parallel
  rank's optimizer partition (`[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`) and the model
  states (`mp_rank_00_model_states.pt`, ZeRO-3: one `zero_pp_rank_R_mp_rank_00_model_states.pt`
  per rank) must exist;
- both: each rank's trainer state (`trainer_rank{R}.pt`), which holds the loader position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.launch.json_file import BadJSON, read_json

DCP_DIR, DS_DIR, ENGINE_FILE = "dcp", "deepspeed", "engine.json"


def missing_file(ckpt_dir: Path, listed: set[str] | None) -> str | None:
    """'<file> is missing (...)' for the first file the checkpoint's engine needs and does not
    find, None when every one is there. `listed`: the manifest's relative paths (None: none)."""
    meta = _engine_meta(ckpt_dir)
    if isinstance(meta, str):
        return meta
    if meta is None:
        return None  # the single-process engine's files are all in the manifest
    world = meta.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool) and world > 0:
        for rank in range(world):
            found = _absent(ckpt_dir, f"trainer_rank{rank}.pt", listed, ENGINE_FILE)
            if found:
                return found
    if meta.get("format") == "dcp":
        return _dcp_missing(ckpt_dir, listed)
    if meta.get("format") == "deepspeed" and isinstance(world, int):
        return _deepspeed_missing(ckpt_dir, world, meta.get("zero_stage"), listed)
    return None


def _engine_meta(ckpt_dir: Path) -> dict[str, Any] | str | None:
    path = ckpt_dir / ENGINE_FILE
    if not path.is_file():
        return None
    try:
        meta = read_json(path, "engine metadata")  # the one JSON reader
    except BadJSON as exc:
        return str(exc)
    return meta if isinstance(meta, dict) else f"{path} is not a JSON object"


def _absent(ckpt_dir: Path, rel: str, listed: set[str] | None, index: str) -> str | None:
    if (ckpt_dir / rel).is_file():
        return None
    unlisted = listed is not None and rel not in listed
    either = "; manifest.json does not list it either" if unlisted else ""
    return f"{ckpt_dir / rel} is missing ({index} needs it{either})"


def _dcp_missing(ckpt_dir: Path, listed: set[str] | None) -> str | None:
    d = ckpt_dir / DCP_DIR
    index = d / ".metadata"
    if not index.is_file():
        return _absent(ckpt_dir, f"{DCP_DIR}/.metadata", listed, "a DCP checkpoint")
    try:
        from torch.distributed.checkpoint import FileSystemReader

        storage = FileSystemReader(str(d)).read_metadata().storage_data
        ends: dict[str, int] = {}
        for info in storage.values():
            rel = str(info.relative_path)
            ends[rel] = max(ends.get(rel, 0), int(info.offset) + int(info.length))
    except Exception as exc:  # a damaged pickle raises anything  # noqa: BLE001
        return f"{index} is unreadable ({type(exc).__name__}: {exc})"
    for rel, end in sorted(ends.items()):
        path = d / rel
        found = _absent(ckpt_dir, f"{DCP_DIR}/{rel}", listed, "DCP's .metadata")
        if found:
            return found
        size = path.stat().st_size
        if size < end:
            return f"{path} is truncated ({size} bytes; DCP's .metadata reads up to byte {end})"
        if listed is not None and f"{DCP_DIR}/{rel}" not in listed:
            return f"{path} is not listed in manifest.json, so it cannot be verified"
    return None


def _deepspeed_missing(
    ckpt_dir: Path, world: int, stage: Any, listed: set[str] | None
) -> str | None:
    d = ckpt_dir / DS_DIR
    for rank in range(world):
        optim = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        if not (d / optim).is_file() and not (d / f"bf16_{optim}").is_file():
            return _absent(ckpt_dir, f"{DS_DIR}/{optim}", listed, f"ZeRO rank {rank}")
    models = (
        [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
        if stage == 3
        else ["mp_rank_00_model_states.pt"]
    )
    for rel in models:
        found = _absent(ckpt_dir, f"{DS_DIR}/{rel}", listed, "DeepSpeed")
        if found:
            return found
    return None
