"""Export: one checkpoint of any engine -> a folder that HF transformers loads directly, plus
normlab's own files (the work of `normlab export`).

DIR holds the HF model (config.json, model.safetensors, generation_config.json) where the
architecture exists in transformers (model.hf), the run's tokenizer (a SentencePiece
tokenizer.model with HF files converted from it, or the HF tokenizer.json the data was prepared
with, with its special tokens: data.hf_tokenizer), and normlab/ (model.safetensors with normlab's
parameter names, config.yaml, model_config.json). `AutoTokenizer.from_pretrained(DIR)` and
`AutoModelForCausalLM.from_pretrained(DIR)` load it. --no-hf writes the tokenizer file and
normlab/ only (and so needs no transformers).

Runs in one process without a process group: single-engine checkpoints are read directly, FSDP
checkpoints through torch.distributed.checkpoint (any saving world size), DeepSpeed ZeRO
checkpoints through DeepSpeed's own zero_to_fp32 consolidation (the fp32 master weights).
The output is built in a temporary sibling and renamed into place only when complete, so a failed
export leaves nothing, and with --overwrite the previous export survives until then.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import yaml
from normlab.data.errors import DataError
from normlab.data.tokenizer import TokenizerInfo
from normlab.launch.config import RunConfig, load_config
from normlab.launch.config.paths import saved_form
from normlab.launch.engines.fsdp import read_meta
from normlab.launch.errors import CheckpointError, ConfigError, RunDirError
from normlab.launch.extras import require
from normlab.launch.rundir.consolidate import find_checkpoint, read_weights
from normlab.launch.rundir.manifest import find_damage
from normlab.model import Transformer

NATIVE_DIR, WEIGHTS, CONFIG, MODEL_CONFIG = (
    "normlab",
    "model.safetensors",
    "config.yaml",
    "model_config.json",
)
SPM_FILE = "tokenizer.model"


def save_safetensors(model: Transformer, path: Path) -> None:
    """Every state_dict entry as its own tensor (a tied head is stored as a copy)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format": "pt", "model_config": json.dumps(model.config.to_dict())}
    save_file(tensors, str(path), metadata=meta)


def check_hf_family(cfg: RunConfig) -> str:
    """The HF family the run's model maps to; a model no transformers architecture matches is
    refused before anything is written, pointing at --no-hf for normlab's own files alone."""
    from normlab.model.hf import hf_family

    try:
        return hf_family(cfg.model_config())
    except ValueError as exc:
        raise RunDirError(f"{exc}; export with --no-hf for normlab's own files") from None


def save_hf(model: Transformer, out: Path, token_ids: dict[str, int | None] | None = None) -> str:
    """Write the HF model into `out` (its family checked by check_hf_family); return a line."""
    from normlab.model.hf import hf_family, to_hf

    family = hf_family(model.config)
    to_hf(model, token_ids).save_pretrained(str(out))
    return f"HF {family} model -> {out}"


def resolve_run_dir(name: str) -> Path:
    """A run directory as given, else runs/NAME (where `normlab train NAME` puts it)."""
    path = Path(name).expanduser()
    for candidate in (path, Path("runs") / name):
        if (candidate / CONFIG).is_file():
            return candidate
    if path.is_dir() or len(path.parts) > 1:
        raise RunDirError(f"{path} is not a normlab run directory (no {CONFIG})")
    raise RunDirError(f"no run directory {name!r} (nor runs/{name}) holding {CONFIG}")


def check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    """Refuse an existing --out unless --overwrite, and even then anything but a normlab export
    (an empty folder or one holding normlab/model_config.json): nothing else is replaced."""
    target, run = out.resolve(), run_dir.resolve()
    if target == run or target in run.parents:
        raise RunDirError(f"--out {out} would replace the run directory {run_dir}")
    ckpts = run / "checkpoints"
    if target == ckpts or ckpts in target.parents:
        raise RunDirError(
            f"--out {out} lies in the run's own {ckpts}, which the next checkpoint prunes or "
            "replaces; export elsewhere"
        )
    if not out.exists() and not out.is_symlink():
        from normlab.launch.out_path import check_out_dir

        check_out_dir(out)  # the one checked path: below a file, read-only: one line
        return
    if not overwrite:
        raise RunDirError(f"--out {out} already exists; choose a new directory or --overwrite")
    if not out.is_dir() or out.is_symlink():
        raise RunDirError(f"--out {out} exists and is not a directory; not replacing it")
    marks = (out / NATIVE_DIR / MODEL_CONFIG, out / MODEL_CONFIG)
    if any(out.iterdir()) and not any(m.is_file() for m in marks):
        raise RunDirError(
            f"--out {out} is not a normlab export (no {NATIVE_DIR}/{MODEL_CONFIG}); "
            "--overwrite only replaces an earlier export"
        )


def run_tokenizer(cfg: RunConfig, given: str | None) -> TokenizerInfo:
    """The tokenizer the run trained on (the one its data.dataset stores, with the special ids
    its meta.json records), or --tokenizer (any kind prepare accepts), checked against the size
    the run trained with."""
    from normlab.data.tokenizer_select import resolve_tokenizer

    if given:
        if not Path(given).expanduser().exists():
            raise RunDirError(f"the tokenizer {given} is missing; pass --tokenizer PATH")
        info = resolve_tokenizer(given)
    else:
        info = dataset_tokenizer(cfg)
    if info.vocab_size != cfg.data.vocab_size:
        raise RunDirError(
            f"{info.path} has {info.vocab_size} tokens but the run trained on a "
            f"{cfg.data.vocab_size}-token tokenizer (data.vocab_size); pass --tokenizer with "
            "the run's tokenizer"
        )
    return info


