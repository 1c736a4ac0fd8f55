"""Error type for bad user input to the data pipeline (the CLI maps it to exit code 2)."""


class DataError(ValueError):
    """A data directory, input file or option the pipeline cannot use; the message says why."""
