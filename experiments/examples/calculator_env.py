"""The calculator agent's task as the library's own `Env` (the like-for-like side of
experiments/benchmarks/agent_iteration.py): the same arithmetic tasks by seed
(`rlpost.envs.agent.arithmetic_task`), three turns, the calculator offered by the `tools`
block (`--config.tools.enabled=True`), reward 1.0 when the last number of a turn without
a call is the answer.

  --config.env.name=experiments.examples.calculator_env:make --config.tools.enabled=True
"""

import re

from rlpost.envs import agent as agent_env
from rlpost.envs import protocol


def _reset(task, seed):
  del seed
  return task, task["question"] + " Use the calculator."


def _step(task, text):
  numbers = re.findall(r"-?\d+", text)
  reward = float(bool(numbers) and numbers[-1] == task["answer"])
  return protocol.Step(task, "", reward, True, {"success": reward > 0})


def make() -> protocol.EnvTasks:
  tasks = lambda seeds: [agent_env.arithmetic_task(s) for s in seeds]
  env = protocol.Env("calculator", _reset, _step, max_turns=3)
  return protocol.EnvTasks(env, tasks, tasks, content_key=lambda task, seed: task["question"])
