"""rlpost.text.template_turns (the template scaffold of a multi-turn episode) and its wiring:
native tool formats in rollouts (`rlpost.envs.native_tools`), `template/prefix_mismatch`."""

import json
import pathlib

import numpy as np
import pytest
from conftest import run_metrics, with_overrides

from rlpost.envs import native_tools, protocol, tool_functions, tools
from rlpost.text import chat_template, template_ids, template_turns, tool_formats
from rlpost.text import tokenizer as tokenizer_lib

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "chat_templates"
# template -> (its control tokens, its end of turn, BOS text, whether the tokenizer adds BOS)
CONTROLS = {
  "gemma3_it": (["<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"], "<end_of_turn>", "<bos>"),
  "qwen2_5": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<|im_end|>", None),
  "qwen3": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<|im_end|>", None),
  "hermes": (
    ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>"],
    "<|im_end|>",
    "<|begin_of_text|>",
  ),
  "smollm2": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<|im_end|>", None),
  "llama3_1": (
    ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "<|eot_id|>",
    "<|begin_of_text|>",
  ),
  "mistral_nemo": (
    ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"]
    + ["[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
    "</s>",
    "<s>",
  ),
}


def _tokenizer(controls, eot, bos) -> tokenizer_lib.Tokenizer:
  """A byte tokenizer (byte b -> id b + 5) whose control tokens are `controls` (ids 300+)."""
  specials = {"<pad>": 0, **{t: 300 + k for k, t in enumerate(controls)}}
  return tokenizer_lib.Tokenizer(
    None,
    bos_id=specials.get(bos, 0),
    eos_id=specials[eot],
    pad_id=0,
    start_of_turn_id=specials[controls[0]],
    end_of_turn_id=specials[eot],
    vocab_size=300 + len(controls),
    special_tokens=specials,
    chat="chatml",
    uses_bos=bos is not None,
  )


def _setup(name: str):
  fix = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
  template = chat_template.ChatTemplate(fix["template"], name, fix["bos_token"], fix["eos_token"])
  return template_turns.Layout(template, (("date_string", "26 Jul 2024"),)), _tokenizer(
    *CONTROLS[name]
  )


SCHEMAS = tool_functions.schemas(tool_functions.function_tools(tools.REGISTRY))


def _turn(layout, tok, assistant, said: str, observation, schemas):
  """(the rollout's ids: first prompt, the model's text `said` and its close, the
  observation; the template's rendering of the whole conversation)."""
  user = {"role": "user", "content": "What is 6 * 7?"}
  got = template_turns.first_prompt_ids(layout, tok, user["content"], None, schemas)
  got += template_ids.text_ids(tok, said, add_bos=False) + [tok.end_of_turn_id]
  got += template_turns.observation_ids(layout, tok, observation, True, schemas)
  want = template_ids.conversation_ids(
    layout.template,
    tok,
    [user, assistant, *observation],
    tools=list(schemas) or None,
    add_generation_prompt=True,
    date_string="26 Jul 2024",
  )
  return got, want


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_a_turn_laid_out_token_by_token_is_the_templates_rendering(name):
  """The first prompt, a model turn ending in its end-of-turn token, and a user
  observation laid out by `template_turns` are the ids of the template's rendering of the
  whole conversation (what a reader re-rendering it gets), for every template with a
  fixture. Mutation caught: the observation cut at PROBE's end instead of at the end of
  turn (the close written twice)."""
  layout, tok = _setup(name)
  observation = [{"role": "user", "content": "Check it: <|im_end|> stays text."}]
  assistant = {"role": "assistant", "content": "It is 42."}
  schemas = SCHEMAS if name == "hermes" else ()  # Hermes' tool-use template needs its tools
  got, want = _turn(layout, tok, assistant, "It is 42.", observation, schemas)
  assert got == want


TOOL_TEMPLATES = ["hermes", "mistral_nemo", "qwen2_5", "qwen3"]


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_a_native_tool_call_and_its_result_are_the_templates_rendering(name):
  """A turn calling the calculator in the template's own format (`tool_formats.detect`,
  written by its renderer) and the `tool` message answering it, laid out by
  `template_turns`, equal the template's rendering of the conversation (the call as an
  OpenAI `tool_calls` entry), tools listed in the system turn. Mutation caught:
  `render_mistral` writing no call ids (Mistral-Nemo's template writes each call's)."""
  layout, tok = _setup(name)
  fmt = tool_formats.get(tool_formats.detect(layout.template.text))
  call = tool_formats.Call("calculator", {"expression": "6 * 7"}, "call00000")
  said = fmt.render("", [call])
  assistant = {"role": "assistant", "content": "", "tool_calls": [_openai(call)]}
  result = tool_formats.result_message(fmt, call, "42")
  got, want = _turn(layout, tok, assistant, said, [result], SCHEMAS)
  assert got == want, (
    tok.decode(got, skip_special=False) + "\n---\n" + tok.decode(want, skip_special=False)
  )


def _openai(call):
  return {
    "id": call.id,
    "type": "function",
    "function": {"name": call.name, "arguments": call.arguments},
  }


def test_native_tools_answer_every_call_of_a_turn_and_never_raise():
  """`with_native_tools`: a turn with two calls (one malformed) gets two `tool` messages
  (the malformed one an error), ids numbered over the episode, the assistant message with
  the good call, the schemas in `Env.tools`; a turn without calls goes to the
  environment. Mutation caught: ids numbered within the turn (the second turn's first
  call reusing call00000)."""
  done = protocol.Step(None, "", 1.0, True, {"success": True})
  inner = protocol.Env("echo", lambda task, seed: (0, "go"), lambda s, t: done, max_turns=4)
  toolset = tool_functions.function_tools(tools.REGISTRY)
  env = native_tools.with_native_tools(inner, toolset, tool_formats.get("hermes"), 50)
  assert [s["function"]["name"] for s in env.tools] == ["calculator"]
  state, _ = env.reset(None, 0)
  text = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
  step = env.step(state, text + "<tool_call>{broken</tool_call>")
  messages = step.info[native_tools.TOOL_MESSAGES]
  assert [m["content"] for m in messages][0] == "5" and messages[1]["content"].startswith("error: ")
  assert step.info["tool_error"] and [m["tool_call_id"] for m in messages] == [
    "call00000",
    "call00001",
  ]
  assert len(step.info[native_tools.ASSISTANT_MESSAGE]["tool_calls"]) == 1
  again = env.step(step.state, text)
  assert again.info[native_tools.TOOL_MESSAGES][0]["tool_call_id"] == "call00002"
  end = env.step(again.state, "The answer is 5.")
  assert end.done and end.info == {"success": True, "tool_call": False}


def test_decoding_keeps_only_the_formats_markers():
  """`decode_keeping` writes the kept control tokens and drops the others."""
  _, tok = _setup("mistral_nemo")
  ids = template_ids.text_ids(tok, '[TOOL_CALLS][{"name": "x"}]</s>', add_bos=False)
  keep = frozenset({tok.special_tokens["[TOOL_CALLS]"]})
  assert template_turns.decode_keeping(tok, ids, keep) == '[TOOL_CALLS][{"name": "x"}]'
  assert template_turns.decode_keeping(tok, ids, frozenset()) == '[{"name": "x"}]'


# family preset, its template's fixture, the tool format `native` resolves to, its system opening
FAMILY_RUNS = [
  ("qwen2_tiny", "qwen2_5", "hermes", "<|im_start|>system\nYou are Qwen"),
  ("llama_tiny", "llama3_1", "llama3_json", "<|start_header_id|>system<|end_header_id|>"),
  ("tiny", "gemma3_it", "library", "<start_of_turn>user\n"),
]


@pytest.mark.slow
@pytest.mark.parametrize("preset,template,tool_format,opening", FAMILY_RUNS)
def test_an_agentic_run_in_each_familys_template_and_tool_format(
  preset, template, tool_format, opening, tmp_path
):
  """FrozenLake with the calculator on each family's tiny model, laid out by the family's
  own chat template (`rollout.template=template`, `model.chat_template`), tools in its
  native format (`tools.format=native`: hermes for Qwen2.5's template, llama3_json for
  Llama 3.1's, the library's syntax for Gemma 3's, which has no tool section): the run
  trains one iteration, each first prompt is the template's rendering (tools in the
  template's tool section), and every observation turn reports whether its re-rendering
  extends the sampled tokens (`template/prefix_mismatch`)."""
  from experiments.configs import agentic  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  fix = json.loads((FIXTURES / f"{template}.json").read_text(encoding="utf-8"))
  path = tmp_path / "chat.jinja"
  path.write_text(fix["template"], encoding="utf-8")
  overrides = {
    "model.preset": preset,
    "model.chat_template": str(path),
    "rollout.template": "template",
    "rollout.max_prompt_tokens": 2048,  # the tools in the system turn, one byte a token
    "tools.enabled": True,
    "tools.format": "native",
    "train.steps": 1,
    "eval.every": 0,
    "log.trajectories_every": 1,
  }
  cfg = with_overrides(agentic.get_config("frozenlake_tiny"), overrides)
  p = rl.build(cfg)
  assert p.turns.layout is not None and p.tasks.env.stop_strings[-1:] == (
    ("</tool>",) if tool_format == "library" else p.tasks.env.stop_strings[-1:]
  )
  env = p.tasks.env
  ids = template_turns.first_prompt_ids(
    p.turns.layout, p.tokenizer, env.reset(None, 3)[1], None, env.tools
  )
  text = p.tokenizer.decode(ids, skip_special=False)
  # (the tiny models' byte tokenizer uses a BOS, which Qwen's own does not)
  assert text.removeprefix("<bos>").removeprefix("<|begin_of_text|>").startswith(opening)
  assert ('"name": "calculator"' in text) == (tool_format != "library")
  rl.run(cfg, str(tmp_path / "run"))
  record = run_metrics(tmp_path / "run")[-1]
  assert np.isfinite(record["template/prefix_mismatch"]) and "tool_call_rate" in record


@pytest.mark.slow
def test_gsm8k_with_the_calculator_in_qwens_native_format(tmp_path):
  """The calculator environment (`gsm8k_calc`) in the model's own tool format: the run's
  `tools.format=native` reaches the environment (it answers calls itself), its prompt
  offers the calculator in the template's tool section and describes no library syntax,
  and one GRPO iteration on the tiny Qwen2 model trains. Mutation caught: the table not
  handing an own-tools environment the run's tool format (library instructions in the
  prompt)."""
  from conftest import GSM8K_DIR, require_shared  # pylint: disable=g-import-not-at-top
  from experiments.configs import agentic  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  require_shared(GSM8K_DIR)
  fix = json.loads((FIXTURES / "qwen2_5.json").read_text(encoding="utf-8"))
  path = tmp_path / "chat.jinja"
  path.write_text(fix["template"], encoding="utf-8")
  overrides = {
    "model.preset": "qwen2_tiny",
    "model.weights": "random",
    "model.chat_template": str(path),
    "env.data_dir": str(GSM8K_DIR),
    "env.fewshot": 0,
    "env.max_turns": 2,
    "rollout.template": "template",
    "rollout.max_turn_tokens": 8,
    "rollout.max_total_tokens": 64,
    "tools.format": "native",
    "train.steps": 1,
    "train.batch_tasks": 1,
    "train.micro_batch_size": 2,
    "algo.num_generations": 2,
    "eval.every": 0,
  }
  cfg = with_overrides(agentic.get_config("gsm8k_calc_gemma3"), overrides)
  p = rl.build(cfg)
  env = p.tasks.env
  first = env.reset(p.tasks.train_tasks([0])[0], 0)[1]
  assert "<tool>" not in first and [t["function"]["name"] for t in env.tools] == ["calculator"]
  ids = template_turns.first_prompt_ids(p.turns.layout, p.tokenizer, first, env.system, env.tools)
  assert '"name": "calculator"' in p.tokenizer.decode(ids, skip_special=False)
  rl.run(cfg, str(tmp_path / "run"))
  assert np.isfinite(run_metrics(tmp_path / "run")[-1]["reward/mean"])
