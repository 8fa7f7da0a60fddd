"""CLI subcommands, one module each (discovered by :mod:`picklescope.cli`)."""
