"""Tests for rlpost.text.tokenizer against the reference ids in ../shared."""

import json
import re
import time

from hypothesis import given, settings, strategies as hst
import numpy as np
import pytest

from rlpost.text import tokenizer as tok_lib
from rlpost.models import loading
from rlpost.models.weights import packaged
from conftest import FIXTURES, require_shared, skip_or_fail


@pytest.fixture(scope="module")
def tok():
  try:
    return loading.load_gguf_tokenizer()
  except ImportError as e:
    skip_or_fail(str(e))


def fixture_strings():
  path = require_shared(FIXTURES / "tokenization.json")
  return json.loads(path.read_text())["strings"]


@pytest.mark.real_model
def test_special_ids(tok):
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (2, 1, 0)
  assert (tok.start_of_turn_id, tok.end_of_turn_id) == (105, 106)
  assert tok.vocab_size == 262144


@pytest.mark.real_model
def test_every_reference_string_matches_hf_ids(tok):
  strings = fixture_strings()
  assert len(strings) == 41
  mismatches = []
  for s in strings:
    got = {
      "hf_bos": tok.encode(s["text"]),
      "hf_nobos": tok.encode(s["text"], add_bos=False),
      "hf_nobos_literal": tok.encode(s["text"], add_bos=False, parse_special=False),
    }
    mismatches += [(s["id"], k, v, s[k]) for k, v in got.items() if v != s[k]]
  assert not mismatches


@pytest.mark.real_model
def test_decode_round_trips_reference_strings(tok):
  specials = re.compile("|".join(map(re.escape, tok.special_tokens)))
  for s in fixture_strings():
    text = s["text"]
    assert tok.decode(s["hf_nobos"], skip_special=False) == text, s["id"]
    assert tok.decode(s["hf_nobos_literal"]) == text, s["id"]
    assert tok.decode(s["hf_bos"]) == specials.sub("", text), s["id"]
    assert tok.decode(np.asarray(s["hf_bos"], np.int32)) == specials.sub("", text)


@pytest.mark.real_model
def test_prompt_input_ids_match_manifest_text(tok):
  manifest = json.loads(require_shared(FIXTURES / "manifest.json").read_text())
  kinds = set()
  for prompt in manifest["prompts"]:
    ids = np.load(FIXTURES / prompt["files"][0])["input_ids"]
    assert tok.encode(prompt["text"]) == ids.tolist(), prompt["id"]
    assert len(ids) == prompt["n_tokens"]
    kinds.add(prompt["kind"])
  assert "chat" in kinds  # chat prompts are stored as text with control strings


@pytest.mark.real_model
def test_chat_prompt_gives_reference_ids(tok):
  ids = np.load(require_shared(FIXTURES / "prompts" / "chat_simple.npz"))["input_ids"]
  assert tok.encode(tok_lib.chat_prompt("What is 2+2?")) == ids.tolist()
  assert ids[1] == tok.start_of_turn_id and tok.end_of_turn_id in ids


@pytest.mark.real_model
def test_whitespace_runs_use_their_own_pieces(tok):
  assert tok.encode(" ", add_bos=False) == [236743]
  assert tok.encode("  ", add_bos=False) == [138]
  assert tok.encode("   ", add_bos=False) == [139]
  assert tok.encode("\n\n", add_bos=False) == [108]


@pytest.mark.real_model
def test_long_space_runs_take_the_longest_piece_first(tok):
  """Space runs longer than the longest space piece (31 spaces, id 167; n spaces
  is id 136 + n for n in 2..31) split longest piece first, as SentencePiece
  matches user-defined pieces and as llama.cpp does: 32 = 31 + 1, 40 = 31 + 9.
  (transformers' BPE merges give 16 + 16 and 16 + 24 instead: module doc.)

  Mutation: the whitespace pieces typed NORMAL instead of USER_DEFINED in
  `_model_proto` (BPE merges instead of longest match) splits "x" + 62 spaces
  + "y" as 31 + 30 + " y" and fails here.
  """

  def longest_first(n):
    ids = []
    while n:
      k = min(n, 31)
      ids.append(236743 if k == 1 else 136 + k)  # one space is the plain "\u2581" piece
      n -= k
    return ids

  for n in (2, 31, 32, 33, 40, 62, 63, 100):
    assert tok.encode(" " * n, add_bos=False) == longest_first(n), n
    assert tok.decode(longest_first(n)) == " " * n
  x, y = tok.encode("x", add_bos=False), tok.encode("y", add_bos=False)
  # Between words a leftover single space joins the next word.
  assert tok.encode("x" + " " * 32 + "y", add_bos=False) == x + [167] + tok.encode(
    " y", add_bos=False
  )
  assert tok.encode("x" + " " * 62 + "y", add_bos=False) == x + [167, 167] + y


