"""Where each stack logs the loss and the metrics the analyses read: one mapping per source.

A history's columns (a TensorBoard tag, a JSONL key, a CSV column) are found by name. Each source
lists, for every normlab metric, the names that stack logs it under, in order of preference; a
name may hold `*` (one eval set of several: OLMo-core's `eval/lm/<set>/CE loss`, the first in
sorted order is taken). Read from each stack's code (docs/guides/external_runs.md cites where):

- torchtitan (torchtitan/components/metrics.py, MetricsProcessor.log): `loss_metrics/
  global_avg_loss`, `grad_norm`; the lr as `lr/<optimizer class>` (components/optimizer/
  lr_scheduler.py, get_metrics; `lr` in older versions); the validator `validation_metrics/loss`.
- Megatron-LM (megatron/training/training.py, training_log / evaluate_and_print_results): the
  loss_dict key `lm loss` (pretrain_gpt.py), `grad-norm`, `learning-rate`, and `lm loss
  validation`; the step is the iteration.
- OLMo-core (src/olmo_core/train/common.py, train_module.py, eval/lm_evaluator.py): `train/CE
  loss`, `optim/total grad norm`, `optim/LR (group 0)`, and the evaluator's `eval/lm/<set>/CE
  loss`.
- plain: `loss`, `grad_norm`, `lr`, `eval_loss` (normlab's own metrics.jsonl names; its
  TensorBoard tags `train/loss`, ... too), and a few common spellings.

`--metric NAME=COLUMN` overrides one entry (NAME a normlab metric: loss, grad_norm, lr,
eval_loss, init_loss, or any logged key such as max_logit); `--source auto` (the default) takes
the first source whose loss name the history holds.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence

from normlab.launch.errors import ConfigError

LOSS, GRAD, LR, EVAL, INIT = "loss", "grad_norm", "lr", "eval_loss", "init_loss"
SOURCES: dict[str, dict[str, tuple[str, ...]]] = {
    "torchtitan": {
        LOSS: ("loss_metrics/global_avg_loss",),
        GRAD: ("grad_norm",),
        LR: ("lr/*", "lr"),
        EVAL: ("validation_metrics/loss",),
    },
    "megatron": {
        LOSS: ("lm loss",),
        GRAD: ("grad-norm",),
        LR: ("learning-rate",),
        EVAL: ("lm loss validation",),
    },
    "olmo-core": {
        LOSS: ("train/CE loss",),
        GRAD: ("optim/total grad norm",),
        LR: ("optim/LR (group 0)",),
        EVAL: ("eval/lm/*/CE loss",),
    },
    "plain": {
        LOSS: ("loss", "train/loss", "train_loss"),
        GRAD: ("grad_norm", "train/grad_norm", "gradient_norm"),
        LR: ("lr", "train/lr", "learning_rate"),
        EVAL: ("eval_loss", "eval/eval_loss", "val_loss", "eval/loss", "validation/loss"),
        INIT: ("init_loss", "train/init_loss"),
    },
}
STEP_COLUMNS = ("step", "_step", "iteration", "global_step", "trainer/global_step")
AUTO = "auto"


def parse_overrides(items: Sequence[str] | None) -> dict[str, str]:
    """`--metric loss=lm loss` items as {normlab name: column}; one line for a malformed one."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ConfigError(f"--metric {item!r}: expected NAME=COLUMN (e.g. loss=lm loss)")
        out[name.strip()] = column.strip()
    return out


def _match(patterns: Iterable[str], columns: Sequence[str]) -> str | None:
    for pattern in patterns:
        if pattern in columns:
            return pattern
        if "*" in pattern:
            hits = sorted(c for c in columns if fnmatch.fnmatchcase(c, pattern))
            if hits:
                return hits[0]
    return None


def resolve(
    columns: Sequence[str], source: str, overrides: Mapping[str, str], where: str
) -> tuple[str, dict[str, str]]:
    """(the source used, {normlab name: column}) for a history holding `columns`. The loss must
    be found; a column named by --metric must exist."""
    if source != AUTO and source not in SOURCES:
        raise ConfigError(f"--source {source!r}: expected one of {AUTO}, {', '.join(SOURCES)}")
    for name, column in overrides.items():
        if column not in columns:
            raise ConfigError(
                f"{where}: --metric {name}={column}: no such column (it has {_listed(columns)})"
            )
    if source == AUTO:
        found = [s for s, names in SOURCES.items() if _match(names[LOSS], columns)]
        source = found[0] if found else "plain"
    names = {k: c for k, pats in SOURCES[source].items() if (c := _match(pats, columns))}
    names.update(overrides)
    if LOSS not in names:
        wanted = " or ".join(repr(p) for p in SOURCES[source][LOSS])
        raise ConfigError(
            f"{where}: no loss ({source} logs it as {wanted}; it has {_listed(columns)}): "
            "name it with --metric loss=COLUMN"
        )
    return source, names


def _listed(columns: Sequence[str]) -> str:
    shown = ", ".join(repr(c) for c in list(columns)[:8])
    return (shown + ", ...") if len(columns) > 8 else (shown or "no columns")
