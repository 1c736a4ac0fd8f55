"""normlab's decoder: every norm placement behind one config switch (see SCIENCE.md)."""

from .config import ModelConfig
from .loss import lm_loss
from .presets import PRESETS, count_params
from .transformer import Block, Transformer

__all__ = ["Block", "ModelConfig", "PRESETS", "Transformer", "count_params", "lm_loss"]
