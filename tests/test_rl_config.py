"""The RL recipe's typed config (`rlpost.recipes.rl_config`): built once at the entry, every
block typed and checked there, and nothing below reads the ConfigDict."""

import dataclasses

import ml_collections
import pytest

from conftest import run_metrics, with_overrides
from experiments.configs import agentic, grpo_gsm8k, ppo_gsm8k
from rlpost import errors
from rlpost.recipes import rl
from rlpost.recipes import rl_config


def _poison(monkeypatch):
  """Every read of a ConfigDict's fields raises from now on."""

  def boom(self, *args, **kwargs):
    raise AssertionError(f"a ConfigDict was read below the entry: {args[:1]}")

  for name in ("__getattr__", "__getitem__", "get", "__contains__", "keys", "items"):
    monkeypatch.setattr(ml_collections.ConfigDict, name, boom)


@pytest.mark.slow
@pytest.mark.parametrize(
  "config,steps",
  [
    (grpo_gsm8k.get_config("tiny"), 2),
    (ppo_gsm8k.get_config("tiny"), 3),
    (agentic.get_config("frozenlake_tiny,ppo"), 3),
  ],
  ids=["grpo", "ppo", "agentic_ppo"],
)
def test_below_the_entry_nothing_reads_the_configdict(config, steps, monkeypatch, tmp_path):
  """`rl.run` hands `build` an RLConfig; from there on (model, learner, sampler, loop,
  checkpoints, evaluation) every ConfigDict read raises, and the run still completes.
  Mutation caught: `rl.run` handing `build` the ConfigDict (build parses it again)."""
  real_build = rl.build

  def build(c, *args, **kwargs):
    _poison(monkeypatch)
    return real_build(c, *args, **kwargs)

  monkeypatch.setattr(rl, "build", build)
  cfg = with_overrides(config, {"train.steps": steps, "checkpoint.every": 1})
  rl.run(cfg, str(tmp_path))
  monkeypatch.undo()
  records = [r for r in run_metrics(tmp_path) if r["step"]]  # an evaluation's step 0 aside
  assert len(records) == steps and (tmp_path / "config.json").is_file()


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
