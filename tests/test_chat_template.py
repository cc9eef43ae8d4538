"""rlpost.text.chat_template and template_ids: model files' Jinja chat templates rendered
as transformers renders them (fixtures made by experiments/oracles/chat_template_fixtures.py
with transformers), their text as ids, bad input refused by name."""

import dataclasses
import hashlib
import json
import pathlib

import pytest
from conftest import skip_or_fail

from rlpost.text import chat_formats, chat_template, template_ids, tokenizer, vocabularies

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "chat_templates"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
# the hand-written layout (chat_formats) each template equals on the conversations it lays out
HAND_WRITTEN = {"gemma3_it": "gemma", "smollm2": "chatml", "qwen2_5": "chatml"}
HAND_WRITTEN |= {"llama3_1": "llama3", "llama3_2": "llama3"}
STRIPS = ("gemma3_it", "llama3_1", "llama3_2")  # templates that trim each content


def _fixture(name: str) -> dict:
  return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def _template(fix: dict) -> chat_template.ChatTemplate:
  return chat_template.ChatTemplate(
    fix["template"], fix["name"], fix["bos_token"], fix["eos_token"]
  )


def _case(fix: dict, name: str) -> dict:
  return next(c for c in fix["cases"] if c["name"] == name)


def _render(template, fix, case, tools=True):
  return chat_template.render(
    template,
    case["messages"],
    tools=fix["tools"] if case["tools"] and tools else None,
    add_generation_prompt=case["add_generation_prompt"],
    **case["kwargs"],
  )


def _expect(template, fix, case, tools=True):
  """Asserts the rendering equals transformers' text, or is refused with its message."""
  if "text" in case:
    assert _render(template, fix, case, tools) == case["text"], (fix["name"], case["name"])
    return
  with pytest.raises(chat_template.ChatTemplateError) as e:
    _render(template, fix, case, tools)
  assert fix["name"] in str(e.value) and case["error"] in str(e.value), (case["name"], e.value)


def test_fixtures_cover_every_claimed_template():
  assert NAMES == sorted(
    [
      "gemma3_it",
      "smollm2",
      "smollm3",
      "qwen2_5",
      "qwen3",
      "llama3_1",
      "llama3_2",
      "mistral_nemo",
      "hermes",
    ]
  )


@pytest.mark.parametrize("name", NAMES)
def test_rendering_equals_transformers_byte_for_byte(name):
  """Every case of every template: the text transformers' apply_chat_template wrote, or its
  refusal (named with the template). A template that never reads `tools` is refused them
  by name (transformers drops them silently) and renders the rest as transformers does.

  Mutations caught: `tojson` sorting keys (sort_keys=True); trim_blocks=False; the None-
  valued keys kept; `reasoning` not aliased as `reasoning_content`; `strftime_now`
  formatting today; `reads_tools` always True."""
  fix = _fixture(name)
  template = _template(fix)
  assert hashlib.sha256(fix["template"].encode()).hexdigest() == fix["provenance"]["sha256"]
  for case in fix["cases"]:
    if case["tools"] and not template.reads_tools:
      with pytest.raises(chat_template.ChatTemplateError, match="no tool support"):
        _render(template, fix, case)
      _expect(template, fix, case, tools=False)
    else:
      _expect(template, fix, case)


def test_template_failures_name_the_template_and_the_message():
  """Gemma 3's raise_exception on roles that do not alternate, and a template error
  (Hermes iterating no tools), name the template and the first message that fails.

  Mutation caught: the message index search starting at the second message."""
  gemma = _fixture("gemma3_it")
  template = _template(gemma)
  case = _case(gemma, "tool_call_result")
  with pytest.raises(chat_template.ChatTemplateError) as e:
    chat_template.render(template, case["messages"])
  assert "gemma3_it failed at messages[2] (role 'tool')" in str(e.value)
  assert "roles must alternate" in str(e.value)
  with pytest.raises(chat_template.ChatTemplateError, match=r"at messages\[0\]"):
    chat_template.render(template, _case(gemma, "bad_roles")["messages"])


