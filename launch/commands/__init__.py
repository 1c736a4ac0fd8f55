"""Subcommands of the `normlab` CLI (each module has `register(subparsers)`)."""
