"""An agent written against the `openai` client, trained through the endpoint on the random
tiny model (byte tokenizer): KIND = calculator (experiments/examples/calculator_agent.py on
built-in arithmetic tasks) | frozenlake (experiments/examples/frozenlake_agent.py on 2x2
maps). Plumbing runs, not learning results.

Command:
  python -m experiments.agentic --config=experiments/configs/agentic_runs/agent_tiny.py:KIND \
    --workdir=DIR       # KIND,ppo for PPO; --config.env.tasks=jsonl --config.env.path=F.jsonl
"""

import ml_collections

from experiments.configs import agentic

AGENTS = {
  "calculator": ("experiments.examples.calculator_agent:run", "arithmetic", 24),
  "frozenlake": ("experiments.examples.frozenlake_agent:run", "frozenlake", 4),
}


def get_config(variant: str = "calculator") -> ml_collections.ConfigDict:
  kind, _, algo = variant.partition(",")
  if kind not in AGENTS:
    raise ValueError(f"agent_tiny:{kind}: use one of {sorted(AGENTS)}")
  agent, tasks, turn_tokens = AGENTS[kind]
  env = ml_collections.ConfigDict(
    # fields: rlpost/envs/agent.py (tasks: jsonl | arithmetic | frozenlake)
    {"name": "agent", "agent": agent, "tasks": tasks, "path": "", "size": 2}
  )
  env.timeout_s, env.threads = 120.0, 16
  c = agentic.base("frozenlake_tiny", algo or "grpo", env, total_tokens=192)
  c.name = f"agent_tiny:{kind},{algo or 'grpo'}"
  c.algo.num_generations = 4
  c.algo.beta = 0.0
  c.rollout.template = "chat"
  c.rollout.max_turn_tokens = turn_tokens  # the endpoint's cap on a request's max_tokens
  c.rollout.stop_strings = ()
  c.rollout.max_prompt_tokens = 768
  c.sampling.prompt_bucket = 64
  c.train.steps = 4
  c.train.batch_tasks = 2
  c.train.compute_dtype = "float32"
  c.eval.every, c.eval.num_tasks = 0, 2
  c.log.trajectories_every = 0
  c.checkpoint.every = 1000
  return c
