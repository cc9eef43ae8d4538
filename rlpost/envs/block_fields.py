"""Helpers for `env` block fields that carry a package's own settings.

A dict field (a generator's config, a gymnasium env's constructor arguments) arrives from a
config file as a dict or ConfigDict, or from the command line as a JSON object string
(`--config.env.task_config='{"min_terms": 2}'`); `mapping` reads any of them and
`frozen_json` stores it as canonical JSON, so the frozen config stays hashable.
"""

import json


def mapping(value, field: str) -> dict:
  """The dict a field holds: a mapping, a ConfigDict or a JSON object string ("" = {});
  ValueError "field=value: fix" otherwise."""
  if isinstance(value, str):
    try:
      value = json.loads(value) if value.strip() else {}
    except json.JSONDecodeError as err:
      raise ValueError(
        f"{field}={value!r}: is not a JSON object ({err}); write e.g. '{{\"min_terms\": 2}}'"
      ) from None
  if hasattr(value, "to_dict"):  # a ConfigDict
    value = value.to_dict()
  if not isinstance(value, dict):
    raise ValueError(f"{field}={value!r}: must be a dict or a JSON object string")
  return dict(value)


def frozen_json(value, field: str) -> str:
  """`mapping(value, field)` as canonical JSON (sorted keys)."""
  return json.dumps(mapping(value, field), sort_keys=True)
