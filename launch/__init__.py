"""normlab's launcher: typed run configuration, trainer, engines, checkpoints and the CLI."""
