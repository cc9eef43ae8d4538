"""Tokenizers: Gemma 3 SentencePiece rebuilt from a GGUF vocabulary, byte-level BPE
(SmolLM2, Llama 3, Qwen: `rlpost.text.bpe`) from GGUF metadata or a Hugging Face
`tokenizer.json`, a byte tokenizer for tiny test models, and the Gemma chat text.

Special tokens: control-token text written in a string (`<start_of_turn>`,
`<end_of_turn>`, `<bos>`, ...) becomes its single id when `parse_special=True`
(the default), as Hugging Face and llama.cpp do; with `parse_special=False` it
is tokenized as plain text. Decoding drops control tokens by default
(`skip_special=True`) and writes them back as their text otherwise, so
`decode(encode(s, add_bos=False), skip_special=False) == s`, except that in the Gemma
tokenizer U+2581 (SentencePiece's space symbol) is a space: it encodes as " " does and
decodes as " ", as in SentencePiece itself, transformers and llama.cpp.

Where this differs from Hugging Face transformers' Gemma tokenizer (transformers
5.24 loading the same GGUF, ~1000 test strings; all others gave the same ids):
- Runs of 32 or more spaces. The vocabulary's space-run pieces (2 to 31
  spaces, ids 138-167) are user-defined pieces, which SentencePiece matches
  longest first, as llama.cpp does: 32 spaces are 31 + 1, 40 are 31 + 9.
  transformers builds BPE merges for them and splits 32 as 16 + 16, 40 as
  16 + 24 (llama.cpp PR 8228 notes the same for Gemma). Shorter runs, and
  newline and tab runs of any length, tokenize identically.
- Decoding an incomplete UTF-8 byte sequence (a cut byte-fallback character)
  keeps the valid characters around it and writes one U+FFFD per invalid
  sequence; transformers writes one U+FFFD per byte of the whole byte run.
"""

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

from rlpost.text import chat_formats

