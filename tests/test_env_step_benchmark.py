"""experiments.benchmarks.env_step: every adapter of its table builds and plays (no model,
no timing asserted)."""

import pytest
from optional_packages import require

from conftest import import_main

env_step = import_main("experiments.benchmarks.env_step")


@pytest.mark.parametrize("label", sorted(env_step.ADAPTERS))
def test_each_adapter_of_the_benchmark_plays(label):
  """A few timed steps of each adapter: episodes end and restart, every figure is a
  non-negative number. Mutation caught: `time_adapter` never resetting an episode (a
  finished reasoning-gym episode stepped again: episodes == 0)."""
  for module in ("reasoning_gym", "gymnasium", "textarena"):
    require(module)
  block, replies = env_step.ADAPTERS[label]
  result = env_step.time_adapter(block, replies, steps=12, max_turns=3)
  assert result["episodes"] >= 3 and result["first_observation_chars"] > 0
  assert min(result["step_ms"], result["reset_ms"], result["step_s_median"]) >= 0
