"""User-facing errors: the CLI prints their message on one line and exits with status 2."""


class NormlabError(Exception):
    """Base class of errors caused by user input or by files on disk, not by a bug."""


class ConfigError(NormlabError):
    """A recipe, override or resolved configuration is invalid."""


class CheckpointError(NormlabError):
    """A checkpoint is missing, truncated, corrupt or incompatible with the configured model."""


class RunDirError(NormlabError):
    """A run directory cannot be used as asked (for example another recipe already lives there)."""
