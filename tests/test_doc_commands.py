"""The commands the docs show name fields their configs have: every `--config.a.b=...`
after a `--config=experiments/configs/FILE.py[:VARIANT]` in README.md, BUILD.md, the
results index and the experiments' docstrings (scripts and configs) is a field of that config (or an old
name the command line still takes, `rlpost.config_moves.MOVED`). A renamed or never-added
field otherwise fails only when a reader runs the command: "no such field"."""

import functools
import re

import pytest
from absl import flags
from conftest import REPO_ROOT
from ml_collections import config_flags

from rlpost import config_moves

_CONFIG = re.compile(r"--config=(experiments/configs/[\w/]+\.py)(?::([\w.,]+))?")
_OVERRIDE = re.compile(r"--config\.([a-z_][\w.]*)=")


def _commands(text: str):
  """Each command's text: a backtick span, or a code line with its continuations joined."""
  text = re.sub(r"\\\n\s*", " ", text)  # shell line continuations
  spans = re.findall(r"`([^`\n]+)`", text)
  lines = [line for line in text.split("\n") if "--config=" in line and "`" not in line]
  return [c for c in spans + lines if "--config=" in c]


def _documented():
  """{(config spec, field): where} over the docs and the config modules' docstrings."""
  sources = [REPO_ROOT / "README.md", REPO_ROOT / "BUILD.md"]
  sources += [REPO_ROOT / "experiments/results/INDEX.md"]
  sources += sorted((REPO_ROOT / "experiments").rglob("*.py"))  # docstrings and configs
  found = {}
  for path in sources:
    for command in _commands(path.read_text(encoding="utf-8")):
      for part in re.split(r"(?=--config=)", command)[1:]:  # one config per part
        match = _CONFIG.match(part)
        if not match:
          continue
        spec = match.group(1) + (f":{match.group(2)}" if match.group(2) else "")
        if spec != spec.lower():  # a placeholder (KIND, ENV_MODEL): a template, not a command
          continue
        for field in _OVERRIDE.findall(part):
          found.setdefault((spec, field), str(path.relative_to(REPO_ROOT)))
  return found


@functools.cache
def _config(spec: str):
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", str(REPO_ROOT / spec), "", flag_values=values)
  values(["prog"])
  return values["config"].value


def test_every_documented_override_is_a_field_of_its_config(monkeypatch):
  """Mutation caught: README's SFT command with `--config.env.data_dir` (the SFT config
  has a data block, no env block) as it was."""
  monkeypatch.setattr("sys.argv", ["prog"])
  documented = _documented()
  assert len(documented) > 50
  missing = []
  for (spec, field), where in sorted(documented.items()):
    config = _config(spec)
    moved = config_moves.MOVED.get(field)
    if not (
      config_moves.has_field(config, field) or (moved and config_moves.has_field(config, moved))
    ):
      missing.append(f"{where}: {spec} has no {field}")
  assert not missing, "\n".join(missing)
