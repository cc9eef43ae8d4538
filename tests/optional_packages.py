"""The environments' optional packages in tests: skipped with the install command in a
user's clone, failing under RLPOST_REQUIRE_SHARED=1 (CI installs the `envs` extra)."""

import importlib

from conftest import skip_or_fail


def require(module: str):
  """The package `module` (reasoning_gym, gymnasium, textarena, math_verify), or skip/fail."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    skip_or_fail(f"{module} is not installed ({e}): pip install -e '.[envs]'")
