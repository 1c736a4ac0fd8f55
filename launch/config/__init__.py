"""Typed run configuration (a leaf: imports no component).

`schema` holds one dataclass per recipe section and the cross-field checks; `loader` reads YAML
recipes with `base:` inheritance and dotted overrides.
"""

from normlab.launch.config.schema import (
    CheckpointSection,
    DataSection,
    EngineSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    PrecisionSection,
    QKClipSection,
    RunConfig,
    ScheduleSection,
    TrainingSection,
    from_dict,
    load_config,
    validate,
)

__all__ = [
    "CheckpointSection",
    "DataSection",
    "EngineSection",
    "LoggingSection",
    "ModelSection",
    "OptimSection",
    "PrecisionSection",
    "QKClipSection",
    "RunConfig",
    "ScheduleSection",
    "TrainingSection",
    "from_dict",
    "load_config",
    "validate",
]