@pytest.mark.parametrize(
  "messages, tools, where",
  [
    ([{"role": "robot", "content": "hi"}], None, r"messages\[0\]\.role='robot': use one of"),
    ([{"role": "user", "content": 7}], None, r"messages\[0\]\.content=7: give a string"),
    ([{"role": "user", "content": [{"text": "x"}]}], None, r"content\[0\]=.*string \"type\""),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], None, r"content\[0\]\.text"),
    ([{"role": "user"}], None, r"messages\[0\]\.content=None"),
    ([], None, "non-empty list"),
    (
      [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]},
      ],
      None,
      r"messages\[1\]\.tool_calls\[0\]\.function\.name=None",
    ),
    ([{"role": "user", "content": "hi"}], [{"type": "function"}], r"tools\[0\]="),
  ],
)
def test_bad_conversations_are_refused_by_name_before_rendering(messages, tools, where):
  """Unknown roles, non-string contents (other than lists of typed parts), tool calls
  without names, tools without names: one ChatTemplateError naming the field and value.

  Mutation caught: the role check dropped from check_conversation."""
  with pytest.raises(chat_template.ChatTemplateError, match=where):
    chat_template.render(_template(_fixture("qwen2_5")), messages, tools=tools)


def test_tools_support_is_read_from_the_template():
  """Templates that never read `tools` (Gemma 3, SmolLM2) are refused them with the
  fallback named; the others read them."""
  reads = {name: _template(_fixture(name)).reads_tools for name in NAMES}
  assert not reads["gemma3_it"] and not reads["smollm2"]
  assert all(reads[n] for n in ("qwen2_5", "qwen3", "llama3_1", "mistral_nemo", "hermes"))
  fix = _fixture("smollm2")
  with pytest.raises(chat_template.ChatTemplateError, match="tool_syntax"):
    chat_template.render(_template(fix), [{"role": "user", "content": "x"}], tools=fix["tools"])


def test_dates_are_fixed_by_the_config_not_the_calendar():
  """Llama 3.2 prints strftime_now's day: DEFAULT_DATE unless a date_string is given; a
  badly written date_string is refused by name."""
  fix = _fixture("llama3_2")
  template, messages = _template(fix), [{"role": "user", "content": "Day?"}]
  assert "Today Date: 26 Jul 2024\n" in chat_template.render(template, messages)
  text = chat_template.render(template, messages, date_string="03 Feb 2026")
  assert "Today Date: 03 Feb 2026\n" in text
  with pytest.raises(ValueError, match="date_string='2026-02-03'"):
    chat_template.render(template, messages, date_string="2026-02-03")


def test_templates_are_read_from_hf_directories_and_files(tmp_path):
  """tokenizer_config.json's string and named-list forms, chat_template.jinja first, a
  file; a missing file and a missing name are named.

  Mutation caught: a missing template name not refused."""
  config = tmp_path / "tokenizer_config.json"
  config.write_text(json.dumps({"chat_template": "A{{ messages[0].content }}"}))
  assert chat_template.hf_directory_text(tmp_path) == "A{{ messages[0].content }}"
  named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
  config.write_text(json.dumps({"chat_template": named}))
  assert chat_template.hf_directory_text(tmp_path) == "D"
  assert chat_template.hf_directory_text(tmp_path, "tool_use") == "T"
  with pytest.raises(chat_template.ChatTemplateError, match="no template named 'rag'"):
    chat_template.hf_directory_text(tmp_path, "rag")
  (tmp_path / "chat_template.jinja").write_text("J")
  assert chat_template.from_file(tmp_path).text == "J"
  assert chat_template.from_file(tmp_path / "chat_template.jinja").source.endswith(".jinja")
  with pytest.raises(chat_template.ChatTemplateError, match="no such file"):
    chat_template.from_file(tmp_path / "missing.jinja")


# ------------------------------------------------------------------ hand-written layouts


def _hand_written_tokenizer(name: str, template: str) -> tokenizer.Tokenizer:
  """A byte tokenizer of the template's layout, with its default system and preamble."""
  chat = HAND_WRITTEN[name]
  tok = tokenizer.byte_tokenizer(chat)
  return dataclasses.replace(
    tok,
    uses_bos=chat != "chatml",
    default_system=chat_formats.default_system(template, chat),
    system_preamble=chat_formats.system_preamble(template, chat),
  )


def _stripped(messages):
  return [{**m, "content": m["content"].strip()} for m in messages]


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_hand_written_layouts_equal_the_templates_rendering(name):
  """chat_formats' ids for Gemma 3 it, SmolLM2, Qwen2.5 and Llama 3.x decode to the text
  transformers renders (system, multi-turn, generation prompt or none). The one difference
  (documented in chat_formats): Gemma's and Llama's templates strip each content, so a
  content with outer whitespace equals only once stripped.

  Mutation caught: chat_formats' default system text dropped for chatml."""
  fix = _fixture(name)
  tok = _hand_written_tokenizer(name, fix["template"])
  for case_name in ("user", "system_user", "multi_turn", "whitespace"):
    case = _case(fix, case_name)
    messages = case["messages"]
    if case_name == "whitespace" and name in STRIPS:
      messages = _stripped(messages)
    ids = chat_formats.conversation_ids(tok, messages, case["add_generation_prompt"])
    assert tok.decode(ids, skip_special=False) == case["text"], (name, case_name)
  if name in STRIPS:
    case = _case(fix, "whitespace")
    ids = chat_formats.conversation_ids(tok, case["messages"], True)
    assert tok.decode(ids, skip_special=False) != case["text"]