START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
_ROLES = {"user": "user", "assistant": "model", "model": "model"}
_BYTE_OFFSET = 5  # byte tokenizer: ids 0..4 are special, byte b is id b + 5
_PIECE = sp_pb2.ModelProto.SentencePiece
_GGUF_TYPES = {
  1: _PIECE.NORMAL,
  2: _PIECE.UNKNOWN,
  3: _PIECE.CONTROL,
  4: _PIECE.USER_DEFINED,
  5: _PIECE.UNUSED,
  6: _PIECE.BYTE,
}


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
  """A tokenizer and its special ids (hashable by identity).

  Attributes:
    processor: the SentencePieceProcessor or `bpe.ByteBPE` (anything with
      `encode(text) -> ids` and `decode(ids) -> text`), or None for the byte tokenizer.
    bos_id, eos_id, pad_id: special ids.
    start_of_turn_id, end_of_turn_id: the chat format's turn opening and closing
      control ids (`<start_of_turn>` / `<end_of_turn>`, `<|im_start|>` / `<|im_end|>`,
      `<|start_header_id|>` / `<|eot_id|>`); the closing one ends a model's turn.
    vocab_size: number of ids the tokenizer knows (a model may have more rows).
    special_tokens: control-token text -> id, parsed from text on request.
    chat: the chat format (`rlpost.text.chat_formats`): gemma, chatml or llama3.
    uses_bos: prompts start with BOS (SmolLM2's and Qwen's do not).
    default_system: the system text the model's chat template writes when a
      conversation has none (chatml), or None.
    system_preamble: text the chat template writes at the top of every system turn,
      which it then always writes (Llama 3.1+'s knowledge and date lines), or "".
    chat_template: the model file's Jinja chat template (GGUF `tokenizer.chat_template`,
      a HF directory's; `rlpost.text.chat_template` renders it), or "" when it has none.
  """

  processor: Any
  bos_id: int
  eos_id: int
  pad_id: int
  start_of_turn_id: int
  end_of_turn_id: int
  vocab_size: int
  special_tokens: Mapping[str, int] = dataclasses.field(repr=False)
  chat: str = "gemma"
  uses_bos: bool = True
  default_system: str | None = None
  system_preamble: str = ""
  chat_template: str = dataclasses.field(default="", repr=False)

  @functools.cached_property
  def _special_re(self) -> re.Pattern:
    alternatives = sorted(self.special_tokens, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, alternatives)))

  @functools.cached_property
  def _special_text(self) -> dict[int, str]:
    return {i: s for s, i in self.special_tokens.items()}

  def _encode_plain(self, text: str) -> list[int]:
    if not text:
      return []
    if self.processor is None:
      return [b + _BYTE_OFFSET for b in text.encode("utf-8")]
    return self.processor.encode(text)

  def _decode_plain(self, ids: list[int]) -> str:
    if self.processor is None:
      return bytes(i - _BYTE_OFFSET for i in ids).decode("utf-8", errors="replace")
    return self.processor.decode(ids)

  def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids of `text`, BOS first if `add_bos` and the tokenizer `uses_bos`; see the
    module doc for specials."""
    ids = [self.bos_id] if add_bos and self.uses_bos else []
    if not parse_special:
      return ids + self._encode_plain(text)
    pos = 0
    for match in self._special_re.finditer(text):
      ids += self._encode_plain(text[pos : match.start()])
      ids.append(self.special_tokens[match.group()])
      pos = match.end()
    return ids + self._encode_plain(text[pos:])

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    """Text of `ids` (list or int array).

    Control tokens (pad, bos, eos, turn markers, ...) are dropped when
    `skip_special`, else written as their text. Ids >= vocab_size (extra rows
    of a model's embedding) are dropped; negative ids raise ValueError.
    """
    pieces, run = [], []
    for i in map(int, ids):
      if i < 0:
        raise ValueError(f"decode got token id {i}; ids must be >= 0")
      if i >= self.vocab_size:
        continue
      if i in self._special_text:
        if not skip_special:
          pieces += [self._decode_plain(run), self._special_text[i]]
          run = []
        continue
      run.append(i)
    return "".join(pieces) + self._decode_plain(run)


# chat format -> the byte tokenizer's five special ids' texts
_BYTE_SPECIALS = {
  "gemma": ("<pad>", "<eos>", "<bos>", START_OF_TURN, END_OF_TURN),
  "chatml": ("<pad>", "<|endoftext|>", "<bos>", "<|im_start|>", "<|im_end|>"),
  # Llama 3 needs three turn tokens: its turn close <|eot_id|> is the EOS id here.
  "llama3": (
    "<pad>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
  ),
}


def byte_tokenizer(chat: str = "gemma") -> Tokenizer:
  """UTF-8 byte tokenizer for tiny test models: 0 pad, 1 eos, 2 bos, 3 and 4 the chat
  format's turn tokens (gemma: <start_of_turn>, <end_of_turn>), byte b -> 5 + b;
  vocab_size 261."""
  if chat not in _BYTE_SPECIALS:
    raise ValueError(f"byte_tokenizer(chat={chat!r}): use one of {sorted(_BYTE_SPECIALS)}")
  texts = _BYTE_SPECIALS[chat]
  return Tokenizer(
    None,
    bos_id=2,
    eos_id=1,
    pad_id=0,
    start_of_turn_id=3,
    end_of_turn_id=1 if chat == "llama3" else 4,
    vocab_size=_BYTE_OFFSET + 256,
    special_tokens={t: i for i, t in enumerate(texts)},
    chat=chat,
  )


def chat_messages(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
  """Gemma chat text (no BOS; `encode` adds it) for alternating user/model turns.

  Roles: "user", "assistant" (or "model"), and "system" only as the first
  message: Gemma has no system role, so its text plus "\\n\\n" is prepended to
  the first user turn. Each turn is
  `<start_of_turn>{role}\\n{content}<end_of_turn>\\n`; `add_generation_prompt`
  appends `<start_of_turn>model\\n`.

  Contents are used verbatim, as `rlpost.text.scaffold` and `rlpost.data.chat`
  encode them, so prompts built here and there tokenize identically. HF's
  Gemma 3 chat template instead strips each user and model content (Jinja
  `trim`; the system text is not stripped): a content with leading or
  trailing whitespace renders differently from `apply_chat_template`. Strip
  contents before calling this to reproduce that template exactly.
  """
  turns = list(messages)
  for k, m in enumerate(turns):
    if not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
      raise ValueError(f"messages[{k}] = {m!r} needs string 'role' and 'content'")
  system = turns.pop(0)["content"] if turns and turns[0]["role"] == "system" else None
  if system is not None and not turns:
    raise ValueError("a system message must be followed by a user message")
  parts = []
  for k, m in enumerate(turns):
    want = "user" if k % 2 == 0 else "model"
    if _ROLES.get(m["role"]) != want:
      raise ValueError(
        f"message {k + (system is not None)} has role {m['role']!r}, "
        f"expected {want!r}: roles must alternate user/assistant starting "
        "with user; 'system' may only come first"
      )
    content = m["content"] if k or system is None else f"{system}\n\n{m['content']}"
    parts.append(f"{START_OF_TURN}{want}\n{content}{END_OF_TURN}\n")
  if add_generation_prompt:
    parts.append(f"{START_OF_TURN}model\n")
  return "".join(parts)


def chat_prompt(user_text: str, *, system: str | None = None) -> str:
  """Single-turn Gemma prompt ending with `<start_of_turn>model\\n` (no BOS)."""
  return chat_formats.prompt_text("gemma", user_text, system)


def _model_proto(metadata: Mapping[str, Any], source: str) -> sp_pb2.ModelProto:
  """SentencePiece BPE ModelProto from GGUF `tokenizer.ggml.*` metadata."""
  tokens = metadata["tokenizer.ggml.tokens"]
  scores = metadata["tokenizer.ggml.scores"].tolist()
  types = metadata["tokenizer.ggml.token_type"].tolist()
  unk = int(metadata.get("tokenizer.ggml.unknown_token_id", 3))
  proto = sp_pb2.ModelProto()
  for i, (token, score, kind) in enumerate(zip(tokens, scores, types)):
    piece = proto.pieces.add()
    # The GGUF stores whitespace-run pieces with literal spaces ("  " is id 138)
    # but SentencePiece escapes spaces as U+2581.
    piece.piece = token.replace(" ", "\u2581")
    piece.score = score
    piece.type = _PIECE.UNKNOWN if i == unk else _GGUF_TYPES[kind]
  spec = proto.trainer_spec
  spec.model_type = sp_pb2.TrainerSpec.BPE
  spec.vocab_size = len(tokens)
  spec.byte_fallback = True
  spec.allow_whitespace_only_pieces = True
  for name in ("unk", "bos", "eos", "pad"):
    key = {"unk": "unknown", "pad": "padding"}.get(name, name)
    idx = int(metadata.get(f"tokenizer.ggml.{key}_token_id", -1))
    setattr(spec, f"{name}_id", idx)
    if idx >= 0:
      setattr(spec, f"{name}_piece", tokens[idx])
  norm = proto.normalizer_spec
  norm.name = "identity"
  norm.add_dummy_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
  norm.remove_extra_whitespaces = False
  norm.escape_whitespaces = True
  return proto


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any], source: str = "GGUF") -> Tokenizer:
  """Builds the Tokenizer from a GGUF's `tokenizer.ggml.*` metadata."""
  model = metadata.get("tokenizer.ggml.model")
  if model != "llama":
    raise ValueError(
      f"{source}: tokenizer.ggml.model is {model!r}; only SentencePiece "
      "vocabularies ('llama', as in Gemma GGUFs) are supported"
    )
  keys = ("tokens", "scores", "token_type", "bos_token_id", "eos_token_id", "padding_token_id")
  missing = [f"tokenizer.ggml.{k}" for k in keys if f"tokenizer.ggml.{k}" not in metadata]
  if missing:
    raise ValueError(f"{source}: tokenizer metadata lacks {missing}")
  proto = _model_proto(metadata, source)
  processor = spm.SentencePieceProcessor()
  processor.LoadFromSerializedProto(proto.SerializeToString())
  specials = {
    p.piece: i for i, p in enumerate(proto.pieces) if p.type in (_PIECE.CONTROL, _PIECE.UNKNOWN)
  }
  turns = [specials.get(s) for s in (START_OF_TURN, END_OF_TURN)]
  if None in turns:
    raise ValueError(
      f"{source}: the vocabulary has no {START_OF_TURN} / {END_OF_TURN} "
      "control tokens; is this a Gemma tokenizer?"
    )
  return Tokenizer(
    processor,
    bos_id=int(metadata["tokenizer.ggml.bos_token_id"]),
    eos_id=int(metadata["tokenizer.ggml.eos_token_id"]),
    pad_id=int(metadata["tokenizer.ggml.padding_token_id"]),
    start_of_turn_id=turns[0],
    end_of_turn_id=turns[1],
    vocab_size=processor.get_piece_size(),
    special_tokens=specials,
    chat_template=str(metadata.get("tokenizer.chat_template", "")),
  )
