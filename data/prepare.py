"""Prepare a corpus for pretraining: train (or reuse) a SentencePiece tokenizer, tokenise in
parallel with HF `datasets`, and write flat token arrays `train.bin`/`val.bin` (EOS between
documents) plus `meta.json`, in the layout of nanoGPT's `prepare.py` (memory-mapped numpy arrays).

The output directory is built in a temporary sibling and renamed into place, so a failed run never
leaves a half-written directory nor damages an existing one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.sources import describe_sources, load_documents, load_hub_documents
from normlab.data.tokenizer import (
    MODEL_TYPES,
    SPM_OPTIONS,
    file_sha256,
    load_tokenizer,
    train_tokenizer,
)
from normlab.data.writer import write_splits

FORMAT_VERSION = 1
CHUNK_LINES = 128  # lines per document for .txt inputs (the split unit)
SAMPLE_LINE_CHARS = 4000  # <= 16384 bytes (SPM_OPTIONS max_sentence_length) in any UTF-8
TOKENIZER_SAMPLE_CHARS = 10_000_000  # bound on tokenizer training text, keeps training quick
META = "meta.json"
SPLIT_RULE = (
    "documents = .txt chunks of chunk_lines lines, or jsonl/parquet/Hub rows; val = the first "
    "max(1, round(val_fraction * n_docs)) of numpy.random.default_rng(seed).permutation(n_docs); "
    "EOS after each document unless its text continues in the next document of the same split"
)
REQUIRED = ("meta.json", "train.bin", "val.bin", "tokenizer.model")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id in [0, vocab_size) fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def assign_split(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean `is_val` per document: the first round(val_fraction * n_docs) documents (at least
    one, at most n_docs - 1, when val_fraction > 0) of `default_rng(seed).permutation(n_docs)`."""
    is_val = np.zeros(n_docs, dtype=bool)
    if val_fraction <= 0 or n_docs < 2:
        return is_val
    n_val = min(max(1, round(val_fraction * n_docs)), n_docs - 1)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


def eos_after(contig: np.ndarray, is_val: np.ndarray) -> np.ndarray:
    """EOS follows a row unless its text continues in the next row and that row is in the same
    split, so each split's stream is continuous text with EOS at every real discontinuity."""
    same_next = np.zeros_like(contig)
    same_next[:-1] = is_val[:-1] == is_val[1:]
    return ~(contig & same_next)


_PROCESSORS: dict[str, Any] = {}


def _encode_batch(batch: dict[str, list], model_path: str) -> dict[str, list]:
    sp = _PROCESSORS.get(model_path)
    if sp is None:  # one load per worker process
        sp = _PROCESSORS[model_path] = load_tokenizer(model_path)
    ids = sp.encode([t or "" for t in batch["text"]])
    return {"ids": ids, "n": [len(x) for x in ids]}


