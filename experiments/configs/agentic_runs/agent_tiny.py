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


def agent_config(
  model_run: str, variant: str, agents: dict, *, total_tokens: int, size: int
) -> ml_collections.ConfigDict:
  """The blocks an example-agent run shares on any model: `variant` KIND[,ALGORITHM] with
  KIND a key of `agents` ({KIND: (agent, task source, tokens per reply)}), `model_run` the
  agentic run module whose model it trains (`agentic.base`)."""
  kind, _, algo = variant.partition(",")
  if kind not in agents:
    raise ValueError(f"{model_run}:{kind}: use one of {sorted(agents)}")
  agent, tasks, turn_tokens = agents[kind]
  env = ml_collections.ConfigDict(
    # fields: rlpost/envs/agent.py (tasks: jsonl | arithmetic | frozenlake)
    {"name": "agent", "agent": agent, "tasks": tasks, "path": "", "size": size}
  )
  env.timeout_s, env.threads = 120.0, 16
  c = agentic.base(model_run, algo or "grpo", env, total_tokens=total_tokens)
  c.algo.num_generations = 4
  c.rollout.template = "chat"
  c.rollout.max_turn_tokens = turn_tokens  # the endpoint's cap on a request's max_tokens
  c.rollout.stop_strings = ()
  c.sampling.prompt_bucket = 64
  c.train.steps = 4
  c.train.batch_tasks = 2
  return c


def get_config(variant: str = "calculator") -> ml_collections.ConfigDict:
  c = agent_config("frozenlake_tiny", variant, AGENTS, total_tokens=192, size=2)
  kind, _, algo = variant.partition(",")
  c.name = f"agent_tiny:{kind},{algo or 'grpo'}"
  c.algo.beta = 0.0
  c.rollout.max_prompt_tokens = 768
  c.train.compute_dtype = "float32"
  c.eval.every, c.eval.num_tasks = 0, 2
  c.log.trajectories_every = 0
  c.checkpoint.every = 1000
  return c
