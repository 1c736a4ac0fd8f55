"""Data pipeline: bundled corpus (`data.corpus`), tokenizer and `prepare` (`data.prepare`),
packed windows of a prepared directory (`data.loader`), weighted mixtures of prepared directories
(`data.mixture.MixtureLoader`, what training reads) and the `prepare` CLI (`data.cli`)."""

from normlab.data.errors import DataError

__all__ = ["DataError"]
