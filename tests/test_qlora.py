"""QLoRA (`model.base_bits=4`): a frozen NF4 base under float32 LoRA adapters. A tiny SFT
run learns as the float base's does, saves only the adapters and their optimizer state,
and resumes exactly (the 4-bit base is rebuilt from the model, not restored)."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import run_metrics

from experiments.configs import sft as sft_configs
from rlpost.models import quant4
from rlpost.recipes import common
from rlpost.recipes import sft as sft_recipe
from rlpost.train import checkpoint


def _config(bits: int, every: int = 100, **train):
  cfg = sft_configs.get_config("tiny")
  cfg.eval.every = 0
  cfg.lora.enabled = True
  cfg.model.base_bits = bits
  cfg.data.num_synthetic = 16
  cfg.data.pack = True
  cfg.checkpoint.every = every
  cfg.train.learning_rate = 1e-2
  for key, value in train.items():
    cfg.train[key] = value
  return cfg


def _losses(workdir) -> list[float]:
  return [r["loss"] for r in run_metrics(workdir)]


def _saved_layout(workdir) -> dict[str, str]:
  """{array path: "dtype[shape]"} of the newest checkpoint (its meta's digests)."""
  mngr = checkpoint.manager(workdir, read_only=True)
  meta = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
  return {k: v.rsplit(":", 1)[0] for k, v in meta["meta"]["digests"].items()}


@pytest.mark.slow
def test_qlora_sft_learns_as_the_float_base_and_saves_only_adapters(tmp_path):
  """12 LoRA steps on 16 examples, float32 base and NF4 base (blocks of 32 on the tiny
  width): the float run's loss falls by > 0.2 (first step to the mean of the last 3) and
  the 4-bit run's by at least 0.8 of that;
  the base the trainer read was 4-bit; both runs' checkpoints hold the same bytes
  (adapters and AdamW state; the base is rebuilt from the model on resume): same
  arrays, dtypes and shapes.
  Mutation caught: `common.load_model` ignoring base_bits (no Packed4 in the base)."""
  ends = {}
  for bits in (32, 4):
    workdir = str(tmp_path / f"b{bits}")
    state, _ = sft_recipe.run(_config(bits, steps=12), workdir)
    losses = _losses(workdir)
    ends[bits] = (losses[0] - np.mean(losses[-3:]), _saved_layout(workdir))
    assert set(jax.device_get(state.trainable)) == {"layers"}
  assert ends[32][0] > 0.2 and ends[4][0] > 0.8 * ends[32][0], ends
  assert ends[4][1] == ends[32][1], ends
  assert not any("uint8" in v for v in ends[4][1].values())
  _, params, _ = common.load_model(_config(4))
  assert all(isinstance(params["layers"][n], quant4.Packed4) for n in ("q", "down"))


@pytest.mark.slow
def test_qlora_resume_is_exact(tmp_path):
  """2 steps straight against 1 + 1 with a resume in between: equal adapters bit for bit
  (the NF4 base is quantised again from the same weights: deterministic)."""
  straight, _ = sft_recipe.run(_config(4, every=1, steps=2), str(tmp_path / "a"))
  sft_recipe.run(_config(4, every=1, steps=2), str(tmp_path / "b"), stop_after=1)
  resumed, _ = sft_recipe.run(_config(4, every=1, steps=2), str(tmp_path / "b"))
  assert int(resumed.step) == 2
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.device_get(straight.trainable),
    jax.device_get(resumed.trainable),
  )


def test_four_bit_base_needs_lora(tmp_path):
  cfg = _config(4)
  cfg.lora.enabled = False
  with pytest.raises(ValueError, match=r"model\.base_bits=4: a 4-bit base is frozen"):
    sft_recipe.run(cfg, str(tmp_path))
