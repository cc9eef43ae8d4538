"""Your own environment, in your own module, selected without editing the library:

  python -m experiments.agentic --config=experiments/configs/agentic_runs/envs_tiny.py:custom \
    --config.env.name=experiments.examples.my_env:make --workdir=DIR

`make()` returns an EnvSpec: a frozen dataclass of the `env` block's fields (checked in
`__post_init__`; a bad value is one FATAL line naming config.env.<field>) and
`build(config, run) -> EnvTasks`. The task: say the word shown, spelled backwards.
"""

import dataclasses

from rlpost.envs import protocol, table

WORDS = ("lake", "gold", "path", "stone", "river", "cloud", "frost", "pine")


@dataclasses.dataclass(frozen=True)
class ReverseConfig:
  max_turns: int = 1  # model turns per episode

  def __post_init__(self):
    if self.max_turns < 1:
      raise ValueError(f"max_turns={self.max_turns!r}: must be >= 1")


def build(config: ReverseConfig, run: protocol.RunInfo) -> protocol.EnvTasks:
  def reset(task, seed):  # task: None here; the seed picks the word
    word = WORDS[seed % len(WORDS)]
    return word, f"Spell '{word}' backwards: "

  def step(word, text):  # pure: the state (the word) is never changed
    right = text.strip().lower().startswith(word[::-1])
    return protocol.Step(word, "", float(right), True, {"success": right})

  env = protocol.Env("reverse", reset, step, max_turns=config.max_turns)
  none = lambda seeds: [None] * len(seeds)
  return protocol.EnvTasks(env, none, none)


def make() -> table.EnvSpec:
  return table.EnvSpec(ReverseConfig, build)
