r"""Chat-template cost against sampling (issue 66): rendering and tokenizing a conversation
through a model's Jinja template, against one turn's sampling on a random-weight model.

Workload: a 4-turn conversation (system, user, assistant tool call, tool result, assistant,
user, assistant, user: four assistant turns' worth of history) with 3 tools, rendered and
tokenized by `template_ids.conversation_ids` (checks, marking, Jinja, BPE) with SmolLM2's
tokenizer, through
  smollm2   SmolLM2's own template (from its GGUF); it reads no `tools`, so the tools go into
            the system text as JSON (the library-syntax fallback's size)
  qwen2_5   Qwen2.5's template (tests/fixtures/chat_templates/qwen2_5.json), tools native
and one turn of sampling: `--rows` rows of that conversation's ids (mapped into the model's
vocabulary) as prompts, `--new_tokens` sampled tokens each, one `sampling.sample` call
(compiled first). A multi-turn rollout renders every row's conversation each turn, so the
cost compared is rows x one rendering against one sampling call. Prints ONE JSON object:
per template the rendering's seconds (min, median over `--renders`), the prompt's tokens and
`fraction_of_turn` = rows x median rendering / median sampling call (goal: < 0.05); `_cold`:
the same with the BPE's word cache emptied before each rendering (no word seen before; in a
rollout the history's words were).

  python -m experiments.benchmarks.chat_template [--preset=tiny] [--rows=8] [--new_tokens=64]
"""

import json
import os
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from experiments.benchmarks import machine
from rlpost import sampling
from rlpost.models import decoder, families
from rlpost.models.weights import gguf_file, packaged
from rlpost.text import chat_template, template_ids, vocabularies

_PRESET = flags.DEFINE_string("preset", "tiny", "Model preset (random weights).")
_ROWS = flags.DEFINE_integer("rows", 8, "Rows sampled in one turn (conversations rendered).")
_NEW = flags.DEFINE_integer("new_tokens", 64, "Tokens sampled per row in the turn.")
_RENDERS = flags.DEFINE_integer("renders", 50, "Timed renderings per template.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed sampling calls.")
_QWEN = pathlib.Path(__file__).parents[2] / "tests" / "fixtures" / "chat_templates" / "qwen2_5.json"


def _tool(name: str, description: str, **params: str) -> dict:
  properties = {k: {"type": "string", "description": v} for k, v in params.items()}
  schema = {"type": "object", "properties": properties, "required": list(params)}
  return {
    "type": "function",
    "function": {"name": name, "description": description, "parameters": schema},
  }


TOOLS = [
  _tool("calculator", "Evaluates an arithmetic expression.", expression="e.g. 2 * (3 + 4)"),
  _tool("get_weather", "Today's weather in a city.", location="City name", unit="celsius|F"),
  _tool("search", "Searches the web.", query="What to look for"),
]


def _conversation(tools_in_system: bool) -> list[dict]:
  system = "You are a careful assistant. Use the tools when they help."
  if tools_in_system:
    system += "\nTools:\n" + "\n".join(json.dumps(t["function"]) for t in TOOLS)
  call = {"name": "calculator", "arguments": {"expression": "48 / 2 + 48"}}
  return [
    {"role": "system", "content": system},
    {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. Total?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
    {"role": "tool", "content": "72"},
    {"role": "assistant", "content": "She sold 72 clips in April and May."},
    {"role": "user", "content": "And if June matched April?"},
    {"role": "assistant", "content": "Then 72 + 48 = 120 clips."},
    {"role": "user", "content": "What is the weather in Paris, in celsius?"},
  ]


def _times(fn, repeats: int) -> list[float]:
  """Seconds of `repeats` calls after one untimed (compiling, warming) call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def _sampling_seconds(prompt_ids: list[int]) -> list[float]:
  config = families.get_config(_PRESET.value)
  params = decoder.init_params(jax.random.key(0), config)
  ids = jnp.asarray([i % config.vocab_size for i in prompt_ids], jnp.int32)
  prompt = jnp.tile(ids[None], (_ROWS.value, 1))
  lengths = jnp.full((_ROWS.value,), len(prompt_ids), jnp.int32)
  sc = sampling.SamplingConfig(stop_ids=(), max_new_tokens=_NEW.value, prompt_bucket=64)
  key = jax.random.key(1)
  return _times(
    lambda: sampling.sample(params, prompt, lengths, key, model_config=config, config=sc),
    _REPEATS.value,
  )


def main(argv):
  del argv
  path = packaged.smollm2_gguf_path()
  tok = vocabularies.from_gguf_metadata(gguf_file.read_gguf(path).metadata, str(path))
  qwen = json.loads(_QWEN.read_text(encoding="utf-8"))
  runs = {
    "smollm2": (chat_template.for_tokenizer(tok), _conversation(True), None),
    "qwen2_5": (
      chat_template.ChatTemplate(qwen["template"], "qwen2_5"),
      _conversation(False),
      TOOLS,
    ),
  }
  report = {
    "workload": {"preset": _PRESET.value, "rows": _ROWS.value, "new_tokens": _NEW.value},
    "cpu": machine.cpu_model(),
    "jax": jax.__version__,
    "load_average_before": os.getloadavg(),
  }
  for name, (template, messages, tools) in runs.items():

    def render(template=template, messages=messages, tools=tools):
      return template_ids.conversation_ids(
        template, tok, messages, tools=tools, add_generation_prompt=True
      )

    def render_cold(render=render):
      tok.processor._word_ids.cache_clear()  # pylint: disable=protected-access
      return render()

    ids = render()
    render_s = _times(render, _RENDERS.value)
    cold_s = _times(render_cold, _RENDERS.value)
    sample_s = statistics.median(_sampling_seconds(ids))
    report[name] = {
      "prompt_tokens": len(ids),
      "render_seconds_min": min(render_s),
      "render_seconds_median": statistics.median(render_s),
      "render_cold_seconds_median": statistics.median(cold_s),
      "sampling_call_seconds_median": sample_s,
      "fraction_of_turn": _ROWS.value * statistics.median(render_s) / sample_s,
      "fraction_of_turn_cold": _ROWS.value * statistics.median(cold_s) / sample_s,
    }
  report["load_average_after"] = os.getloadavg()
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  app.run(main)
