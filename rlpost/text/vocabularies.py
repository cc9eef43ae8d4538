"""Tokenizers from model files: GGUF `tokenizer.*` metadata and Hugging Face tokenizer.json.

A GGUF's `tokenizer.ggml.model` picks the kind: "llama" (SentencePiece, Gemma's) or
"gpt2" (byte-level BPE: SmolLM2, Llama 3, Qwen), whose pre-tokenizer is named by
`tokenizer.ggml.pre`. The chat format and its default system text come from the
file's own chat template (`tokenizer.chat_template` / tokenizer_config.json's
`chat_template`), else from which turn tokens the vocabulary has.
"""

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import regex

from rlpost import errors
from rlpost.text import bpe, chat_formats, chat_template
from rlpost.text import tokenizer as tokenizer_lib

_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types


def from_gguf_metadata(
  metadata: Mapping[str, Any], source: str = "GGUF"
) -> tokenizer_lib.Tokenizer:
  """The Tokenizer of a GGUF's metadata (SentencePiece or byte-level BPE)."""
  model = metadata.get("tokenizer.ggml.model")
  if model == "llama":
    return tokenizer_lib.tokenizer_from_gguf_metadata(metadata, source)
  if model != "gpt2":
    raise errors.DataError(
      f"{source}: tokenizer.ggml.model is {model!r}; supported: 'llama' (SentencePiece, "
      "Gemma) and 'gpt2' (byte-level BPE: SmolLM2, Llama 3, Qwen)"
    )
  keys = ("tokens", "token_type", "merges", "eos_token_id")
  missing = [f"tokenizer.ggml.{k}" for k in keys if f"tokenizer.ggml.{k}" not in metadata]
  if missing:
    raise errors.DataError(f"{source}: tokenizer metadata lacks {missing}")
  tokens = list(metadata["tokenizer.ggml.tokens"])
  pre = metadata.get("tokenizer.ggml.pre", "gpt2")
  try:
    patterns = bpe.pre_tokenizer(pre)
  except ValueError as e:
    raise errors.DataError(f"{source}: tokenizer.ggml.pre: {e}") from None
  try:
    processor = bpe.ByteBPE(
      tokens, metadata["tokenizer.ggml.merges"], patterns, pre in bpe.IGNORES_MERGES
    )
  except (ValueError, TypeError) as e:
    raise errors.DataError(f"{source}: tokenizer.ggml.merges: {e}") from None
  types = metadata["tokenizer.ggml.token_type"].tolist()
  specials = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k in (_CONTROL, _USER_DEFINED)}
  eos = int(metadata["tokenizer.ggml.eos_token_id"])
  return _bpe_tokenizer(
    processor,
    specials,
    bos=int(metadata.get("tokenizer.ggml.bos_token_id", eos)),
    eos=eos,
    pad=int(metadata.get("tokenizer.ggml.padding_token_id", eos)),
    uses_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
    template=metadata.get("tokenizer.chat_template", ""),
    source=source,
  )


def _bpe_tokenizer(processor, specials, *, bos, eos, pad, uses_bos, template, source):
  chat = chat_formats.detect(template or "") or next(
    (
      name
      for name, fmt in chat_formats.FORMATS.items()
      if fmt.open_text in specials and fmt.close_text in specials
    ),
    None,
  )
  if chat is None:
    raise errors.DataError(
      f"{source}: neither the chat template nor the vocabulary shows a chat format "
      f"(the turn tokens of one of {chat_formats.NAMES}); it is not a chat model"
    )
  fmt = chat_formats.get(chat)
  return tokenizer_lib.Tokenizer(
    processor,
    bos_id=bos,
    eos_id=eos,
    pad_id=pad,
    start_of_turn_id=specials[fmt.open_text],
    end_of_turn_id=specials[fmt.close_text],
    vocab_size=processor.piece_size(),
    special_tokens=specials,
    chat=chat,
    uses_bos=uses_bos,
    default_system=chat_formats.default_system(template or "", chat),
    system_preamble=chat_formats.system_preamble(template or "", chat),
    chat_template=template or "",
  )


def _json_object(path: pathlib.Path) -> dict[str, Any]:
  """The JSON object in `path`; DataError naming the file when it is not one."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.DataError(f"{path}: not valid JSON ({e}); download or copy it again") from e
  if not isinstance(value, dict):
    raise errors.DataError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


def _hf_patterns(pre: Mapping[str, Any] | None, source: str) -> tuple[str, ...]:
  """Regexes of a tokenizer.json pre_tokenizer: Split patterns, Digits, ByteLevel."""
  if not pre:
    return ()
  kind = pre.get("type")
  if kind == "Sequence":
    return tuple(p for step in pre.get("pretokenizers", []) for p in _hf_patterns(step, source))
  if kind == "Split" and "Regex" in pre.get("pattern", {}):
    return (pre["pattern"]["Regex"],)
  if kind == "Digits":
    return (r"\p{N}",) if pre.get("individual_digits") else (r"\p{N}+",)
  if kind == "ByteLevel":
    return bpe.pre_tokenizer("gpt2") if pre.get("use_regex", True) else ()
  raise errors.DataError(f"{source}: pre_tokenizer {kind!r} is not supported")


def from_hf_directory(directory: str | os.PathLike) -> tokenizer_lib.Tokenizer:
  """The byte-level BPE Tokenizer of a Hugging Face directory (tokenizer.json and
  tokenizer_config.json)."""
  directory = pathlib.Path(directory)
  path = directory / "tokenizer.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: the checkpoint directory has no tokenizer")
  spec = _json_object(path)
  config_path = directory / "tokenizer_config.json"
  config = _json_object(config_path) if config_path.is_file() else {}
  model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
  if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
    raise errors.DataError(f"{path}: model type {model.get('type')!r}; only BPE is supported")
  added = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])}
  size = max([*model["vocab"].values(), *added.values()]) + 1
  tokens = [""] * size
  for piece, i in {**model["vocab"], **added}.items():
    tokens[i] = piece
  try:
    processor = bpe.ByteBPE(
      tokens,
      model.get("merges", []),
      _hf_patterns(spec.get("pre_tokenizer"), str(path)),
      bool(model.get("ignore_merges", False)),
    )
  except (ValueError, TypeError, regex.error) as e:
    raise errors.DataError(f"{path}: {e}") from None

  def token_id(key: str, default=None):
    value = config.get(key)
    text = value.get("content") if isinstance(value, dict) else value
    return added.get(text, model["vocab"].get(text, default)) if text else default

  eos = token_id("eos_token")
  if eos is None:
    raise errors.DataError(f"{config_path}: no eos_token")
  template = chat_template.hf_directory_text(directory)
  return _bpe_tokenizer(
    processor,
    added,
    bos=token_id("bos_token", eos),
    eos=eos,
    pad=token_id("pad_token", eos),
    uses_bos=bool(config.get("add_bos_token", False)),
    template=template,
    source=str(path),
  )
