"""rlpost.data.openai_chat: OpenAI-shaped SFT records (tool calls, tool messages, tools)
checked with errors naming the record, the message and the field, and normalized."""

import json
import re

import pytest

from rlpost import errors
from rlpost.data import chat, openai_chat

CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"x": "1+1"}}}
GOOD = [
  {"role": "system", "content": "s"},
  {"role": "user", "content": "u"},
  {"role": "assistant", "content": None, "tool_calls": [CALL]},
  {"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "2"},
  {"role": "assistant", "content": "two"},
]


def _with(k: int, **change) -> dict:
  messages = json.loads(json.dumps(GOOD))
  messages[k].update(change)
  return {"messages": [m for m in messages if m.get("role") != "drop"]}


@pytest.mark.parametrize(
  "record, field",
  [
    ({"messages": []}, "messages"),
    (_with(1, role="bot"), r"messages\[1\].role='bot'"),
    (_with(1, role="system"), r"messages\[1\].role='system'"),
    (_with(2, content=3), r"messages\[2\].content=3"),
    (_with(2, tool_calls=[]), r"messages\[2\].tool_calls=\[\]"),
    (_with(2, tool_calls=[{"function": {"arguments": {}}}]), r"tool_calls\[0\].function.name"),
    (_with(2, tool_calls=[{"function": {"name": "f", "arguments": "{x"}}]), "is not JSON"),
    (_with(2, tool_calls=[{"function": {"name": "f", "arguments": "[1]"}}]), "JSON object"),
    (_with(2, tool_calls=[CALL, CALL]), r"tool_calls\[1\].id='c1'"),
    (_with(3, tool_call_id="c9"), r"messages\[3\].tool_call_id='c9'.*\['c1'\]"),
    (_with(3, name="other"), r"messages\[3\].name='other'"),
    (_with(2, tool_calls=[CALL, {**CALL, "id": "c2"}]), r"messages\[4\].role='assistant'"),
    (_with(3, role="drop"), r"messages\[3\].role='assistant'.*cannot follow"),
    (_with(4, role="drop"), r"messages\[3\].role='tool'.*end with an answer"),
    (_with(1, role="tool"), r"messages\[1\].role='tool'.*cannot follow"),
    ({"messages": GOOD, "tools": [{"name": "calc"}]}, r"tools\[0\]"),
  ],
)
def test_bad_records_name_the_record_message_and_field(record, field):
  """Each bad record fails with one DataError naming `where` and the field. Mutation:
  `"assistant": previous in ("user", "tool") and not pending` -> `... ("user", "tool")`
  (an assistant answering before its calls' results)."""
  with pytest.raises(errors.DataError, match=rf"^data.jsonl:7: .*{field}"):
    openai_chat.record(record, "data.jsonl:7")


def test_normalized_arguments_ids_and_results():
  """JSON-text arguments become the object; missing call ids are numbered over the record
  (9 characters, as Mistral needs); a tool message without id or name answers the first
  open call. Mutation: `call.get("id", tool_formats.call_id(first + j))` -> `call_id(j)`."""
  calls = [{"function": {"name": "f", "arguments": '{"a": 1}'}}, {"function": {"name": "g"}}]
  messages = [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "x", "tool_calls": calls[:1]},
    {"role": "tool", "content": "r1"},
    {"role": "assistant", "content": None, "tool_calls": calls[1:]},
    {"role": "tool", "content": "r2"},
    {"role": "assistant", "content": "done"},
  ]
  got = openai_chat.record({"messages": messages})["messages"]
  assert got[1]["tool_calls"][0] == {
    "id": "call00000",
    "type": "function",
    "function": {"name": "f", "arguments": {"a": 1}},
  }
  assert got[3]["tool_calls"][0]["id"] == "call00001" and got[3]["content"] == ""
  assert got[2] == {"role": "tool", "tool_call_id": "call00000", "name": "f", "content": "r1"}
  assert got[4]["tool_call_id"] == "call00001" and got[4]["name"] == "g"


def test_jsonl_loading_keeps_tools_and_plain_records_as_before(tmp_path):
  plain = {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}
  tools = [{"type": "function", "function": {"name": "calc"}}]
  path = tmp_path / "sft.jsonl"
  bad = _with(3, tool_call_id="zz")
  lines = [plain, {"messages": GOOD, "tools": tools}, bad]
  path.write_text("\n".join(map(json.dumps, lines)) + "\n")
  with pytest.raises(errors.DataError, match=re.escape(f"{path}:3: messages[3].tool_call_id")):
    chat.load_sft_jsonl(path)
  path.write_text("\n".join(map(json.dumps, lines[:2])) + "\n")
  loaded = chat.load_sft_jsonl(path)
  assert loaded[0] == plain and loaded[1]["tools"] == tools
  assert loaded[1]["messages"][2]["tool_calls"] == [CALL]
