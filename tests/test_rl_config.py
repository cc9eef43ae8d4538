"""The RL recipe's typed config (`rlpost.recipes.rl_config`): built once at the entry, every
block typed and checked there, and nothing below reads the ConfigDict."""

import dataclasses

import ml_collections
import pytest

from conftest import with_overrides
from experiments.configs import grpo_gsm8k, ppo_gsm8k
from rlpost import errors
from rlpost.recipes import rl
from rlpost.recipes import rl_config


def test_every_block_is_typed_and_the_settings_are_the_learners():
  """`parse` turns each block into the dataclass that owns it; the learner's settings are
  made from those blocks (PPO's critic too). Mutation caught: the critic block left out
  of PPO's RLConfig (its settings fail)."""
  c = rl.check_config(ppo_gsm8k.get_config("tiny"))
  assert isinstance(c, rl_config.RLConfig) and c.learner == "ppo"
  for field in dataclasses.fields(c):
    value = getattr(c, field.name)
    assert not isinstance(value, ml_collections.ConfigDict), field.name
  assert c.critic is not None and c.settings.algo is c.algo
  assert c.settings.rows == c.train.batch_tasks * c.algo.num_generations
  g = rl.check_config(grpo_gsm8k.get_config("tiny"))
  assert g.critic is None and g.env_name == "digit" and g.settings.forward.model.family


@pytest.mark.parametrize(
  "overrides,match",
  [
    ({"model.weights": "onnx"}, r"config\.model\.weights='onnx': use one of"),
    ({"model.dtype": "float16"}, r"config\.model\.dtype='float16': use one of"),
    ({"lora.nosuch": 1}, r"config\.lora\.nosuch: no such field"),
  ],
)
def test_the_model_and_lora_blocks_check_their_fields(overrides, match):
  """Mutation caught: ModelBlock without its checks (a bad dtype reaches the loader)."""
  with pytest.raises(errors.ConfigError, match=match):
    rl.check_config(with_overrides(grpo_gsm8k.get_config("tiny"), overrides))
