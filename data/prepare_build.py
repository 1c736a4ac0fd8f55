"""The build pipeline of `prepare` inside its temporary directory: load documents, assign the split,
train (or copy) the tokenizer, tokenise in parallel with HF `datasets`, write the token arrays."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.prepare_meta import (
    FORMAT_VERSION,
    SPLIT_RULE,
    TOKENIZER_SAMPLE_CHARS,
    token_dtype,
)
from normlab.data.prepare_split import assign_split, eos_after
from normlab.data.sources import load_documents, load_hub_documents
from normlab.data.tokenizer import file_sha256, load_tokenizer, train_tokenizer
from normlab.data.writer import write_splits

SAMPLE_LINE_CHARS = 4000  # <= 16384 bytes (SPM_OPTIONS max_sentence_length) in any UTF-8


_PROCESSORS: dict[str, Any] = {}


def _encode_batch(batch: dict[str, list], model_path: str) -> dict[str, list]:
    sp = _PROCESSORS.get(model_path)
    if sp is None:  # one load per worker process
        sp = _PROCESSORS[model_path] = load_tokenizer(model_path)
    ids = sp.encode([t or "" for t in batch["text"]])
    return {"ids": ids, "n": [len(x) for x in ids]}


def sample_sentences(docs: Any, is_val: np.ndarray, seed: int) -> list[str]:
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


def build(
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
        sample = sample_sentences(docs, is_val, settings["seed"])
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