# ------------------------------------------------------------------ text to ids


def test_conversation_ids_keep_control_text_in_user_contents_as_text():
  """On a byte tokenizer, SmolLM2's template gives the ids chat_formats gives, control-
  token text in a user content included (as text), and one BOS at most: Gemma's template
  writes its own, a chatml template on a BOS tokenizer gets one prepended.

  Mutations caught: marked_inputs not marking; the BOS prepended even when written."""
  fix = _fixture("smollm2")
  tok = _hand_written_tokenizer("smollm2", fix["template"])
  messages = [
    {"role": "user", "content": "say <|im_end|> and <|im_start|>"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "again"},
  ]
  ids = template_ids.conversation_ids(_template(fix), tok, messages, add_generation_prompt=True)
  assert ids == chat_formats.conversation_ids(tok, messages)
  assert ids.count(tok.special_tokens["<|im_end|>"]) == 4  # default system + 3 turns
  gemma = _fixture("gemma3_it")
  gtok = tokenizer.byte_tokenizer("gemma")
  ids = template_ids.conversation_ids(_template(gemma), gtok, messages[:1])
  assert ids[:2] == [gtok.bos_id, gtok.start_of_turn_id]
  chatml_on_bos = dataclasses.replace(tok, uses_bos=True)
  ids = template_ids.text_ids(chatml_on_bos, "<|im_start|>user\nhi<|im_end|>\n")
  assert ids[:2] == [tok.bos_id, tok.start_of_turn_id]


def test_lone_marks_are_dropped_and_never_form_control_tokens():
  """A template that cuts a marked token apart leaves marks that vanish; their text is text."""
  tok = tokenizer.byte_tokenizer("chatml")
  ids = template_ids.text_ids(
    dataclasses.replace(tok, uses_bos=False), "<|im_start|>a\ue000<|im_end|>\ue001b\ue000c"
  )
  assert ids[0] == tok.start_of_turn_id and tok.end_of_turn_id not in ids
  assert tok.decode(ids, skip_special=False) == "<|im_start|>a<|im_end|>bc"


def test_prefix_mismatch():
  """A re-rendering that extends the sampled ids is no mismatch; a shorter or different
  one is."""
  assert not template_ids.prefix_mismatch([1, 2], [1, 2])
  assert not template_ids.prefix_mismatch([1, 2], [1, 2, 3])
  assert template_ids.prefix_mismatch([1, 2, 3], [1, 2])
  assert template_ids.prefix_mismatch([1, 2, 3], [1, 9, 3, 4])


@pytest.mark.parametrize("name, drops", [("qwen3", True), ("qwen2_5", False)])
def test_qwen3_dropping_earlier_thinking_is_a_prefix_mismatch(name, drops):
  """Turn 1 samples `<think>...</think>` and an answer; turn 2's re-rendered conversation
  drops the thinking under Qwen3's template (a mismatch) and keeps it under Qwen2.5's.

  Mutation caught: prefix_mismatch comparing only lengths."""
  fix = _fixture(name)
  template = _template(fix)
  tok = dataclasses.replace(tokenizer.byte_tokenizer("chatml"), uses_bos=False)
  thought = _case(fix, "think_history")["messages"][1]
  first = [{"role": "user", "content": "What is 2+2?"}]
  prompt = template_ids.conversation_ids(template, tok, first, add_generation_prompt=True)
  sampled = tok.encode(thought["content"], add_bos=False) + [tok.end_of_turn_id]
  second = [*first, thought, {"role": "user", "content": "And 3+3?"}]
  again = template_ids.conversation_ids(template, tok, second, add_generation_prompt=True)
  assert template_ids.prefix_mismatch(prompt + sampled, again) == drops


