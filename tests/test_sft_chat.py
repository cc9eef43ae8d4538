"""SFT laid out by the model's chat template (data.layout) on OpenAI-shaped conversations,
and gsm8k_tools traces in a native tool format (tools.format)."""

import json

import numpy as np
import pytest
from conftest import GSM8K_DIR, require_shared
from test_template_turns import FIXTURES, _setup

from experiments.configs import sft as sft_configs
from rlpost import errors
from rlpost.recipes import sft as sft_recipe
from rlpost.text import tokenizer as tokenizer_lib

QWEN = json.loads((FIXTURES / "qwen2_5.json").read_text(encoding="utf-8"))


def _config(tmp_path, **overrides):
  """The tiny SFT config with the Qwen2.5 template (from its fixture) as model.chat_template."""
  cfg = sft_configs.get_config("tiny")
  cfg.eval.every = 0
  template = tmp_path / "qwen2_5.jinja"
  template.write_text(QWEN["template"], encoding="utf-8")
  cfg.model.chat_template = str(template)
  for key, value in overrides.items():
    section, name = key.split("__")
    cfg[section][name] = value
  return cfg


def _conversation(a: int, b: int) -> dict:
  call = {"id": f"call{a:02d}{b:03d}", "type": "function"}
  call["function"] = {"name": "calculator", "arguments": json.dumps({"expression": f"{a}*{b}"})}
  return {
    "messages": [
      {"role": "user", "content": f"What is {a} times {b}?"},
      {"role": "assistant", "content": None, "tool_calls": [call]},
      {"role": "tool", "tool_call_id": call["id"], "content": str(a * b)},
      {"role": "assistant", "content": f"It is {a * b}."},
    ]
  }


def _spans(a: int, b: int) -> list[str]:
  """Qwen2.5's assistant turns of `_conversation(a, b)` (its documented Hermes layout, as
  the transformers fixture shows it), each with its <|im_end|>."""
  call = f'{{"name": "calculator", "arguments": {{"expression": "{a}*{b}"}}}}'
  return [f"<tool_call>\n{call}\n</tool_call><|im_end|>", f"It is {a * b}.<|im_end|>"]


def _jsonl(tmp_path, pairs) -> str:
  path = tmp_path / "tools.jsonl"
  path.write_text("".join(json.dumps(_conversation(a, b)) + "\n" for a, b in pairs))
  return str(path)


@pytest.mark.parametrize(
  "overrides, match",
  [
    ({"data__layout": "jinja"}, "config.data.layout='jinja'"),
    ({"tools__format": "xml"}, "config.tools.format='xml'"),
    ({"tools__format": "native"}, "config.tools.format='native': applies to data.source=gsm8k"),
    (
      {"tools__format": "native", "data__source": "gsm8k_tools", "data__layout": "chat"},
      "needs the chat template: data.layout=template",
    ),
  ],
)
def test_config_validation_names_the_field(tmp_path, overrides, match):
  with pytest.raises(errors.ConfigError, match=match):
    sft_recipe.check_config(_config(tmp_path, **overrides))


def test_layouts_template_chat_and_auto(tmp_path):
  """auto takes the template when the run has one (model.chat_template) and the family's
  format otherwise; template without one is refused naming data.layout; chat refuses tool
  calls naming the record's file and line. Mutation: `if layout == "chat": return None`
  -> `if layout != "template": return None` (auto never takes the template)."""
  tok = tokenizer_lib.byte_tokenizer("chatml")
  path = _jsonl(tmp_path, [(6, 7), (3, 4), (5, 5)])
  cfg = _config(tmp_path, data__source="jsonl", data__path=path, data__seq_len=384)
  (ids, mask), *_ = sft_recipe.tokenized_examples(cfg, tok)[0]
  runs = tok.decode(ids[mask], skip_special=False)
  assert runs == "".join(_spans(6, 7))
  cfg.data.layout = "chat"
  with pytest.raises(errors.DataError, match=rf"{path}:1: .*data.layout=template"):
    sft_recipe.tokenized_examples(cfg, tok)
  cfg.data.layout, cfg.model.chat_template = "template", ""
  with pytest.raises(errors.ConfigError, match="config.data.layout='template': the model file"):
    sft_recipe.tokenized_examples(cfg, tok)


def test_gsm8k_tool_traces_in_the_templates_native_format(tmp_path):
  """data.source=gsm8k_tools, tools.format=native with Qwen2.5's template: each example is
  the trace as a conversation, the calls in <tool_call> JSON trained on, the results
  (<tool_response>) and the native prompt (no library syntax) not. Mutation: the native
  branch of `tokenized_examples` taking `trace_example` (the library stream)."""
  data_dir = require_shared(GSM8K_DIR)
  layout, tok = _setup("qwen2_5")
  cfg = _config(
    tmp_path,
    data__source="gsm8k_tools",
    data__data_dir=str(data_dir),
    data__seq_len=4096,
    data__num_examples=3,
    tools__format="native",
  )
  cfg.eval.num_examples = 1
  train, held_out = sft_recipe.tokenized_examples(cfg, tok)
  assert len(train) == 3 and len(held_out) == 1
  for ids, mask in train:
    trained = tok.decode(ids[mask], skip_special=False)
    prompt = tok.decode(ids[: int(np.argmax(mask))], skip_special=False)
    assert "calculator tool" in prompt and "<tool>" not in prompt and '"calculator"' in prompt
    assert "<tool_response>" not in trained and "<tool>" not in trained
    calls = tok.decode(ids, skip_special=False).count("<tool_response>")
    assert calls > 0 and trained.count('<tool_call>\n{"name": "calculator"') == calls
    assert trained.count("<|im_end|>") == calls + 1 and "</reasoning>\n<answer>" in trained


@pytest.mark.slow
def test_tiny_qwen2_trains_on_openai_tool_conversations(tmp_path):
  """A tiny Qwen2 (random weights) SFT run on a JSONL of tool conversations laid out by the
  Qwen2.5 template: each step's target tokens are exactly the assistant spans' (Qwen's
  documented layout, counted independently), and the loss falls at every one of 6 steps
  (measured 5.53 -> 5.04). ~10 s. Mutation: `mask + [flag]` -> `mask + [1]` in
  template_sft.ids_and_mask (the count covers the prompts too)."""
  pairs = [(a, b) for a in (3, 6) for b in (4, 7, 8, 9)]
  cfg = _config(
    tmp_path,
    data__source="jsonl",
    data__path=_jsonl(tmp_path, pairs),
    data__seq_len=384,
    data__shuffle=False,
    train__steps=6,
    train__batch_size=8,
    train__micro_batch_size=4,
    checkpoint__every=100,
  )
  cfg.model.preset = "qwen2_tiny"
  cfg.eval.num_examples = 0
  sft_recipe.run(cfg, str(tmp_path / "run"))
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  records = [r for r in map(json.loads, lines) if "loss" in r]
  want = sum(len(s.encode()) - len("<|im_end|>") + 1 for a, b in pairs for s in _spans(a, b))
  assert all(r["target_tokens"] == want for r in records)
  losses = [r["loss"] for r in records]
  assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.95 * losses[0], losses
