"""A prompt dataset's task as a one-turn environment: how the RL recipe trains on prompts.

reset(problem, seed) shows the task's prompt; the first assistant turn is
scored with the task's reward functions (on `completion_prefix + text`, as a
single-turn sampler's completion is scored) and ends the episode. Rolled out with
the scaffold `make_env` returns, the RL batch equals one single-turn sampler call's
bit for bit (tested in tests/test_multiturn.py against that path).
"""

from rlpost import rewards as rewards_lib
from rlpost.data import prompts as prompts_lib
from rlpost.data import tasks
from rlpost.envs import protocol


def make_env(task: tasks.Task, template: str, tokenizer=None) -> tuple[protocol.Env, str]:
  """(env, scaffold template) of `task` under a data template (fewshot | chat | plain);
  the reward functions' prompt is the text the model is shown, in `tokenizer`'s chat
  format (None: Gemma's)."""
  kind, _, system = prompts_lib.prompt_observation(
    task.problems[0], template, task.examples, task.system
  )
  prefix = prompts_lib.completion_prefix(template)

  def reset(problem, seed: int):
    del seed  # nothing random in a fixed prompt
    return problem, prompts_lib.prompt_observation(problem, template, task.examples, task.system)[1]

  def step(problem, text: str) -> protocol.Step:
    prompt = prompts_lib.prompt_text(problem, template, task.examples, task.system, tokenizer)
    reward, info = score(task, prompt, prefix + text, problem.final)
    return protocol.Step(problem, "", reward, True, info)

  stops = prompts_lib.STOP_STRINGS if template != "plain" else ()
  env = protocol.Env("single_turn", reset, step, max_turns=1, stop_strings=stops, system=system)
  return env, kind


def score(task: tasks.Task, prompt: str, completion: str, truth: str) -> tuple[float, dict]:
  """(sum of the task's rewards, info: its accuracy flags, each reward function's value
  `reward/<name>` and its error count `reward/<name>/errors`, and `answer`: `truth`).

  The sum is taken in float32, in the reward functions' order, as the single-turn
  batch's rewards always were."""
  per_fn, errors = rewards_lib.score(task.reward_fns, [prompt], [completion], [truth])
  info = {name: fn(completion, truth) for name, fn in task.accuracy_fns.items()}
  info.update({f"reward/{name}": float(v[0]) for name, v in per_fn.items()})
  info.update({f"reward/{name}/errors": n for name, n in errors.items()})
  info["answer"] = truth
  return float(sum(v[0] for v in per_fn.values())), info