def _sample_sentences(docs: Any, is_val: np.ndarray, seed: int) -> list[str]:
    """Lines of train documents in a seeded order, up to TOKENIZER_SAMPLE_CHARS characters."""
    order = np.random.default_rng(seed).permutation(np.flatnonzero(~is_val))
    out, total = [], 0
    for start in range(0, len(order), 1024):
        for text in docs.select(order[start : start + 1024])["text"]:
            for line in (text or "").splitlines():
                # SentencePiece drops sentences over max_sentence_length bytes: cut long lines
                for start in range(0, len(line), SAMPLE_LINE_CHARS):
                    piece = line[start : start + SAMPLE_LINE_CHARS]
                    if piece.strip():
                        out.append(piece)
                        total += len(piece)
            if total >= TOKENIZER_SAMPLE_CHARS:
                return out
    return out


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
    try:
        meta = json.loads((d / META).read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        sizes = {s: (d / f"{s}.bin").stat().st_size for s in ("train", "val")}
        bad = [s for s, n in meta["tokens"].items() if sizes[s] != n * itemsize]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(f"{d / META} is corrupt: {e!r}") from None
    if bad:
        raise DataError(f"{d}: {', '.join(bad)}.bin size does not match meta.json; re-run prepare")
    return meta


def _check_existing(
    out: Path, fingerprint: str, tok_sha: str | None, spec: dict | None, overwrite: bool
) -> Any:
    """Return the existing meta when `out` already holds this exact preparation; raise when it
    holds something else (unless overwrite); None when `out` is absent or an empty directory."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory")
    if not (out / META).is_file():
        if any(out.iterdir()):
            raise DataError(
                f"--out {out} exists, is not empty and is not a prepared data "
                "directory; choose another --out"
            )
        return None
    try:
        meta = read_meta(out)
    except DataError as e:
        if overwrite:
            return None
        raise DataError(f"{e}; or pass --overwrite to rebuild it") from None
    old_tok = meta.get("tokenizer", {})
    same_tok = old_tok.get("sha256") == tok_sha if tok_sha else old_tok.get("spec") == spec
    if meta.get("fingerprint") == fingerprint and same_tok:
        return meta
    if overwrite:
        return None
    old_sha = str(old_tok.get("sha256"))
    if tok_sha is not None and old_sha != tok_sha:
        raise DataError(
            f"{out} was prepared with a different tokenizer (sha256 {old_sha[:12]}..., "
            f"given {tok_sha[:12]}...); token ids would not match. Use another --out "
            "or --overwrite"
        )
    raise DataError(
        f"{out} was prepared from different inputs, split or tokenizer settings; use another "
        "--out or --overwrite"
    )


def _finalize(tmp: Path, out: Path) -> None:
    """Move the finished temp dir into place; an existing `out` is swapped out, then removed."""
    shutil.rmtree(tmp / ".cache", ignore_errors=True)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _validate(
    inputs: list[str] | None, dataset_name: str | None, tokenizer: str | None, vocab_size: int,
    model_type: str, val_fraction: float, chunk_lines: int,
) -> None:  # fmt: skip
    if inputs and dataset_name:
        raise DataError("give either input files or --dataset, not both")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if tokenizer is None and model_type not in MODEL_TYPES:
        raise DataError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if tokenizer is None and vocab_size < 300:
        raise DataError(f"vocab_size must be >= 300 (256 byte pieces + specials), got {vocab_size}")
    if chunk_lines < 1:
        raise DataError(f"chunk_lines must be >= 1, got {chunk_lines}")
    if tokenizer:
        load_tokenizer(tokenizer)  # fail early on a missing or invalid file


def _resolve_sources(
    inputs: list[str] | None, dataset_name: str | None, dataset_split: str, skip: bool = False
) -> list[dict[str, Any]]:
    if dataset_name:
        return [{"dataset": dataset_name, "split": dataset_split}]
    if not inputs:
        from normlab.data.corpus import bundled_corpus_path

        inputs = [str(bundled_corpus_path())]
    return describe_sources(inputs, skip)


def prepare(
    inputs: list[str] | None,
    out_dir: str | Path,
    *,
    vocab_size: int = 4096,
    model_type: str = "bpe",
    tokenizer: str | None = None,
    val_fraction: float = 0.005,
    text_field: str = "text",
    num_proc: int = 2,
    seed: int = 0,
    dataset_name: str | None = None,
    dataset_split: str = "train",
    chunk_lines: int = CHUNK_LINES,
    overwrite: bool = False,
    skip_undecodable: bool = False,
) -> dict[str, Any]:
    """Tokenise `inputs` (local .txt/.jsonl/.json/.parquet; None: the bundled corpus) or the Hub
    dataset `dataset_name` into `out_dir`; returns meta.json's content. Idempotent: a directory
    already prepared from the same inputs, split settings and tokenizer is reused untouched."""
    _validate(inputs, dataset_name, tokenizer, vocab_size, model_type, val_fraction, chunk_lines)
    srcs = _resolve_sources(inputs, dataset_name, dataset_split, skip_undecodable)
    skipped = sum(s.get("skipped_lines", 0) for s in srcs)
    if skipped:
        print(f"skipping {skipped:,} undecodable (not UTF-8) lines", file=sys.stderr)
    tok_sha = file_sha256(tokenizer) if tokenizer else None
    spec = None if tok_sha else tokenizer_spec(vocab_size, model_type)
    settings = {
        "val_fraction": val_fraction,
        "seed": seed,
        "text_field": text_field,
        "chunk_lines": chunk_lines,
    }
    fingerprint = data_fingerprint(srcs, settings)
    out = Path(out_dir).expanduser().resolve()
    existing = _check_existing(out, fingerprint, tok_sha, spec, overwrite)
    if existing is not None:
        print(f"reusing {out}: already prepared with the same inputs and tokenizer")
        return existing
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise DataError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    try:
        meta = _build(srcs, tmp, tokenizer, spec, settings, num_proc)
        meta["fingerprint"] = fingerprint
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        _finalize(tmp, out)
    except OSError as exc:  # a full disk or a file that vanished: one line, nothing left behind
        shutil.rmtree(tmp, ignore_errors=True)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "no space left on device while writing" if full else exc.strerror or "error on"
        raise DataError(f"{what} {exc.filename or tmp}; {out} is unchanged") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n = meta["tokens"]
    print(
        f"prepared {out}: {n['train']:,} train + {n['val']:,} val tokens, vocab "
        f"{meta['vocab_size']} ({meta['dtype']}) in {meta['timings_s']['total']} s"
    )
    _warn_small_val(n, val_fraction)
    print(f"train on it: normlab train pre data.dataset={shlex.quote(str(out))}")
    return meta


def _warn_small_val(tokens: dict[str, int], asked: float) -> None:
    """The split is by document: few documents give a smaller (or no) validation split."""
    total = tokens["train"] + tokens["val"]
    got = tokens["val"] / total if total else 0.0
    if tokens["val"] == 0:
        print(
            "warning: the validation split is empty; `normlab train` evaluates on it, so "
            "prepare with --val-fraction > 0 to train on this directory",
            file=sys.stderr,
        )
    elif asked > 0 and got < 0.5 * asked:
        print(
            f"warning: the validation split holds {tokens['val']:,} tokens ({got:.2%}), less than "
            f"the {asked:.2%} asked: the split is by document (a .txt chunk of --chunk-lines "
            "lines); give more documents or a larger --val-fraction",
            file=sys.stderr,
        )


def _load(srcs: list[dict[str, Any]], cache: Path, settings: dict[str, Any]) -> Any:
    if "dataset" in srcs[0]:
        src = srcs[0]
        docs = load_hub_documents(src["dataset"], src["split"], cache, settings["text_field"])
    else:
        docs = load_documents(srcs, cache, settings["text_field"], settings["chunk_lines"])
    if len(docs) == 0:
        raise DataError("the inputs contain no documents")
    return docs


def _tokenize(docs: Any, model_path: Path, cache: Path, num_proc: int) -> Any:
    """Parallel `Dataset.map` (datasets draws the progress bar); ids stored as int32."""
    from datasets import Features, List, Value

    return docs.map(
        _encode_batch,
        batched=True,
        batch_size=64,
        num_proc=num_proc if num_proc > 1 else None,
        fn_kwargs={"model_path": str(model_path)},
        remove_columns=docs.column_names,
        cache_file_name=str(cache / "tokenized.arrow"),
        features=Features({"ids": List(Value("int32")), "n": Value("int64")}),
        desc="tokenizing",
    )


def _build(
    srcs: list[dict[str, Any]],
    tmp: Path,
    tokenizer: str | None,
    spec: dict[str, Any] | None,
    settings: dict[str, Any],
    num_proc: int,
) -> dict[str, Any]:
    t = [time.perf_counter()]
    cache = tmp / ".cache"
    docs = _load(srcs, cache, settings)
    is_val = assign_split(len(docs), settings["val_fraction"], settings["seed"])
    eos = eos_after(np.asarray(docs.with_format("numpy")["contig"], dtype=bool), is_val)
    t.append(time.perf_counter())
    model_path = tmp / "tokenizer.model"
    if tokenizer:
        shutil.copyfile(tokenizer, model_path)
    else:
        assert spec is not None
        sample = _sample_sentences(docs, is_val, settings["seed"])
        if not sample:
            raise DataError("the training split contains no text to train a tokenizer on")
        train_tokenizer(sample, model_path, spec["vocab_size"], spec["model_type"], num_proc)
    sp = load_tokenizer(model_path)
    t.append(time.perf_counter())
    tok = _tokenize(docs, model_path, cache, num_proc)
    t.append(time.perf_counter())
    dtype = token_dtype(sp.vocab_size())
    counts = write_splits(tok, is_val, eos, tmp, dtype, sp.eos_id())
    t.append(time.perf_counter())
    stages = ("load", "tokenizer", "tokenize", "write")
    timings = {k: round(b - a, 2) for k, a, b in zip(stages, t[:-1], t[1:], strict=True)}
    return {
        "format_version": FORMAT_VERSION,
        "vocab_size": sp.vocab_size(),
        "dtype": dtype.name,
        "tokens": counts,
        "documents": {"train": int((~is_val).sum()), "val": int(is_val.sum())},
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "unk_id": sp.unk_id(),
        "pad_id": sp.pad_id(),
        "tokenizer": {
            "file": "tokenizer.model",
            "sha256": file_sha256(model_path),
            "source": str(Path(tokenizer).resolve()) if tokenizer else "trained",
            "spec": spec,
        },
        "split_rule": SPLIT_RULE,
        "settings": settings,
        "sources": srcs,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "timings_s": timings | {"total": round(t[-1] - t[0], 2)},
    }
