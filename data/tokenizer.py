"""SentencePiece tokenizer training and loading (Kudo & Richardson, 2018, arXiv:1808.06226).

Settings follow the Llama tokenizer (Touvron et al., 2023): identity normalisation, whitespace kept
as is, digits split, byte fallback so any UTF-8 text (newlines included, as `<0x0A>`) round-trips.
Unlike Llama no dummy-prefix space is added, so `decode(encode(text)) == text` exactly and
concatenated documents need no special handling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm
from normlab.data.errors import DataError

# Trainer options recorded in meta.json and in the prepare fingerprint.
SPM_OPTIONS: dict[str, object] = {
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "split_digits": True,
    "allow_whitespace_only_pieces": True,
    "character_coverage": 0.9999,
    "max_sentence_length": 16384,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
}
MODEL_TYPES = ("bpe", "unigram")


def train_tokenizer(
    sentences: Iterable[str], out_path: Path, vocab_size: int, model_type: str, num_threads: int
) -> None:
    """Train on `sentences` (already a bounded, deterministic sample) and write `out_path`."""
    if model_type not in MODEL_TYPES:
        raise DataError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    spm.set_random_generator_seed(0)
    try:
        with open(out_path, "wb") as f:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=f,
                vocab_size=vocab_size,
                model_type=model_type,
                input_sentence_size=0,  # the caller already sampled; use every sentence given
                num_threads=max(1, num_threads),
                minloglevel=2,
                **SPM_OPTIONS,
            )
    except RuntimeError as e:  # e.g. "Vocabulary size too high (4096). Please set it to <= 812."
        raise DataError(f"tokenizer training failed: {e}") from None


def load_tokenizer(path: str | Path) -> spm.SentencePieceProcessor:
    """Load a `.model` file, turning SentencePiece's parse error into a DataError."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"tokenizer file not found: {p}")
    try:
        return spm.SentencePieceProcessor(model_file=str(p))
    except (RuntimeError, OSError) as e:
        raise DataError(f"{p} is not a SentencePiece model: {e}") from None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
