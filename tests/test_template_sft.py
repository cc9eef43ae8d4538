"""rlpost.data.template_sft: SFT examples laid out by the model's chat template, the loss on
each assistant message's span (content, calls, end of turn) only. Expected texts are
transformers' renderings (the committed fixtures, tests/fixtures/chat_templates)."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_template_turns import FIXTURES, _setup

from rlpost import errors
from rlpost.data import chat, template_sft
from rlpost.text import chat_template


def _fixture(name: str, case: str):
  fix = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
  found = next(c for c in fix["cases"] if c["name"] == case)
  record = {"messages": found["messages"]}
  if found["tools"]:
    record["tools"] = fix["tools"]
  return record, found.get("text")


def _runs(tok, ids, mask) -> list[str]:
  """The decoded runs of masked tokens, control tokens written as text."""
  runs, edges = [], np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
  for start, end in zip(edges[0::2], edges[1::2]):
    runs.append(tok.decode(ids[start:end], skip_special=False))
  return runs


REPLY = ["Hello. How can I help?", "ok"]
CALL_ARGS = '{"location": "Zürich", "unit": "celsius"}'
ANSWER = "It is 21 °C and clear."
# What each template writes for the assistant messages of the fixtures' multi_turn and
# tool_call_result cases, read off transformers' renderings in the fixtures.
EXPECTED = {
  ("qwen2_5", "multi_turn"): [f"{r}<|im_end|>" for r in REPLY],
  ("qwen2_5", "tool_call_result"): [
    f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_ARGS}}}\n</tool_call><|im_end|>',
    f"{ANSWER}<|im_end|>",
  ],
  ("qwen3", "multi_turn"): [
    "Hello. How can I help?<|im_end|>",
    "<think>\n\n</think>\n\nok<|im_end|>",
  ],
  ("qwen3", "tool_call_result"): [
    f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_ARGS}}}\n</tool_call><|im_end|>',
    f"<think>\n\n</think>\n\n{ANSWER}<|im_end|>",
  ],
  ("qwen3", "reasoning_field"): ["<think>\n2+2=4\n</think>\n\nIt is 4.<|im_end|>"],
  ("smollm2", "multi_turn"): [f"{r}<|im_end|>" for r in REPLY],
  ("gemma3_it", "multi_turn"): [f"{r}<end_of_turn>" for r in REPLY],
  ("llama3_1", "multi_turn"): [f"{r}<|eot_id|>" for r in REPLY],
  ("llama3_1", "tool_call_result"): [
    f'{{"name": "get_weather", "parameters": {CALL_ARGS}}}<|eot_id|>',
    f"{ANSWER}<|eot_id|>",
  ],
  ("mistral_nemo", "multi_turn"): [f"{r}</s>" for r in REPLY],
  ("hermes", "tool_call_result"): [
    f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_ARGS}}}\n</tool_call><|im_end|>',
    f"{ANSWER}<|im_end|>",
  ],
  ("mistral_nemo", "tool_call_result"): [
    f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {CALL_ARGS}, "id": "call12345"}}]</s>',
    f"{ANSWER}</s>",
  ],
}


@pytest.mark.parametrize("name, case", sorted(EXPECTED))
def test_the_loss_covers_exactly_the_assistant_turns_as_the_template_writes_them(name, case):
  """The tokens decode to transformers' rendering; the masked runs are the assistant turns
  (content or calls, end of turn), nothing of the system, user or tool messages. Qwen3
  re-renders history (the empty <think> block only on the last turn): located in the final
  rendering; Mistral-Nemo (its system text moves) and Hermes (a look-ahead after tool
  results) found by the probe. Mutations: `mask + [flag]` -> `mask + [1]` (everything
  trained), the located span's `text.find(eot, start)` -> `text.find(eot)` (an earlier
  close ends the span), the probe left unchanged, `_reasoning` returning {} (Qwen3's
  reasoning field dropped)."""
  layout, tok = _setup(name)
  record, rendered = _fixture(name, case)
  ids, mask = template_sft.tokenize(chat.sft_record(record), tok, layout, max_len=10_000)
  assert tok.decode(ids, skip_special=False) == rendered
  assert _runs(tok, ids, mask) == EXPECTED[name, case]
  assert all(text in rendered for text in EXPECTED[name, case])


def test_json_string_arguments_render_as_the_object_openai_sends_as_text():
  """OpenAI sends `arguments` as JSON text: parsed, the template writes the object (not a
  quoted string), the same tokens as the object form. Mutation: `_arguments` returning the
  string unparsed."""
  layout, tok = _setup("qwen2_5")
  record, _ = _fixture("qwen2_5", "tool_call_result")
  as_text = json.loads(json.dumps(record))
  call = as_text["messages"][1]["tool_calls"][0]["function"]
  call["arguments"] = json.dumps(call["arguments"], ensure_ascii=False)
  want = template_sft.tokenize(chat.sft_record(record), tok, layout, 10_000)
  got = template_sft.tokenize(chat.sft_record(as_text), tok, layout, 10_000)
  assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_a_template_rewriting_earlier_turns_is_refused_naming_the_message():
  """Mistral-Nemo moves its system text and tool list to the last user message and writes
  no content beside tool calls: with a second user turn, the first assistant's calls can be
  found no way; the error names the template and messages[2]. Mutation: `_probed_span`'s
  `floor <= start < len(text) and end >= 0` -> `floor <= start <= len(text)` (a span past
  the end)."""
  layout, tok = _setup("mistral_nemo")
  record, _ = _fixture("mistral_nemo", "tool_call_result")
  messages = [{"role": "system", "content": "Be brief."}, *record["messages"]]
  messages += [{"role": "user", "content": "And tomorrow?"}, {"role": "assistant", "content": "?"}]
  with pytest.raises(chat_template.ChatTemplateError, match=r"mistral_nemo: messages\[2\]"):
    template_sft.tokenize(chat.sft_record({**record, "messages": messages}), tok, layout, 10**5)


def test_truncation_keeps_the_first_tokens_and_refuses_a_prompt_filling_max_len():
  layout, tok = _setup("qwen2_5")
  record, _ = _fixture("qwen2_5", "multi_turn")
  ids, mask = template_sft.tokenize(chat.sft_record(record), tok, layout, 10_000)
  first = int(np.argmax(mask))
  cut = template_sft.tokenize(chat.sft_record(record), tok, layout, first + 3)
  assert np.array_equal(cut[0], ids[: first + 3]) and cut[1].sum() == 3
  with pytest.raises(ValueError, match=f"prompt is {first} tokens.*max_len={first}"):
    template_sft.tokenize(chat.sft_record(record), tok, layout, first)


def test_the_hand_written_layout_refuses_tool_calls_saying_to_give_a_template():
  record, _ = _fixture("qwen2_5", "tool_call_result")
  _, tok = _setup("qwen2_5")
  with pytest.raises(errors.DataError, match="data.layout=template.*model.chat_template"):
    chat.tokenize_sft(chat.sft_record(record), tok, 512)


# ---------------------------------------------------------------- random conversations

CONTROL_TEXT = ["<|im_end|>", "<|im_start|>", "<end_of_turn>", "<|eot_id|>", "[INST]", "</s>"]
_WORD = st.text(alphabet="abcxyz 0123456789.,!?é€\n", min_size=1, max_size=12)
_PIECE = st.one_of(_WORD, st.sampled_from(CONTROL_TEXT))
_USER = st.lists(_PIECE, min_size=1, max_size=5).map("".join).filter(lambda s: s.strip() == s)
_REPLY = _WORD.map(lambda s: s.strip() or "a")
# Templates whose span for a plain assistant message is its content and the end of turn.
PLAIN = {
  "qwen2_5": "<|im_end|>",
  "smollm2": "<|im_end|>",
  "gemma3_it": "<end_of_turn>",
  "llama3_1": "<|eot_id|>",
  "mistral_nemo": "</s>",
}


@settings(max_examples=60, deadline=None)
@given(
  name=st.sampled_from(sorted(PLAIN)),
  turns=st.lists(st.tuples(_USER, _REPLY), min_size=1, max_size=4),
  system=st.one_of(st.none(), _USER),
)
def test_random_conversations_train_on_the_replies_and_keep_user_control_text_as_text(
  name, turns, system
):
  """Random alternating conversations, user texts holding control-token text: the masked
  runs are exactly each reply and its end of turn; every control id in the tokens is one
  the template wrote (the user texts' control text stayed text: the count equals that of
  the same conversation with it removed). Mutation: `marked_inputs(tokenizer, messages,
  tools)` -> `(messages, tools)` in `assistant_spans` (user control text becomes ids)."""
  layout, tok = _setup(name)
  messages = [{"role": "system", "content": system}] if system is not None else []
  for user, reply in turns:
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
  ids, mask = template_sft.tokenize({"messages": messages}, tok, layout, 100_000)
  assert _runs(tok, ids, mask) == [reply + PLAIN[name] for _, reply in turns]
  cleaned = [
    {**m, "content": re.sub("|".join(map(re.escape, CONTROL_TEXT)), "", m["content"])}
    if m["role"] != "assistant"
    else m
    for m in messages
  ]
  cleaned_ids, _ = template_sft.tokenize({"messages": cleaned}, tok, layout, 100_000)
  control = set(tok.special_tokens.values())
  assert sum(i in control for i in ids) == sum(i in control for i in cleaned_ids)
