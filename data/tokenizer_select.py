"""`prepare --tokenizer PATH`: which kind of tokenizer a path holds (a SentencePiece model, a HF
tokenizer.json, or a transformers tokenizer folder) and its TokenizerInfo."""

from __future__ import annotations

from pathlib import Path

from normlab.data.errors import DataError
from normlab.data.hf_tokenizer import hf_info
from normlab.data.tokenizer import TokenizerInfo, spm_info


def resolve_tokenizer(path: str | Path, names: dict[str, str] | None = None) -> TokenizerInfo:
    """Any tokenizer `prepare --tokenizer` accepts: a SentencePiece model, a tokenizer.json or a
    transformers tokenizer folder. names: bos/eos/pad token strings that override (hf only)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"tokenizer not found: {p}")
    if p.is_dir() or p.suffix.lower() == ".json":
        return hf_info(p, names or {})
    if any(names.values() if names else ()):
        raise DataError("--bos-token/--eos-token/--pad-token apply to HF tokenizers only")
    return spm_info(p)
