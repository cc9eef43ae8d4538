"""A ReAct-style calculator agent, written only against the `openai` client (issue 68).

  python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/agent_tiny.py:calculator --workdir=DIR

It asks the question with the calculator offered as an OpenAI tool, runs each call it gets
back locally and answers it as a `tool` message, until the model answers in text: reward
1.0 when that text's last number is the task's answer. Any OpenAI-compatible server works.
"""

import json
import re

from rlpost.envs import calculator

MODEL = "policy"  # the name the training endpoint serves (rlpost.envs.agent.MODEL_NAME)
TOOL = {
  "type": "function",
  "function": {
    "name": "calculator",
    "description": "Evaluates an arithmetic expression.",
    "parameters": {
      "type": "object",
      "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
      "required": ["expression"],
    },
  },
}


def run(client, task: dict, max_turns: int = 3) -> float:
  """One episode on task {"question", "answer"}; the reward."""
  messages = [{"role": "user", "content": task["question"] + " Use the calculator."}]
  for _ in range(max_turns):
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL])
    message = reply.choices[0].message
    if not message.tool_calls:
      numbers = re.findall(r"-?\d+", message.content or "")
      return float(bool(numbers) and numbers[-1] == task["answer"])
    calls = [c.model_dump() for c in message.tool_calls]
    messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
    for call in message.tool_calls:
      arguments = json.loads(call.function.arguments or "{}")
      result = calculator.calculator(str(arguments.get("expression", "")))
      messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
  return 0.0
