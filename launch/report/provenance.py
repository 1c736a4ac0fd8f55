"""What a run trained on, for telling whether runs are comparable: the data (its sources and
split for a prepared directory, the corpus and split for the bundled one) and the tokenizer (the
sha256 of a prepared directory's tokenizer file, else kind and size), read from the run's config
and the prepared directory's meta.json."""

from __future__ import annotations

from typing import Any


def _meta(dataset: str) -> dict[str, Any]:
    from normlab.data.errors import DataError
    from normlab.data.meta_file import meta_of

    try:
        return meta_of(dataset) or {}  # moved or deleted since: the config's values are all
    except DataError:  # damaged since: the same (comparing runs needs no data file)
        return {}


def tokenizer_id(config: dict[str, Any]) -> str:
    """'bpe/4096' or, for a prepared directory, its tokenizer file's kind, size and sha256."""
    data = config.get("data") or {}
    kind, size = data.get("tokenizer", "bpe"), data.get("vocab_size")
    tok = _meta(str(data.get("dataset", "bundled"))).get("tokenizer")
    if isinstance(tok, dict) and isinstance(tok.get("sha256"), str):
        spec = tok.get("spec") if isinstance(tok.get("spec"), dict) else {}
        kind = spec.get("model_type", tok.get("source", kind))
        return f"{kind}/{size} {tok['sha256'][:8]}"
    return f"{kind}/{size}"


def dataset_id(config: dict[str, Any]) -> str:
    """The data a run's numbers come from: the sources' sha256 and the split settings of a
    prepared directory (two directories prepared alike count as one), else the name."""
    data = config.get("data") or {}
    dataset = str(data.get("dataset", "bundled"))
    meta = _meta(dataset)
    sources = meta.get("sources")
    if isinstance(sources, list) and sources:
        digests = sorted(str(s.get("sha256", "?"))[:8] for s in sources if isinstance(s, dict))
        settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else {}
        split = f"val {settings.get('val_fraction')}, seed {settings.get('seed')}"
        return f"{'+'.join(digests)} ({split})"
    return f"{dataset} (val {data.get('val_fraction')})"


def mixed_warnings(labels: list[str], configs: list[dict[str, Any]]) -> list[str]:
    """One warning per property that differs between runs (their losses are not comparable)."""
    warnings = []
    for what, ident in (("tokenizers", tokenizer_id), ("datasets", dataset_id)):
        groups: dict[str, list[str]] = {}
        for label, cfg in zip(labels, configs, strict=True):
            groups.setdefault(ident(cfg), []).append(label)
        if len(groups) > 1:
            shown = "; ".join(f"{', '.join(runs)}: {key}" for key, runs in groups.items())
            warnings.append(
                f"warning: these runs use different {what} ({shown}): their losses are not "
                "comparable"
            )
    return warnings
