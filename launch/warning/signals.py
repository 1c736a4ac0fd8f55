"""The precursor signals of SCIENCE.md 23.2 that normlab logs, each with its detector rule.

A signal is either one metric (`loss`, `grad_norm`, `max_logit`) or a per-block family
(`update_norm/00`, `update_norm/01`, ...): a family alarms when any of its blocks alarms.
The loss is the baseline every other signal must beat (23.3); the grad norm is the second one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from normlab.launch.metric_keys import (
    ADAM_M_NORM,
    ADAM_UPDATE_RMS,
    ADAM_V_NORM,
    ATTN_ENTROPY,
    ELEMENT_KURTOSIS,
    EPS_FLOOR,
    GRAD,
    GRAD_MOM_COS,
    HEAD_MEAN_NORM,
    HEAD_NORM,
    LOGZ_MEAN,
    MAX_LOGIT,
    QK_ENTROPY,
    RESID,
    UPDATE,
    UPDATE_NORM,
)
from normlab.launch.warning.detector import Rule


@dataclass(frozen=True)
class Signal:
    name: str
    key: str  # the metric, or the per-block kind of a family
    per_block: bool
    rule: Rule
    source: str  # SCIENCE.md 23.2's row


BASELINE = "loss"
SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        Signal("loss", "loss", False, Rule(), "baseline: the loss itself"),
        Signal("grad_norm", GRAD, False, Rule(), "global grad norm (OLMo 2, Levanter)"),
        Signal(
            "update_norm", UPDATE_NORM, True, Rule(level=2.0, level_is_ratio=True),
            "update-norm ratio per block (Marin #1368: 2x)",
        ),
        Signal("update_ratio", UPDATE, True, Rule(), "||update|| / ||W|| per block"),
        Signal("block_grad_norm", GRAD, True, Rule(), "grad norm per block"),
        Signal("max_logit", MAX_LOGIT, False, Rule(level=50.0), "max attention logit, S_max > 50"),
        Signal("resid_rms", RESID, True, Rule(), "residual-stream RMS per block"),
        Signal("logz_mean", LOGZ_MEAN, False, Rule(transform="abs"), "|mean log Z| (output)"),
        Signal("head_mean_norm", HEAD_MEAN_NORM, False, Rule(), "head norm (mean embedding)"),
        Signal("head_norm", HEAD_NORM, False, Rule(), "||W_head|| (adam_state)"),
        Signal(
            "adam_update_rms", ADAM_UPDATE_RMS, True, Rule(level=0.9),
            "Adam update RMS per block, >= 0.9 sign-like (Molybog 2023)",
        ),
        Signal(
            "adam_m_norm", ADAM_M_NORM, True, Rule(level=2.0, level_is_ratio=True),
            "||m|| per block, 2x its median (Marin #1368)",
        ),
        Signal(
            "qk_entropy", QK_ENTROPY, True, Rule(rising=False, transform="none"),
            "QK spectral entropy, min over heads: stand-in for arXiv 2606.28116",
        ),
        Signal("kurtosis", ELEMENT_KURTOSIS, True, Rule(), "block-output kurtosis (FOG)"),
        Signal(
            "attn_entropy", ATTN_ENTROPY, True, Rule(rising=False, transform="none"),
            "attention entropy, min over heads: a collapse (Zhai et al. 2023)",
        ),
        Signal("adam_v_norm", ADAM_V_NORM, True, Rule(), "||sqrt(v)|| per block"),
        Signal(
            "eps_floor", EPS_FLOOR, True, Rule(level=0.5, transform="none"),
            "share of sqrt(v_hat) < 10 eps, >= 0.5 (Wortsman 2023)",
        ),
        Signal(
            "grad_mom_cos", GRAD_MOM_COS, True, Rule(transform="none"),
            "cos(g_t, m_t-1) per block",
        ),
    )
}  # fmt: skip


def level_rule(signal: Signal, level: float | None) -> Rule:
    """The signal's rule with its level alarm at `level` (None: off; at or below it for a
    falling signal, as a ratio for a ratio signal): what `normlab warnings` tunes and what
    instruments.early_warning.levels sets."""
    return replace(signal.rule, level=level, level_above=signal.rule.rising)
