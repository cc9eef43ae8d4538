"""Model families chosen by name: one `Family` record each, and the presets of all.

A family is one module holding its frozen `Config` (what `rlpost.models.decoder`
reads), its presets and their context lengths, plus its weight map
(`rlpost.models.weights`). Everything else (sampler, policy, critic, LoRA, int8
rollouts, checkpoints) runs `rlpost.models.decoder` on any family's params.

Preset names are unique across families, so a preset alone picks its family.
"""

import dataclasses
from typing import Any

from rlpost.models import gemma3, llama


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  name: the family name (`model.family`, `Config.family`).
  presets: preset name -> Config.
  context_tokens: preset name -> tokens the preset was trained to attend over.
  chat: the family's chat format (`rlpost.text.chat_formats`).
  """

  name: str
  presets: dict[str, Any]
  context_tokens: dict[str, int]
  chat: str


def _context(presets) -> dict[str, int]:
  return {name: llama.CONTEXT_TOKENS[name] for name in presets}


FAMILIES: dict[str, Family] = {
  f.name: f
  for f in (
    Family(gemma3.FAMILY, gemma3.PRESETS, gemma3.CONTEXT_TOKENS, chat="gemma"),
    Family("llama", llama.LLAMA_PRESETS, _context(llama.LLAMA_PRESETS), chat="llama3"),
    Family("qwen2", llama.QWEN2_PRESETS, _context(llama.QWEN2_PRESETS), chat="chatml"),
    Family("qwen3", llama.QWEN3_PRESETS, _context(llama.QWEN3_PRESETS), chat="chatml"),
  )
}
PRESETS: dict[str, Any] = {name: c for f in FAMILIES.values() for name, c in f.presets.items()}


def family(name: str) -> Family:
  """The family `name`; ValueError listing the supported ones."""
  if name not in FAMILIES:
    raise ValueError(f"model family {name!r} is not supported; supported: {sorted(FAMILIES)}")
  return FAMILIES[name]


def of(config) -> Family:
  """The family of a Config."""
  return family(config.family)


def get_config(name: str, **overrides):
  """The preset `name` of any family, with dataclass fields replaced by `overrides`."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; valid presets: {sorted(PRESETS)}")
  return dataclasses.replace(PRESETS[name], **overrides)


def context_tokens(preset: str) -> int | None:
  """Tokens the preset attends over (None: unknown preset)."""
  for f in FAMILIES.values():
    if preset in f.context_tokens:
      return f.context_tokens[preset]
  return None
