"""The example agents (experiments/examples/), written only against the `openai` client,
trained through the endpoint on the real Gemma 3 270M: KIND = calculator (built-in
arithmetic tasks, the calculator offered as an OpenAI tool) | frozenlake (4x4 maps, a
move per reply). The conversation is rendered by the model's own chat template and its
tool calls parsed in its own format (issue 66). A plumbing demonstration: a few
iterations, LoRA, no learning claim.

Command:
  python -m experiments.agentic --config=experiments/configs/agentic_runs/agent_gemma3.py:KIND \
    --config.train.compute_dtype=float32 --workdir=DIR       # KIND,ppo for PPO

Result (4 iterations each, session 74; experiments/results/INDEX.md): both run end to end;
the base model's replies earn the FrozenLake agent -0.8 (no valid move) and the
calculator agent 0 (no tool call, no right answer) on every episode: no learning signal.
"""

import ml_collections

from experiments.configs.agentic_runs import agent_tiny

AGENTS = {
  "calculator": ("experiments.examples.calculator_agent:run", "arithmetic", 48),
  "frozenlake": ("experiments.examples.frozenlake_agent:run", "frozenlake", 8),
}


def get_config(variant: str = "calculator") -> ml_collections.ConfigDict:
  c = agent_tiny.agent_config("frozenlake_gemma3", variant, AGENTS, total_tokens=256, size=4)
  kind, _, algo = variant.partition(",")
  c.name = f"agent_gemma3:{kind},{algo or 'grpo'}"
  c.env.timeout_s = 600.0
  if algo == "ppo":
    c.algo.critic_warmup_steps = 1  # the actor trains from iteration 2
  c.rollout.max_prompt_tokens = 1024
  c.eval.every, c.eval.num_tasks = 0, 4
  c.log.trajectories_every = 1
  c.checkpoint.every = 1
  return c
