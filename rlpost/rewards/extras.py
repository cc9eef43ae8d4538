"""Optional packages (pyproject extras), imported only when a config chooses them.

`load("reasoning_gym", "reasoning-gym")` returns the module, or raises a
`errors.ConfigError` (one FATAL line in the experiment mains) naming the setting that
chose it and the `pip install` command that provides it.
"""

import importlib

from rlpost import errors

# module -> (the extra that installs it, its pinned requirement)
EXTRAS = {
  "reasoning_gym": ("reasoning-gym", "reasoning-gym==0.1.25"),
  "gymnasium": ("gymnasium", "gymnasium==1.4.0"),
  "textarena": ("textarena", "textarena==0.7.4"),
  "math_verify": ("math-verify", "math-verify==0.9.0"),
}


def load(module: str, chosen_by: str):
  """The optional package `module` (a key of EXTRAS); `chosen_by` names the setting that
  needs it (e.g. "config.env.name='reasoning_gym'")."""
  extra, requirement = EXTRAS[module]
  try:
    return importlib.import_module(module)
  except ImportError as err:
    raise errors.ConfigError(
      f"{chosen_by} needs the package {module!r}, which does not import ({err}): "
      f"pip install -e '.[{extra}]' (or pip install {requirement}; '.[envs]' installs "
      "every environment's package)"
    ) from None