def dataset_tokenizer(cfg: RunConfig) -> TokenizerInfo:
    from normlab.data.prepare_meta import read_meta
    from normlab.data.tokenizer import SPECIALS
    from normlab.data.tokenizer_select import resolve_tokenizer

    if cfg.data.dataset == "bundled":
        from normlab.launch.training.datasets import (
            resolve_dataset,  # prepares it if the cache is gone
        )

        folder = resolve_dataset(cfg.data, quiet=True)
    else:
        folder = Path(cfg.data.dataset).expanduser()
    try:
        meta = read_meta(folder)
    except DataError as exc:
        raise RunDirError(
            f"the run's data.dataset {folder} cannot give its tokenizer ({exc}); pass "
            "--tokenizer PATH (the tokenizer it was prepared with)"
        ) from None
    path = folder / meta.get("tokenizer", {}).get("file", SPM_FILE)
    info = resolve_tokenizer(path)
    if info.kind == "hf":  # the special tokens prepare was told, not only the guessed ones
        special = {k: meta.get(f"{k}_id") for k in SPECIALS}
        info = dataclasses.replace(info, special=special)
    return info


def write_export(
    model: Transformer, cfg: RunConfig, tok: TokenizerInfo, tmp: Path, hf: bool
) -> list[str]:
    """Everything of the export into the empty folder `tmp`; return report lines."""
    native = tmp / NATIVE_DIR
    native.mkdir()
    save_safetensors(model, native / WEIGHTS)
    (native / CONFIG).write_text(yaml.safe_dump(saved_form(cfg), sort_keys=False))
    (native / MODEL_CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    if not hf:
        tok.write(tmp)
        (native / "special_tokens.json").write_text(json.dumps(tok.special, indent=2) + "\n")
        return [f"tokenizer {tok.file_name} ({tok.kind} only: --no-hf)"]
    from normlab.data.hf_tokenizer import save_hf_json_tokenizer, save_hf_tokenizer

    if tok.kind == "sentencepiece":
        token_ids = save_hf_tokenizer(tok.path, tmp, model.config.max_seq_len)
        what = "SentencePiece + HF files"
    else:
        token_ids = save_hf_json_tokenizer(tok, tmp, model.config.max_seq_len)
        what = "HF tokenizer files"
    return [f"tokenizer {tok.path} ({what})", save_hf(model, tmp, token_ids)]


def publish(tmp: Path, out: Path) -> None:
    """Move the complete export `tmp` to `out`; an earlier export there is removed only after."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old / out.name, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def export(
    run_dir: Path,
    out: Path,
    step: int | None = None,
    hf: bool = True,
    overwrite: bool = False,
    tokenizer: str | None = None,
    allow_unverified: bool = False,
) -> list[str]:
    """Export one checkpoint of `run_dir` into `out`; return report lines. Every check (output
    folder, optional packages, checkpoint, tokenizer) runs before anything is written."""
    if not (run_dir / CONFIG).is_file():
        raise RunDirError(f"{run_dir} is not a normlab run directory (no {CONFIG})")
    check_out(out, run_dir, overwrite)
    if hf:
        require("transformers", "normlab export (its HF format; --no-hf writes the native only)")
    cfg: RunConfig = load_config(run_dir / CONFIG, [f"run_dir={run_dir}"])
    if hf:
        refuse_hf(cfg)
    ckpt = find_checkpoint(run_dir, step)
    engine = read_meta(ckpt).get("engine", "single")
    if read_meta(ckpt).get("format") == "deepspeed":
        require("deepspeed", f"exporting the DeepSpeed checkpoint {ckpt}")
    tok = run_tokenizer(cfg, tokenizer)
    damage = find_damage(ckpt, allow_unverified)
    if damage is not None:
        raise CheckpointError(f"checkpoint {ckpt.name} is damaged: {damage}; export another --step")
    if hf:
        check_hf_family(cfg)
    model = Transformer(cfg.model_config())
    model.load_state_dict(read_weights(ckpt, model))
    tmp = temp_dir(out)
    try:
        lines = [f"{ckpt.name} ({engine}) -> {out / NATIVE_DIR / WEIGHTS}"]
        written = write_export(model, cfg, tok, tmp, hf)
        lines += [line.replace(str(tmp), str(out)) for line in written]
        publish(tmp, out)
    except Exception as exc:  # OSError, or safetensors' own error wrapping one (os error N)
        shutil.rmtree(tmp, ignore_errors=True)
        exc = as_os_error(exc)
        where = exc.filename or out
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RunDirError(f"no space left on device while writing {where}") from None
        raise RunDirError(f"cannot write {where}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return lines


def as_os_error(exc: Exception) -> OSError:
    """`exc` as the OSError it is or wraps: safetensors (and transformers' save_pretrained through
    it) reports a failed write as `SafetensorError('... I/O error: ... (os error 28)')`; anything
    else is raised again as it is."""
    if isinstance(exc, OSError):
        return exc
    found = (
        re.search(r"\(os error (\d+)\)", str(exc)) if "Safetensor" in type(exc).__name__ else None
    )
    if found is None:
        raise exc
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


def refuse_hf(cfg: RunConfig) -> None:
    """DyT/Derf, HybridNorm and Keel have no HF family and no exact rewrite into one: asked for
    the HF format, export refuses them (one line) before writing anything."""
    from normlab.model.hf_fold import unexportable

    reason = unexportable(cfg.model_config())
    if reason is not None:
        raise ConfigError(f"{reason}; --no-hf exports the native format only")


def temp_dir(out: Path) -> Path:
    """An empty folder beside `out` (same filesystem, so publishing it is a rename)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise RunDirError(f"cannot create --out {out}: {exc.strerror or exc}") from None
