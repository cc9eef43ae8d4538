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


def test_export_writes_a_four_bit_base_as_float(tmp_path):
  """A QLoRA model exports as float32: the NF4 matrices' values (adapters merged in float
  over `quant4.dequantized`) read back exactly by the HF loader.
  Mutation caught: `export_hf_checkpoint` not dequantising (np.asarray of a Packed4)."""
  from test_weights import TINY_INFO, random_params  # pylint: disable=g-import-not-at-top

  from rlpost.models import lora  # pylint: disable=g-import-not-at-top
  from rlpost.models.weights import safetensors as st  # pylint: disable=g-import-not-at-top

  info = dict(TINY_INFO, embed_dim=64, mlp_dim=128, head_dim=32)
  params = quant4.quantize_layers(jax.tree.map(np.asarray, random_params(info)))
  cfg = lora.LoraConfig(rank=2, alpha=4.0)
  adapters = lora.init_adapters(jax.random.key(0), params, cfg)
  adapters = jax.tree.map(lambda a: a + 0.1, adapters)
  merged = lora.merge(quant4.dequantized(params), adapters, cfg)
  st.export_hf_checkpoint(merged, info, tmp_path / "merged")
  loaded, _ = st.load_hf_checkpoint(tmp_path / "merged")
  np.testing.assert_array_equal(loaded["layers"]["up"], merged["layers"]["up"])
  st.export_hf_checkpoint(params, info, tmp_path / "base")
  base, _ = st.load_hf_checkpoint(tmp_path / "base")
  np.testing.assert_array_equal(base["layers"]["q"], quant4.dequantize(params["layers"]["q"]))
