"""A user's code named in a config value as `MODULE:FUNCTION` (an agent, an opponent)."""

import importlib
from collections.abc import Callable


def function_at(reference: str, field: str, shape: str) -> Callable:
  """The function `reference` ("MODULE:FUNCTION") names; a ValueError "FIELD='...': ..."
  naming what is wrong and the fix (`shape`: what the function must be, e.g.
  "run(client, task) -> reward")."""
  module, colon, name = str(reference).partition(":")
  fix = f"write it as MODULE:FUNCTION naming {shape}"
  if not colon or not module or not name:
    raise ValueError(f"{field}={reference!r}: {fix}")
  try:
    function = getattr(importlib.import_module(module), name)
  except (ImportError, AttributeError) as err:
    raise ValueError(f"{field}={reference!r}: cannot import it ({err}); {fix}") from None
  if not callable(function):
    raise ValueError(f"{field}={reference!r}: not a function; {fix}")
  return function
