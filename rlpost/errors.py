"""Errors the user fixes by changing the command, not the code.

The experiment mains (`experiments/cli.py`) print a `UsageError` (a config value, a flag,
a data or model file) as one `FATAL` line and
exit with status 2, as absl does for a bad flag; any other exception is a traceback and
status 1. The message carries everything needed: the setting (config field, flag or
path), the value given and the fix.
"""


class UsageError(Exception):
  """The run cannot start (or go on) as configured: a config value, a flag, the workdir
  or its checkpoints."""


class ConfigError(UsageError, ValueError):
  """A config field's value is refused: `config.<field>=<value>: <fix>`."""


class FlagError(UsageError, ValueError):
  """A command-line flag's value is refused: `--<flag>=<value>: <fix>`."""


class DataError(UsageError, ValueError):
  """A data or model file cannot be used: `<path>[:<line>]: <what is wrong>; <fix>` (a
  ValueError, as the loaders raised before it had a name of its own)."""
