"""Tokenizers of a prepared directory: a SentencePiece model trained here (Kudo & Richardson, 2018,
arXiv:1808.06226) or given, or a Hugging Face `tokenizers` tokenizer (a tokenizer.json, or a folder
that transformers.AutoTokenizer loads, read by data.hf_tokenizer; data.tokenizer_select picks
the kind). `TokenizerInfo` is what
prepare and export need of either kind: the file, its vocabulary size and its special-token ids.

Settings follow the Llama tokenizer (Touvron et al., 2023): identity normalisation, whitespace kept
as is, digits split, byte fallback so any UTF-8 text (newlines included, as `<0x0A>`) round-trips.
Unlike Llama no dummy-prefix space is added, so `decode(encode(text)) == text` exactly and
concatenated documents need no special handling.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
SPM_FILE, HF_FILE = "tokenizer.model", "tokenizer.json"
SPECIALS = ("bos", "eos", "pad", "unk")
Kind = Literal["sentencepiece", "hf"]


@dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer file of either kind and what the data and the model take from it."""

    kind: Kind
    path: Path  # tokenizer.model (sentencepiece) or tokenizer.json (hf)
    vocab_size: int  # ids are in [0, vocab_size)
    special: dict[str, int | None]  # bos/eos/pad/unk ids (None: the tokenizer has none)
    sha256: str  # of the file as a prepared directory stores it
    content: bytes | None = None  # hf: the tokenizer.json to store (a folder's is serialised)

    @property
    def file_name(self) -> str:
        return SPM_FILE if self.kind == "sentencepiece" else HF_FILE

    def write(self, folder: Path) -> Path:
        """Store the tokenizer file in `folder`; return its path."""
        dest = folder / self.file_name
        if self.content is None:
            shutil.copyfile(self.path, dest)
        else:
            dest.write_bytes(self.content)
        return dest


def spm_info(path: str | Path) -> TokenizerInfo:
    """TokenizerInfo of a SentencePiece model; its special ids are the model's own."""
    from normlab.data.tokenizer_checks import check_end_token

    sp = load_tokenizer(path)
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(), "unk": sp.unk_id()}
    special = {k: (i if 0 <= i < sp.vocab_size() else None) for k, i in ids.items()}
    hint = f"(its eos_id is {sp.eos_id()}): train it with an eos piece, or give a tokenizer.json"
    check_end_token(special, Path(path), hint)
    return TokenizerInfo("sentencepiece", Path(path), sp.vocab_size(), special, file_sha256(path))


def encoder(kind: Kind, path: str | Path) -> Callable[[list[str]], list[list[int]]]:
    """A function texts -> ids on one thread: the tokenizer's own batch encode without its
    special tokens (prepare puts EOS after each document itself)."""
    if kind == "sentencepiece":
        sp = load_tokenizer(path)
        return lambda texts: sp.encode(texts, num_threads=1)
    # one thread per process: --num-proc decides the parallelism (read at every call)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda texts: [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


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
