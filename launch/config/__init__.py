"""Typed run configuration (a leaf: imports no component).

`schema` holds one dataclass per recipe section, `checks` the cross-field checks, `build`
the recipe-to-config path; `loader` reads YAML
recipes with `base:` inheritance and dotted overrides.
"""

from normlab.launch.config.build import from_dict, load_config
from normlab.launch.config.checks import validate
from normlab.launch.config.schema import (
    CheckpointSection,
    DataSection,
    EngineSection,
    FP8Section,
    LoggingSection,
    ModelSection,
    OptimSection,
    PrecisionSection,
    QKClipSection,
    RunConfig,
    ScheduleSection,
    TrainingSection,
    WandbSection,
)

__all__ = [
    "CheckpointSection",
    "DataSection",
    "EngineSection",
    "FP8Section",
    "LoggingSection",
    "ModelSection",
    "OptimSection",
    "PrecisionSection",
    "QKClipSection",
    "RunConfig",
    "ScheduleSection",
    "TrainingSection",
    "WandbSection",
    "from_dict",
    "load_config",
    "validate",
]
