"""Data pipeline: bundled corpus (`data.corpus`), tokenizer and `prepare` (`data.prepare`),
packed batch loader (`data.loader.PackedLoader`) and the `prepare` CLI (`data.cli`)."""

from normlab.data.errors import DataError

__all__ = ["DataError"]
