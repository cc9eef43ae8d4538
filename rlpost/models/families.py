"""Model families: `FAMILIES`, the one table of what the library knows about each family.

A family's entry (`Family`) names its Config class (what the decoder reads, declared in
`rlpost.models.architecture`), its presets and their context lengths, its chat format,
its weight map (a module of `rlpost.models.weights`: GGUF and Hugging Face tensor names
and metadata), the GGUF `general.architecture`s and config.json `model_type`s it reads,
and the packaged GGUF files of its presets. The loaders (`weights.gguf`,
`weights.safetensors`, `loading`) and the experiment configs find a family only here;
everything else (sampler, policy, critic, LoRA, int8 rollouts, checkpoints) runs
`rlpost.models.decoder` on any family's params.

Adding a family: a Llama-style variant is presets (a `llama.Config` each, `family` set to
the new name) and one `Family(...)` line below, with `llama.Config` and `llama_names`; a
family with its own architecture is its Config and presets (a module like `gemma3.py`),
its weight map (a module like `weights/gemma3_names.py`) and its line here. `register`
checks the entry: every preset of its class and family, providing the decoder's
`Architecture`, with a context length; preset names, GGUF architectures and HF model types
unique across families.
"""

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from rlpost import errors
from rlpost.models import architecture, gemma3, llama
from rlpost.models.weights import gemma3_names, llama_names, packaged
from rlpost.text import chat_formats

