"""Byte-level BPE (GPT-2 style), the tokenizer of SmolLM2, Llama 3 and Qwen.

Encoding: the text is split into pre-tokens by the vocabulary's pre-tokenizer regex
(`PRE_TOKENIZERS`, named as llama.cpp names them in `tokenizer.ggml.pre`); each
pre-token's UTF-8 bytes are written as printable characters (`byte_chars`: the bytes
that are printable Latin-1 stand for themselves, the others for chr(256 + n)) and
merged pairwise, the pair of lowest merge rank first, until no listed merge applies;
the pieces are looked up in the vocabulary. With `ignore_merges` (Llama 3) a
pre-token that is itself in the vocabulary is that one id. Decoding joins the pieces
and maps the characters back to bytes.

Special tokens are not this module's business: `rlpost.text.tokenizer.Tokenizer`
splits them out of the text first, as Hugging Face and llama.cpp do.
"""

import functools
from collections.abc import Iterable, Sequence

import regex

_CONTRACTIONS = r"'s|'t|'re|'ve|'m|'ll|'d"
_CONTRACTIONS_ANY_CASE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
# pre-tokenizer name -> the regexes applied in turn (each splits the pieces of the last).
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
  # GPT-2's split; SmolLM2 first isolates every digit (HF: Digits(individual_digits)).
  "gpt2": (rf"{_CONTRACTIONS}| ?\p{{L}}+| ?\p{{N}}+| ?[^\s\p{{L}}\p{{N}}]+|\s+(?!\S)|\s+",),
  "smollm": (
    r"\p{N}",
    rf"{_CONTRACTIONS}| ?\p{{L}}+| ?\p{{N}}+| ?[^\s\p{{L}}\p{{N}}]+|\s+(?!\S)|\s+",
  ),
  # Llama 3: numbers in runs of up to three digits.
  "llama-bpe": (
    rf"{_CONTRACTIONS_ANY_CASE}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
  ),
  # Qwen2 / Qwen2.5 / Qwen3: every digit alone.
  "qwen2": (
    rf"{_CONTRACTIONS_ANY_CASE}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
  ),
}
IGNORES_MERGES = ("llama-bpe",)


@functools.cache
def byte_chars() -> tuple[str, ...]:
  """GPT-2's printable stand-in character for each byte 0..255."""
  printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return tuple(chars[b] for b in range(256))


def split(text: str, patterns: tuple[str, ...]) -> list[str]:
  """The pre-tokens of `text` under the pre-tokenizer `patterns` (each splits the pieces
  of the last; their concatenation is `text`)."""
  pieces = [text]
  for pattern in _compiled(patterns):
    pieces = [part for piece in pieces for part in _split_one(pattern, piece)]
  return pieces


def _split_one(pattern, text: str) -> list[str]:
  """Matches of `pattern` and the text between them, in order (nothing dropped)."""
  parts, pos = [], 0
  for m in pattern.finditer(text):
    if m.start() > pos:
      parts.append(text[pos : m.start()])
    if m.end() > m.start():
      parts.append(m.group())
    pos = m.end()
  if pos < len(text):
    parts.append(text[pos:])
  return parts


@functools.cache
def _compiled(patterns: tuple[str, ...]):
  return tuple(regex.compile(p) for p in patterns)


def pre_tokenizer(name: str) -> tuple[str, ...]:
  """The patterns of a named pre-tokenizer; ValueError listing the supported names."""
  if name not in PRE_TOKENIZERS:
    raise ValueError(
      f"pre-tokenizer {name!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}"
    )
  return PRE_TOKENIZERS[name]


class ByteBPE:
  """A byte-level BPE vocabulary: `encode(text) -> ids`, `decode(ids) -> text`.

  Args:
    tokens: the vocabulary, id -> piece (in `byte_chars` form).
    merges: "left right" strings or [left, right] pairs, highest priority first.
    patterns: the pre-tokenizer's regexes (`pre_tokenizer(name)`).
    ignore_merges: a pre-token found whole in the vocabulary is that id.
  """

  def __init__(
    self,
    tokens: Sequence[str],
    merges: Iterable[str],
    patterns: tuple[str, ...],
    ignore_merges: bool = False,
  ):
    _compiled(tuple(patterns))  # a bad regex fails here
    self.patterns = tuple(patterns)
    self.ignore_merges = ignore_merges
    self.ids = {piece: i for i, piece in enumerate(tokens)}
    self.pieces = list(tokens)
    self.ranks = {}
    for rank, merge in enumerate(merges):
      pair = merge.partition(" ")[::2] if isinstance(merge, str) else tuple(merge)
      left, right = pair if len(pair) == 2 else ("", "")
      if not left or not right:
        raise ValueError(f"merge {rank} is {merge!r}, not 'left right'")
      self.ranks.setdefault((left, right), rank)
    self._byte_char = byte_chars()
    self._char_byte = {c: b for b, c in enumerate(self._byte_char)}
    self._word_ids = functools.lru_cache(maxsize=1 << 16)(self._word)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no special-token handling)."""
    ids = []
    for piece in split(text, self.patterns):
      ids.extend(self._word_ids(piece))
    return ids

  def _word(self, piece: str) -> tuple[int, ...]:
    word = "".join(self._byte_char[b] for b in piece.encode("utf-8"))
    if self.ignore_merges and word in self.ids:
      return (self.ids[word],)
    parts = list(word)
    while len(parts) > 1:
      ranked = [(self.ranks.get(pair, None), i) for i, pair in enumerate(zip(parts, parts[1:]))]
      ranked = [(r, i) for r, i in ranked if r is not None]
      if not ranked:
        break
      best = min(ranked)[0]
      merged, i = [], 0
      while i < len(parts):
        if i + 1 < len(parts) and self.ranks.get((parts[i], parts[i + 1])) == best:
          merged.append(parts[i] + parts[i + 1])
          i += 2
        else:
          merged.append(parts[i])
          i += 1
      parts = merged
    missing = [p for p in parts if p not in self.ids]
    if missing:
      raise ValueError(f"pieces {missing} of {piece!r} are not in the vocabulary")
    return tuple(self.ids[p] for p in parts)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; an incomplete UTF-8 sequence becomes U+FFFD."""
    chars = "".join(self.pieces[i] for i in ids)
    data = bytes(self._char_byte[c] for c in chars if c in self._char_byte)
    return data.decode("utf-8", errors="replace")

  def piece_size(self) -> int:
    return len(self.pieces)
