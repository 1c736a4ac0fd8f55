"""The build pipeline of `prepare` inside its temporary directory, streaming: the inputs were
scanned once (prepare_inputs.scan_source: document count and sizes); the split is assigned from
the count, a SentencePiece tokenizer is trained on a bounded sample of train documents (or the
given tokenizer is stored), and the documents are read again, tokenised in parallel and appended
to train.bin/val.bin (prepare_encode)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from normlab.data.errors import DataError
from normlab.data.meta_file import token_dtype
from normlab.data.prepare_encode import batches, encode_all
from normlab.data.prepare_inputs import iter_documents
from normlab.data.prepare_meta import FORMAT_VERSION, SPLIT_RULE, TOKENIZER_SAMPLE_CHARS
from normlab.data.prepare_split import assign_split, eos_after
from normlab.data.tokenizer import TokenizerInfo, spm_info, train_tokenizer
from normlab.data.writer import SplitWriter

SAMPLE_LINE_CHARS = 4000  # <= 16384 bytes (SPM_OPTIONS max_sentence_length) in any UTF-8


def sample_sentences(
    srcs: list[dict[str, Any]], settings: dict[str, Any], is_val: np.ndarray, sizes: np.ndarray
) -> list[str]:
    """Lines of the train documents that come first in `default_rng(seed).permutation`, up to
    TOKENIZER_SAMPLE_CHARS bytes, in that order (one streaming pass collects them)."""
    order = np.random.default_rng(settings["seed"]).permutation(np.flatnonzero(~is_val))
    take = order[: int(np.searchsorted(np.cumsum(sizes[order]), TOKENIZER_SAMPLE_CHARS)) + 1]
    rank = {int(d): r for r, d in enumerate(take)}
    picked: list[tuple[int, str]] = []
    for i, (text, _) in enumerate(iter_documents(srcs, settings)):
        if i in rank:
            picked.append((rank[i], text))
    out = []
    for _, text in sorted(picked):
        for line in text.splitlines():
            # SentencePiece drops sentences over max_sentence_length bytes: cut long lines
            for start in range(0, len(line), SAMPLE_LINE_CHARS):
                piece = line[start : start + SAMPLE_LINE_CHARS]
                if piece.strip():
                    out.append(piece)
    return out


def split_documents(
    srcs: list[dict[str, Any]], settings: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(is_val, eos) per document; a text file's chunks continue into each other."""
    contig = []
    for src in srcs:
        n = src["documents"]
        part = np.full(n, src.get("format") == "text", dtype=bool)
        part[-1:] = False
        contig.append(part)
    is_val = assign_split(sum(len(c) for c in contig), settings["val_fraction"], settings["seed"])
    return is_val, eos_after(np.concatenate(contig), is_val)


def build(
    srcs: list[dict[str, Any]],
    sizes: np.ndarray,
    tmp: Path,
    given: TokenizerInfo | None,
    spec: dict[str, Any] | None,
    settings: dict[str, Any],
    num_proc: int,
    batch_mb: float,
) -> dict[str, Any]:
    t = [time.perf_counter()]
    is_val, eos = split_documents(srcs, settings)
    t.append(time.perf_counter())
    if given is not None:
        tok = given
        given.write(tmp)
    else:
        assert spec is not None
        sample = sample_sentences(srcs, settings, is_val, sizes)
        if not sample:
            raise DataError("the training split contains no text to train a tokenizer on")
        path = tmp / "tokenizer.model"
        train_tokenizer(sample, path, spec["vocab_size"], spec["model_type"], num_proc)
        tok = spm_info(path)
    t.append(time.perf_counter())
    dtype = token_dtype(tok.vocab_size)
    writer = SplitWriter(tmp, dtype)
    try:
        work = batches(iter_documents(srcs, settings), is_val, eos, sizes, int(batch_mb * 2**20))
        init = (tok.kind, str(tmp / tok.file_name), int(tok.special["eos"]), dtype.name)
        encode_all(work, writer, init, num_proc, int(sizes.sum()))
    finally:
        counts = writer.close()
    t.append(time.perf_counter())
    stages = ("split", "tokenizer", "tokenize")
    timings = {k: round(b - a, 2) for k, a, b in zip(stages, t[:-1], t[1:], strict=True)}
    return {
        "format_version": FORMAT_VERSION,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "tokens": counts,
        "documents": {"train": int((~is_val).sum()), "val": int(is_val.sum())},
        **{f"{k}_id": i for k, i in tok.special.items()},
        "tokenizer": {
            "file": tok.file_name,
            "kind": tok.kind,
            "sha256": tok.sha256,
            "source": str(Path(given.path).resolve()) if given else "trained",
            "spec": spec,
        },
        "split_rule": SPLIT_RULE,
        "settings": settings,
        "sources": srcs,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "timings_s": timings | {"total": round(t[-1] - t[0], 2)},
    }
