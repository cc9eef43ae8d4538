"""Builds (model config, params, tokenizer) from the few settings an experiment names."""

import functools
import math
import os

import jax
import jax.numpy as jnp
from absl import logging

from rlpost import errors
from rlpost.models import decoder, families
from rlpost.models.weights import gguf, gguf_file, packaged
from rlpost.text import tokenizer as tokenizer_lib
from rlpost.text import vocabularies

WEIGHT_SOURCES = ("gguf", "hf", "random")
DTYPES = ("float32", "bfloat16")
_BYTE_VOCAB = 1000  # a preset with fewer embedding rows is a test model (byte tokenizer)


def byte_vocabulary(config) -> bool:
  """Whether `config` is a tiny test model, read with the byte tokenizer."""
  return config.vocab_size < _BYTE_VOCAB


def default_weights(preset: str) -> str:
  """The weight source a preset runs with unless told: "random" for a test model, else
  "gguf" (its packaged file, or `model.path`)."""
  return "random" if byte_vocabulary(families.get_config(preset)) else "gguf"


def load_model(preset: str, weights: str, path: str = "", dtype: str = "float32", seed: int = 0):
  """Returns (Config, params, Tokenizer).

  Args:
    preset: a `families.PRESETS` name; the architecture read from real weights
      must agree with it.
    weights: "gguf" (path to a GGUF file; empty: the preset's packaged file,
      `families.packaged_gguf`), "hf" (a Hugging Face checkpoint directory), or
      "random" (init_params with `seed`).
    dtype: param dtype, "float32" or "bfloat16".
  """
  if weights not in WEIGHT_SOURCES:
    raise ValueError(f"model.weights={weights!r} is not one of {WEIGHT_SOURCES}")
  if dtype not in DTYPES:
    raise ValueError(f"model.dtype={dtype!r} is not one of {DTYPES}")
  config = families.get_config(preset)
  jdtype = jnp.dtype(dtype)
  if weights == "random":
    params = decoder.init_params(jax.random.key(seed), config, jdtype)
    if byte_vocabulary(config):
      if path:
        logging.warning(
          "model.path=%r is not read: model.weights='random' with preset %r uses the byte "
          "tokenizer. Set model.weights='gguf' or 'hf' to load it.",
          path,
          preset,
        )
      return config, params, tokenizer_lib.byte_tokenizer(families.of(config).chat)
    tok = load_gguf_tokenizer(path or families.packaged_gguf(preset))
    check_vocabulary(config, tok, path or preset)
    return config, params, tok
  if path and not os.path.exists(path):
    raise FileNotFoundError(
      f"model.path={path!r}: no such file or directory; give the GGUF file "
      "(model.weights='gguf'; '' for the packaged one) or the Hugging Face checkpoint "
      "directory (model.weights='hf')"
    )
  if weights == "gguf":
    path = path or families.packaged_gguf(preset)
    params, info = gguf.load_gguf(path, dtype=jdtype)
    tok = load_gguf_tokenizer(path)
  else:
    from rlpost.models.weights import safetensors  # pylint: disable=g-import-not-at-top

    if not path:
      raise ValueError(
        "model.path must name a Hugging Face checkpoint directory when model.weights='hf'"
      )
    params, info = safetensors.load_hf_checkpoint(path, dtype=jdtype)
    tok = _hf_tokenizer(path, preset, config)
  check_architecture(config, info, preset)
  check_vocabulary(config, tok, path)
  return config, jax.tree.map(jnp.asarray, params), tok


def _hf_tokenizer(path: str, preset: str, config) -> tokenizer_lib.Tokenizer:
  """A HF directory's tokenizer.json; else the byte tokenizer of a tiny test model, or the
  preset's packaged one (directories we export carry no tokenizer)."""
  if os.path.isfile(os.path.join(path, "tokenizer.json")):
    return vocabularies.from_hf_directory(path)
  if byte_vocabulary(config):
    return tokenizer_lib.byte_tokenizer(families.of(config).chat)
  try:
    return load_gguf_tokenizer(families.packaged_gguf(preset))
  except errors.ConfigError:
    raise errors.DataError(
      f"{path} has no tokenizer.json and model.preset={preset!r} has no packaged tokenizer: "
      "copy the model's tokenizer.json and tokenizer_config.json into the directory"
    ) from None


def check_vocabulary(config, tokenizer, source) -> None:
  """Refuses a tokenizer with ids the model has no embedding row for (another model's
  tokenizer); fewer ids than rows is fine (padded embeddings)."""
  if tokenizer.vocab_size > config.vocab_size:
    raise errors.DataError(
      f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
      f"only {config.vocab_size} rows: the tokenizer belongs to another model. Give the "
      "model's own tokenizer (its GGUF file, or tokenizer.json in its directory)."
    )


def _same(a, b) -> bool:
  if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  if isinstance(a, (bool, str)) or isinstance(b, (bool, str)) or a is None or b is None:
    return a == b
  return math.isclose(a, b, rel_tol=1e-5)


def check_architecture(config, info: dict, preset: str) -> None:
  """Raises ValueError naming the family, or every field, where the weights' metadata and
  the preset disagree."""
  family = info["family"]
  if family != config.family:
    same_family = sorted(families.family(family).presets)
    raise ValueError(
      f"The weights are a {family} model and model.preset={preset!r} is a {config.family} "
      f"one. Choose a {family} preset (valid: {same_family})."
    )
  diffs = [
    f"{name}: weights {info[name]} vs preset {getattr(config, name)}"
    for name in info
    if not _same(info[name], getattr(config, name))
  ]
  if diffs:
    raise ValueError(
      f"The weights do not match model.preset={preset!r}: "
      + "; ".join(diffs)
      + f". Choose the matching preset (valid: {sorted(families.PRESETS)})."
    )


def load_gguf_tokenizer(path: str | os.PathLike | None = None) -> tokenizer_lib.Tokenizer:
  """Tokenizer of a GGUF file (default: the packaged Gemma 3 270M); cached."""
  if path is None:
    path = packaged.default_gguf_path()
  return _load_cached(os.path.realpath(path))


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> tokenizer_lib.Tokenizer:
  return vocabularies.from_gguf_metadata(gguf_file.read_gguf(path).metadata, path)