# What a family's weight map module provides (`rlpost.models.weights.gemma3_names`).
WEIGHT_MAP = ("gguf_info", "gguf_targets", "hf_info", "hf_names", "hf_config", "HF_PREFIXES")


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  name: the family name (every preset's `Config.family`).
  config: its Config class (`rlpost.models.architecture.Architecture`).
  presets: preset name -> Config.
  context_tokens: preset name -> tokens the preset was trained to attend over.
  chat: its chat format (`rlpost.text.chat_formats.NAMES`).
  weights: its weight map module (WEIGHT_MAP; `rlpost.models.weights`).
  gguf_architectures: GGUF `general.architecture` values whose files it reads.
  hf_model_types: config.json `model_type` values it reads; export writes the first.
  hf_architecture: the config.json `architectures` entry export writes.
  packaged: preset -> the function giving the GGUF file an empty `model.path` loads
    (`rlpost.models.weights.packaged`).
  fixed: Config fields every checkpoint of the family has that neither config.json nor
    the GGUF metadata states (Qwen2's q/k/v biases); its presets must agree.
  gguf_rope_rows: llama.cpp's converter permuted the q/k rows of its GGUF files for
    interleaved RoPE (llama.cpp's `llama` architecture).
  """

  name: str
  config: type
  presets: Mapping[str, Any]
  context_tokens: Mapping[str, int]
  chat: str
  weights: Any
  gguf_architectures: tuple[str, ...]
  hf_model_types: tuple[str, ...]
  hf_architecture: str
  packaged: Mapping[str, Callable[[], pathlib.Path]] = dataclasses.field(default_factory=dict)
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  gguf_rope_rows: bool = False


FAMILIES: dict[str, Family] = {}
PRESETS: dict[str, Any] = {}  # every family's presets by name (filled by `register`)


def _conflicts(f: Family) -> list[str]:
  """What `f` claims that a registered family already has."""
  bad = [f"name {f.name!r} is registered"] if f.name in FAMILIES else []
  bad += [f"preset {p!r} is another family's" for p in f.presets if p in PRESETS]
  for other in FAMILIES.values():
    taken = set(f.gguf_architectures) & set(other.gguf_architectures)
    bad += [f"GGUF architecture {a!r} is {other.name}'s" for a in sorted(taken)]
    taken = set(f.hf_model_types) & set(other.hf_model_types)
    bad += [f"HF model_type {t!r} is {other.name}'s" for t in sorted(taken)]
  return bad


def _problems(f: Family) -> list[str]:
  """Everything wrong with the entry `f` (empty: it may be registered)."""
  bad = _conflicts(f)
  bad += [f"weights module lacks {n}" for n in WEIGHT_MAP if not hasattr(f.weights, n)]
  if f.chat not in chat_formats.NAMES:
    bad.append(f"chat={f.chat!r} is not one of {chat_formats.NAMES}")
  if not (f.gguf_architectures and f.hf_model_types):
    bad.append("give at least one GGUF architecture and one HF model_type")
  if set(f.context_tokens) != set(f.presets):
    bad.append(f"context_tokens names {sorted(f.context_tokens)}, presets {sorted(f.presets)}")
  bad += [f"packaged file of unknown preset {p!r}" for p in f.packaged if p not in f.presets]
  for name, config in f.presets.items():
    if type(config) is not f.config or config.family != f.name:
      bad.append(f"preset {name!r} is a {type(config).__qualname__} of family {config.family!r}")
      continue
    architecture.check(config, f"family {f.name!r}, preset {name!r}")
    bad += [
      f"preset {name!r} has {k}={getattr(config, k)!r}, the family fixes {v!r}"
      for k, v in f.fixed.items()
      if getattr(config, k) != v
    ]
  return bad


def register(f: Family) -> Family:
  """Adds `f` to FAMILIES (and its presets to PRESETS); ValueError naming every problem."""
  bad = _problems(f)
  if bad:
    raise ValueError(f"model family {f.name!r} cannot be registered: " + "; ".join(bad))
  FAMILIES[f.name] = f
  PRESETS.update(f.presets)
  return f


def _context(presets) -> dict[str, int]:
  return {name: llama.CONTEXT_TOKENS[name] for name in presets}


_LLAMA = {"config": llama.Config, "weights": llama_names}
register(
  Family(
    "gemma3",
    gemma3.Config,
    gemma3.PRESETS,
    gemma3.CONTEXT_TOKENS,
    chat="gemma",
    weights=gemma3_names,
    gguf_architectures=("gemma3",),
    hf_model_types=("gemma3_text", "gemma3"),
    hf_architecture="Gemma3ForCausalLM",
    # the 1B preset reads the 270M file's tokenizer (one vocabulary); its weights need a path
    packaged={"gemma3_270m": packaged.default_gguf_path, "gemma3_1b": packaged.default_gguf_path},
  )
)
register(
  Family(
    "llama",
    presets=llama.LLAMA_PRESETS,
    context_tokens=_context(llama.LLAMA_PRESETS),
    chat="llama3",
    gguf_architectures=("llama",),
    hf_model_types=("llama",),
    hf_architecture="LlamaForCausalLM",
    packaged={"smollm2_135m": packaged.smollm2_gguf_path},
    gguf_rope_rows=True,
    **_LLAMA,
  )
)
register(
  Family(
    "qwen2",
    presets=llama.QWEN2_PRESETS,
    context_tokens=_context(llama.QWEN2_PRESETS),
    chat="chatml",
    gguf_architectures=("qwen2",),
    hf_model_types=("qwen2",),
    hf_architecture="Qwen2ForCausalLM",
    fixed={"qkv_bias": True},
    **_LLAMA,
  )
)
register(
  Family(
    "qwen3",
    presets=llama.QWEN3_PRESETS,
    context_tokens=_context(llama.QWEN3_PRESETS),
    chat="chatml",
    gguf_architectures=("qwen3",),
    hf_model_types=("qwen3",),
    hf_architecture="Qwen3ForCausalLM",
    fixed={"qk_norm": True},
    **_LLAMA,
  )
)


def family(name: str) -> Family:
  """The family `name`; ValueError listing the supported ones."""
  if name not in FAMILIES:
    raise ValueError(f"model family {name!r} is not supported; supported: {sorted(FAMILIES)}")
  return FAMILIES[name]


def of(config) -> Family:
  """The family of a Config."""
  return family(config.family)


def config_from_info(info: Mapping[str, Any]):
  """The Config of a loader's info dict (its Config fields, `family` among them)."""
  return family(info.get("family")).config(**info)


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


def packaged_gguf(preset: str) -> pathlib.Path:
  """The packaged GGUF file of `preset` (its family's `packaged`); ConfigError naming the
  packaged presets and the fix when it has none."""
  for f in FAMILIES.values():
    if preset in f.packaged:
      return f.packaged[preset]()
  known = sorted(p for f in FAMILIES.values() for p in f.packaged)
  raise errors.ConfigError(
    f"model.preset={preset!r} has no packaged GGUF file (packaged: {known}): "
    "set model.path to the model's .gguf file or Hugging Face directory"
  )


def by_gguf_architecture(arch: Any, source: str) -> Family:
  """The family reading GGUF files of `general.architecture` `arch`; DataError naming
  `source` and the supported architectures."""
  for f in FAMILIES.values():
    if arch in f.gguf_architectures:
      return f
  supported = sorted(a for f in FAMILIES.values() for a in f.gguf_architectures)
  raise errors.DataError(
    f"{source}: GGUF architecture is {arch!r}; supported: {supported} (rlpost.models.families)"
  )


def by_hf_model_type(model_type: Any, source: str) -> Family:
  """The family reading config.json files of `model_type`; DataError naming `source` and
  the supported model types."""
  for f in FAMILIES.values():
    if model_type in f.hf_model_types:
      return f
  supported = sorted(t for f in FAMILIES.values() for t in f.hf_model_types)
  raise errors.DataError(
    f"{source}: model_type={model_type!r} is not supported; supported: {supported}"
  )
