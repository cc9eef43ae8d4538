"""A FrozenLake agent, written only against the `openai` client (issue 68).

  python -m experiments.agentic \
    --config=experiments/configs/agentic_runs/agent_tiny.py:frozenlake --workdir=DIR

The agent holds the game (`rlpost.envs.frozenlake`'s rules, pure functions): it shows the
board as a user message, reads a move from each reply, and sends the next board, for up
to task["max_turns"] turns. The reward is the game's (1.0 on the goal).
"""

from rlpost.envs import frozenlake

MODEL = "policy"  # the name the training endpoint serves (rlpost.envs.agent.MODEL_NAME)


def run(client, task: dict) -> float:
  """One episode on task {"map", "seed", "max_turns"}; the sum of the game's rewards."""
  game = frozenlake.make_env(size=len(task["map"]), max_turns=task["max_turns"], style="char")
  state, board = game.reset(task["map"], task["seed"])
  messages, total = [{"role": "user", "content": board}], 0.0
  for _ in range(task["max_turns"]):
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    text = reply.choices[0].message.content or ""
    step = game.step(state, text)
    total += step.reward
    if step.done:
      break
    state = step.state
    messages += [
      {"role": "assistant", "content": text},
      {"role": "user", "content": step.observation},
    ]
  return total
