"""Names of the metrics normlab logs (metrics.jsonl, TensorBoard), without torch.

The instruments write these keys and the report commands (`compare`, `status`, study reports),
the warnings and the LR-sensitivity protocol read them: each name is typed here once and imported
on both sides, never retyped as a string. A report column named after a metric (max_logit,
scaler_skips, the FP8 and kurtosis columns) uses the metric's name; ACT_GROWTH is the one derived
column other rooms read. This module imports nothing heavy: `normlab compare` needs no torch.
Per-block keys use the 0-based index of `blocks.{i}` padded to two digits so TensorBoard sorts
them by depth; `block_key` / `parse_block_key` are the only place that format lives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

RESID, ATTN_OUT, MLP_OUT = "resid_rms", "attn_out_rms", "mlp_out_rms"
PRE_NORM = "pre_norm_rms"  # post-norm blocks: the residual sum before the closing norm
GRAD, UPDATE = "grad_norm", "update_ratio"
MAX_LOGIT, QK_GAIN = "max_logit", "qk_gain"
MAX_LOGIT_LOWER, MAX_LOGIT_UPPER = "max_logit_lower", "max_logit_upper"  # the lse bound
FP16_CLAMPS = "fp16_clamps"
SPIKE_LOSS, SPIKE_GRAD = "spike_score/loss", "spike_score/grad_norm"
SPIKE_WINDOW = "spike_score/window"  # the window used (scaled down for short runs)
SKIPPED, ROLLBACKS, NONFINITE = "skipped_steps", "rollbacks", "nonfinite_steps"
SCALER_SKIPS = "scaler_skips"  # fp16: updates the loss scaler skipped (inf/NaN gradients)
Z_LOSS = "z_loss"  # the z-loss term, logged beside the cross-entropy `loss`
UPDATE_NORM, UPDATE_SPIKES = "update_norm", "update_spikes"  # per block (update_spikes.py)
UPDATE_RATIO_MAX, UPDATE_SPIKE_STEPS = "update_ratio_max", "update_spike_steps"
ROLLED_BACK = "rolled_back_steps"  # steps whose updates a rollback discarded
# instruments.early_warning: alarm episodes, the lr factor, returns to a checkpoint, clipped steps
EW_ALARMS, EW_LR_SCALE = "early_warning/alarms", "early_warning/lr_scale"
EW_ROLLBACKS, EW_DID_CLIP = "early_warning/rollbacks", "early_warning/did_clip"
S_MAX, CLIPS, CLIP_EVENTS = "s_max", "qk_clips", "qk_clip_events"  # QK-Clip (optim.qk_clip)
# instruments.adam_state: per block the update RMS, ||m||, ||sqrt(v)||, the share of sqrt(v_hat)
# on the epsilon floor, cos(g_t, m_t-1); once ||W_head||
ADAM_UPDATE_RMS, ADAM_M_NORM, ADAM_V_NORM = "adam_update_rms", "adam_m_norm", "adam_v_norm"
EPS_FLOOR, GRAD_MOM_COS, HEAD_NORM = "eps_floor", "grad_mom_cos", "head_norm"
ATTN_ENTROPY = "attn_entropy"  # per block, min over heads (instruments.attn_entropy)
QK_ENTROPY = "qk_entropy"  # per block, min over heads (instruments.qk_spectrum)
# instruments.output_logits (init_loss: the loss before step 0, logged at step 0)
INIT_LOSS = "init_loss"
LOGZ_MEAN, LOGZ_MIN, LOGZ_MAX = "logz_mean", "logz_min", "logz_max"
LOGIT_MEAN, HEAD_MEAN_NORM, GRAD_RMS = "logit_mean", "head_mean_norm", "grad_rms"
# instruments.fp8, per converted layer (block_key(kind, block, layer)): the shares of elements
# cast to zero / beyond e4m3's largest normal, max |x|, the scale, for the input and the weight
FP8_IN_UNDER, FP8_W_UNDER = "fp8_in_under", "fp8_w_under"
FP8_IN_OVER, FP8_W_OVER = "fp8_in_over", "fp8_w_over"
FP8_IN_AMAX, FP8_W_AMAX = "fp8_in_amax", "fp8_w_amax"
FP8_IN_SCALE, FP8_W_SCALE = "fp8_in_scale", "fp8_w_scale"
FP8_UNDER, FP8_OVER = "fp8_under", "fp8_over"  # the largest share over the layers (one key)
# compare's column: the residual stream's growth over depth (launch.report.table), read by the
# study report and the growth claims
ACT_GROWTH = "act_growth"

_BLOCK_KEY = re.compile(r"^(?P<kind>[a-z0-9_]+)/(?P<block>\d+)(?:/(?P<sub>[a-z0-9_]+))?$")


def block_key(kind: str, block: int, sub: str | None = None) -> str:
    """'resid_rms/03', or with a sub-key 'max_logit/03/h1'."""
    return f"{kind}/{block:02d}" + (f"/{sub}" if sub else "")


def parse_block_key(key: str) -> tuple[str, int, str | None] | None:
    """(kind, block, sub) for a per-block key, None for any other key."""
    m = _BLOCK_KEY.match(key)
    return (m["kind"], int(m["block"]), m["sub"]) if m else None


def block_keys(kind: str, keys: Iterable[str]) -> list[str]:
    """The whole-block keys of `kind` among `keys` ('resid_rms/00', ..., not 'resid_rms/01/attn'),
    ordered by block."""
    found = [(p[1], k) for k in keys if (p := parse_block_key(k)) and p[0] == kind and p[2] is None]
    return [k for _, k in sorted(found)]


# Outlier kurtosis per block (launch/instruments/outlier_kurtosis.py, docs/SCIENCE.md 24). The
# element kurtosis (raw, about zero) keeps the names runs logged before, which compare's FP8
# columns and the early-warning signal `kurtosis` read; He et al.'s neuron-norm kurtosis is
# logged beside it.
ELEMENT_KURTOSIS, NEURON_KURTOSIS = "kurtosis", "neuron_kurtosis"  # block outputs (kurtosis)
# instruments.fp8: the down projection's input (the SwiGLU product) and the block outputs
ELEMENT_KURTOSIS_SWIGLU, NEURON_KURTOSIS_SWIGLU = "kurtosis_swiglu", "neuron_kurtosis_swiglu"
ELEMENT_KURTOSIS_RESID, NEURON_KURTOSIS_RESID = "kurtosis_resid", "neuron_kurtosis_resid"