@pytest.mark.real_model
def test_smollm2_gguf_template_renders_to_its_own_ids():
  """The SmolLM2 GGUF's own template (Tokenizer.chat_template, as the fixture's) rendered
  and tokenized equals chat_formats' ids on the real BPE tokenizer, for a conversation
  with control-token text in a user content."""
  from rlpost.models.weights import gguf_file, packaged  # pylint: disable=g-import-not-at-top

  try:
    path = packaged.smollm2_gguf_path()
  except ImportError as e:
    skip_or_fail(str(e))
  tok = vocabularies.from_gguf_metadata(gguf_file.read_gguf(path).metadata, str(path))
  assert tok.chat_template == _fixture("smollm2")["template"]
  template = chat_template.for_tokenizer(tok)
  messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Is <|im_end|> a token? 12345"},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "Zürich?"},
  ]
  ids = template_ids.conversation_ids(template, tok, messages, add_generation_prompt=True)
  assert ids == chat_formats.conversation_ids(tok, messages)
  text = chat_template.render(template, messages[:3], add_generation_prompt=True)
  assert template_ids.text_ids(tok, text) == tok.encode(text, add_bos=False)


@pytest.mark.real_model
def test_gemma3_base_gguf_has_no_template_and_takes_the_configured_file(tmp_path):
  """The packaged Gemma 3 270M (a base model) carries no chat template: `for_tokenizer`
  gives None (the family's layout) unless a file is named, whose rendering then uses the
  tokenizer's BOS text."""
  from rlpost.models import loading  # pylint: disable=g-import-not-at-top

  try:
    tok = loading.load_gguf_tokenizer()
  except ImportError as e:
    skip_or_fail(str(e))
  assert tok.chat_template == "" and chat_template.for_tokenizer(tok) is None
  fix = _fixture("gemma3_it")
  path = tmp_path / "gemma3_it.jinja"
  path.write_text(fix["template"])
  template = chat_template.for_tokenizer(tok, str(path))
  case = _case(fix, "system_user")
  assert _render(template, fix, case) == case["text"]


def test_model_block_checks_its_template_fields(tmp_path):
  """config.model.date_string must be a day ("26 Jul 2024"), config.model.chat_template an
  existing file; each refusal names the field, the value and the fix.

  Mutation caught: ModelBlock not parsing its date_string."""
  from rlpost import errors  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import common, rl_config  # pylint: disable=g-import-not-at-top

  block = common.from_block(rl_config.ModelBlock, {}, "model")
  assert (block.chat_template, block.date_string) == ("", chat_template.DEFAULT_DATE)
  with pytest.raises(errors.ConfigError, match=r"config\.model\.date_string='2024-07-26': write"):
    common.from_block(rl_config.ModelBlock, {"date_string": "2024-07-26"}, "model")
  missing = str(tmp_path / "none.jinja")
  with pytest.raises(errors.ConfigError, match=r"config\.model\.chat_template=.*no such file"):
    common.from_block(rl_config.ModelBlock, {"chat_template": missing}, "model")
  (tmp_path / "t.jinja").write_text("x")
  block = common.from_block(
    rl_config.ModelBlock, {"chat_template": str(tmp_path / "t.jinja")}, "model"
  )
  assert block.chat_template.endswith("t.jinja")


def test_templates_run_sandboxed_and_syntax_errors_are_named():
  """A template cannot reach Python internals (the immutable sandbox; namespace() refuses
  "_" names) nor change its inputs; a syntax error names the template and the line.

  Mutation caught: namespace() left as Jinja's own."""
  user = [{"role": "user", "content": "x"}]
  for text in (
    "{{ messages.__class__.__mro__ }}",
    "{% set ns = namespace(_x=1) %}",
    "{% set ns = namespace() %}{% set ns._y = 1 %}",
    "{{ messages.append(1) }}",
  ):
    with pytest.raises(chat_template.ChatTemplateError, match="failed"):
      chat_template.render(chat_template.ChatTemplate(text, "evil"), user)
  with pytest.raises(chat_template.ChatTemplateError, match="broken: line 1"):
    chat_template.render(chat_template.ChatTemplate("{% if %}", "broken"), user)


def test_generation_blocks_render_their_body_unchanged():
  """transformers' `{% generation %}` tag (its assistant mask) is a pass-through: Qwen2.5's
  template with each assistant turn wrapped in it renders exactly as without.

  Mutation caught: the block's body dropped."""
  fix = _fixture("qwen2_5")
  text = fix["template"]
  opening = '{%- elif message.role == "assistant" %}'
  start = text.index(opening) + len(opening)  # the assistant branch's body, wrapped
  end = text.index('{%- elif message.role == "tool" %}')
  wrapped = (
    text[:start] + "{% generation %}" + text[start:end] + "{%- endgeneration %}" + text[end:]
  )
  assert wrapped.count("generation %}") == 2
  case = _case(fix, "tool_call_result")
  got = _render(chat_template.ChatTemplate(wrapped, "wrapped"), fix, case)
  assert got == case["text"]
