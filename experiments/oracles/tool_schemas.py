"""transformers' tool schemas of the example functions (issue 66, part 3): the reference
tests/test_tool_functions.py compares `rlpost.envs.tool_functions.json_schema` against,
key order included (a chat template's `tojson` writes keys in order).

Runs in its own environment (transformers is not a dependency of the library or CI); it
imports the examples and the calculator by file path, so rlpost's dependencies are not
needed:

  python3 -m venv /tmp/hf-venv-tools && /tmp/hf-venv-tools/bin/pip install transformers
  /tmp/hf-venv-tools/bin/python experiments/oracles/tool_schemas.py   # from the repo root

Writes tests/fixtures/tool_schemas.json: {"transformers": version, "schemas": {name:
schema}, "refused": {name: exception class}}.
"""

import importlib.util
import json
import pathlib

import transformers
from transformers.utils import get_json_schema

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str, path: pathlib.Path):
  """The module at `path`, imported without its package."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main():
  examples = _load("tool_functions_examples", ROOT / "tests/fixtures/tool_functions_examples.py")
  calculator = _load("calculator", ROOT / "rlpost/envs/calculator.py")
  schemas = {fn.__name__: get_json_schema(fn) for fn in [*examples.TOOLS, calculator.calculator]}
  refused = {}
  for fn in examples.REFUSED:
    try:
      get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 -- the class is what we record
      refused[fn.__name__] = type(e).__name__
    else:
      raise SystemExit(f"{fn.__name__}: transformers gave a schema; move it to TOOLS")
  out = {"transformers": transformers.__version__, "schemas": schemas, "refused": refused}
  path = ROOT / "tests/fixtures/tool_schemas.json"
  path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
  print(f"wrote {path}: {len(schemas)} schemas, {len(refused)} refused")


if __name__ == "__main__":
  main()
