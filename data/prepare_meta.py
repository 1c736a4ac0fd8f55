"""The prepared directory's format: meta.json, the token dtype, the fingerprint that decides
whether an existing directory already holds this preparation, and reading it back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.meta_file import META, load_meta
from normlab.data.tokenizer import HF_FILE, SPM_FILE, SPM_OPTIONS, TokenizerInfo

FORMAT_VERSION = 1
TOKENIZER_SAMPLE_CHARS = 10_000_000  # bound on tokenizer training text, keeps training quick
SPLIT_RULE = (
    "documents = .txt chunks of chunk_lines lines, or jsonl/parquet/Hub rows; val = the first "
    "max(1, round(val_fraction * n_docs)) of numpy.random.default_rng(seed).permutation(n_docs); "
    "EOS after each document unless its text continues in the next document of the same split"
)
REQUIRED = ("meta.json", "train.bin", "val.bin")  # + the tokenizer file meta.json names


def data_fingerprint(srcs: list[dict], settings: dict[str, Any]) -> str:
    """sha256 over input contents (not paths) and split settings; the tokenizer is compared
    separately (by file hash, or by training settings when trained here)."""
    keep = ("name", "bytes", "sha256", "format", "dataset", "split")
    payload = {
        "format_version": FORMAT_VERSION,
        "sources": [{k: s[k] for k in keep if k in s} for s in srcs],
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def tokenizer_spec(vocab_size: int, model_type: str) -> dict[str, Any]:
    """Everything that determines a tokenizer trained here (given the same inputs)."""
    return {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "options": SPM_OPTIONS,
        "sample_chars": TOKENIZER_SAMPLE_CHARS,
    }


def read_meta(data_dir: str | Path) -> dict[str, Any]:
    """meta.json of a prepared directory, or DataError saying what is missing."""
    d = Path(data_dir)
    if not d.is_dir():
        raise DataError(f"data directory not found: {d} (run `normlab prepare` first)")
    missing = [f for f in REQUIRED if not (d / f).is_file()]
    if missing:
        raise DataError(
            f"{d} is not a prepared data directory (missing {', '.join(missing)}); "
            "run `normlab prepare --out DIR`"
        )
    meta = load_meta(d / META)
    itemsize = np.dtype(meta["dtype"]).itemsize
    sizes = {s: (d / f"{s}.bin").stat().st_size for s in ("train", "val")}
    bad = [s for s, n in meta["tokens"].items() if sizes[s] != n * itemsize]
    tok_file = meta.get("tokenizer", {}).get("file", SPM_FILE)
    if tok_file not in (SPM_FILE, HF_FILE) or not (d / tok_file).is_file():
        raise DataError(
            f"{d} is not a prepared data directory (missing its tokenizer {tok_file}); "
            "run `normlab prepare --out DIR`"
        )
    if bad:
        raise DataError(f"{d}: {', '.join(bad)}.bin size does not match meta.json; re-run prepare")
    return meta


def same_tokenizer(meta: dict[str, Any], tok: TokenizerInfo) -> bool:
    """The directory's tokenizer is `tok`: the same file, and (hf) the same special tokens."""
    if meta.get("tokenizer", {}).get("sha256") != tok.sha256:
        return False
    return tok.kind == "sentencepiece" or all(
        meta.get(f"{k}_id") == i for k, i in tok.special.items()
    )


def check_out(out: Path) -> bool:
    """True when `out` holds a meta.json (a prepared directory, maybe this one); False when it
    is absent or empty; DataError for anything else (never replaced). A file, a path below a
    file and a read-only parent are refused by the one checked output path (launch.out_path)."""
    from normlab.launch.out_path import OutDirError, check_out_dir

    try:
        check_out_dir(out)
    except OutDirError as exc:
        raise DataError(str(exc)) from None
    if not out.exists():
        return False
    if not (out / META).is_file():
        if any(out.iterdir()):
            raise DataError(
                f"--out {out} exists, is not empty and is not a prepared data "
                "directory; choose another --out"
            )
        return False
    return True


def check_existing(
    out: Path, fingerprint: str, tok: TokenizerInfo | None, spec: dict | None, overwrite: bool
) -> Any:
    """Return the existing meta when `out` already holds this exact preparation; raise when it
    holds something else (unless overwrite); None when `out` is absent or an empty directory."""
    if not check_out(out):
        return None
    try:
        meta = read_meta(out)
    except DataError as e:
        if overwrite:
            return None
        raise DataError(f"{e}; or pass --overwrite to rebuild it") from None
    old_tok = meta.get("tokenizer", {})
    same_tok = same_tokenizer(meta, tok) if tok else old_tok.get("spec") == spec
    if meta.get("fingerprint") == fingerprint and same_tok:
        return meta
    if overwrite:
        return None
    old_sha = str(old_tok.get("sha256"))
    if tok is not None and not same_tok:
        raise DataError(
            f"{out} was prepared with a different tokenizer (sha256 {old_sha[:12]}..., "
            f"given {tok.sha256[:12]}... or other special tokens); token ids would not match. "
            "Use another --out or --overwrite"
        )
    raise DataError(
        f"{out} was prepared from different inputs, split or tokenizer settings; use another "
        "--out or --overwrite"
    )