@pytest.mark.real_model
def test_decode_ignores_ids_past_vocab_and_rejects_negative(tok):
  assert tok.decode([2, 9259, 1902, 262144, 1]) == "Hello world"
  assert tok.decode([9259, 106, 1], skip_special=False) == "Hello<end_of_turn><eos>"
  with pytest.raises(ValueError, match="-1"):
    tok.decode([-1])


@pytest.mark.real_model
@settings(max_examples=60, deadline=None)
@given(text=hst.text(max_size=40))
def test_gguf_tokenizer_round_trips_any_text(tok, text):
  """Any text comes back, with U+2581 (SentencePiece's space symbol) read as the space
  it stands for: SentencePiece, transformers and llama.cpp give it the space's ids."""
  ids = tok.encode(text, add_bos=False, parse_special=False)
  assert all(0 <= i < tok.vocab_size for i in ids)
  spaced = text.replace("\u2581", " ")
  assert ids == tok.encode(spaced, add_bos=False, parse_special=False)
  assert tok.decode(ids) == spaced


@pytest.mark.real_model
def test_gguf_tokenizer_reads_sentencepieces_space_symbol_as_a_space(tok):
  """The case hypothesis found (`text='\u2581'`, decoded as " "), pinned with its
  neighbours: the ids of a space, whatever surrounds it. Mutation caught: `_encode_plain`
  writing U+2581 as another character (its ids then differ from the space's)."""
  for text in ["\u2581", "a\u2581b", "\u2581\u2581x", "x\u2581", " \u2581 \n\u2581"]:
    spaced = text.replace("\u2581", " ")
    ids = tok.encode(text, add_bos=False, parse_special=False)
    assert ids == tok.encode(spaced, add_bos=False, parse_special=False), text
    assert tok.decode(ids) == spaced, text


@pytest.mark.real_model
def test_tokenizer_loads_fast_and_is_cached(tok):
  path = packaged.default_gguf_path()
  start = time.perf_counter()
  fresh = loading._load_cached.__wrapped__(str(path))  # bypass the cache
  elapsed = time.perf_counter() - start
  assert fresh.encode("Hello world") == [2, 9259, 1902]
  assert elapsed < 8.0, f"tokenizer build took {elapsed:.1f}s (about 1.5 s expected)"
  assert loading.load_gguf_tokenizer() is loading.load_gguf_tokenizer(path)


def test_chat_prompt_format():
  assert tok_lib.chat_prompt("Hi") == (
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
  )
  assert tok_lib.chat_prompt("Hi", system="Be brief.") == (
    "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
  )


def test_chat_messages_multi_turn():
  messages = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
  ]
  assert tok_lib.chat_messages(messages) == (
    "<start_of_turn>user\nS\n\nHi<end_of_turn>\n"
    "<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
  )
  assert tok_lib.chat_messages(messages[1:3], add_generation_prompt=False) == (
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
  )


@pytest.mark.parametrize(
  "messages, match",
  [
    ([{"role": "assistant", "content": "x"}], "message 0 has role 'assistant'"),
    (
      [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
      "message 1 has role 'user', expected 'model'",
    ),
    (
      [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
      "'system' may only come first",
    ),
    ([{"role": "system", "content": "s"}], "followed by a user message"),
    ([{"role": "user"}], "needs string 'role' and 'content'"),
  ],
)
def test_chat_messages_errors(messages, match):
  with pytest.raises(ValueError, match=match):
    tok_lib.chat_messages(messages)


def test_byte_tokenizer_ids_and_specials():
  tok = tok_lib.byte_tokenizer()
  assert (
    tok.pad_id,
    tok.eos_id,
    tok.bos_id,
    tok.start_of_turn_id,
    tok.end_of_turn_id,
    tok.vocab_size,
  ) == (0, 1, 2, 3, 4, 261)
  assert tok.encode("A") == [2, 5 + 65]
  prompt = tok_lib.chat_prompt("hi")
  ids = tok.encode(prompt)
  assert ids[:2] == [2, 3] and ids.count(3) == 2 and ids.count(4) == 1
  assert 3 not in tok.encode(prompt, parse_special=False)
  assert tok.decode(ids) == "user\nhi\nmodel\n"
  assert tok.decode(ids, skip_special=False) == "<bos>" + prompt
  assert tok.decode([5 + 104, 5 + 105, 261, 263]) == "hi"  # model rows past 261 dropped


_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<", ">"]
_TEXT_WITH_SPECIALS = hst.lists(hst.one_of(hst.text(max_size=5), hst.sampled_from(_SPECIALS))).map(
  "".join
)


@settings(max_examples=200, deadline=None)
@given(text=_TEXT_WITH_SPECIALS)
def test_byte_tokenizer_round_trip(text):
  tok = tok_lib.byte_tokenizer()
  for parse in (True, False):
    ids = tok.encode(text, add_bos=False, parse_special=parse)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids, skip_special=False) == text
  literal = tok.encode(text, add_bos=False, parse_special=False)
  assert tok.decode(literal) == text
  assert len(literal) == len(text.encode("utf-8"))
