"""QLoRA (`model.base_bits=4`): a frozen NF4 base under float32 LoRA adapters. A tiny SFT
run learns as the float base's does, saves only the adapters and their optimizer state,
and resumes exactly (the 4-bit base is rebuilt from the model, not restored)."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import run_metrics
from conftest import with_overrides

from experiments.configs import dpo as dpo_configs
from experiments.configs import grpo_gsm8k
from experiments.configs import ppo_gsm8k
from experiments.configs import sft as sft_configs
from rlpost.models import loading
from rlpost.models import quant4
from rlpost.recipes import common
from rlpost.recipes import dpo as dpo_recipe
from rlpost.recipes import rl
from rlpost.recipes import sft as sft_recipe
from rlpost.supervised import dpo as dpo_lib
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


def _nf4_valued_float_base(monkeypatch):
  """Makes every model load give a float32 base holding exactly the NF4 base's values
  (`dequantized(quantize_layers(...))`): a LoRA run over it is the float-base run a QLoRA
  run must follow (NF4 of those values is the same NF4: each block's absmax is a level)."""
  load = loading.load_model

  def load_nf4_valued(*args, **kwargs):
    config, params, tok = load(*args, **kwargs)
    return config, quant4.dequantized(quant4.quantize_layers(params)), tok

  monkeypatch.setattr(loading, "load_model", load_nf4_valued)


def _capture_learners(monkeypatch) -> list:
  """The learners `rl.build` makes from now on, appended to the returned list."""
  built, real_build = [], rl.build

  def build(*args, **kwargs):
    pieces = real_build(*args, **kwargs)
    built.append(pieces.learner)
    return pieces

  monkeypatch.setattr(rl, "build", build)
  return built


RL_STEPS = 3


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_qlora_rl_follows_the_float_base_run(recipe, tmp_path, monkeypatch):
  """GRPO (beta > 0: a KL reference) and PPO (a LoRA critic over the same base), 3 tiny
  iterations with int4 rollouts: the QLoRA run and the LoRA run over a float32 base of the
  same values sample the same rewards and reach the same losses (the first iteration's
  within float rounding, later ones within 10%: see below) and adapters (dense4 against
  a float matmul); the QLoRA learner's reference and frozen base
  are the 4-bit base itself (no float copy); both save the same arrays (adapters and
  optimizer state only).
  Mutation caught: `dense4`'s backward pass returning a zero dx (the adapters below the
  last layer would get no gradient)."""
  module = {"grpo": grpo_gsm8k, "ppo": ppo_gsm8k}[recipe]
  overrides = {
    "lora.enabled": True,
    "sampling.weights": "int4",
    # XLA's exact dequantised dots: the native kernel's int8 activations round the two
    # runs' sampler copies apart (a step function), which TIS then carries into B
    "sampling.int4_matmul": "xla",
    "algo.tis_cap": 2.0,
    "train.steps": RL_STEPS,
    "checkpoint.every": RL_STEPS,
  }
  if recipe == "ppo":
    overrides["algo.critic_warmup_steps"] = 1
  runs, learners = {}, _capture_learners(monkeypatch)
  for bits in (4, 32):
    if bits == 32:
      _nf4_valued_float_base(monkeypatch)
    cfg = with_overrides(module.get_config("tiny"), {**overrides, "model.base_bits": bits})
    workdir = tmp_path / f"b{bits}"
    state = rl.run(cfg, str(workdir))
    runs[bits] = run_metrics(workdir), jax.device_get(state.trainable), _saved_layout(workdir)
  (m4, t4, saved4), (m32, t32, saved32) = runs[4], runs[32]
  assert [r["reward/mean"] for r in m4] == [r["reward/mean"] for r in m32]
  for key in ("loss", "kl"):  # GRPO's losses ~1e-3: an absolute tolerance too
    # The first iteration's rollouts are the same tokens (B starts at 0: both sampler
    # copies quantise the same values); after an update each run requantises its own
    # merged weights, float rounding apart, and a code that flips can part one sampled
    # token (a step function: PPO's third loss 4% apart on AMD Zen 3, equal rewards).
    first, later = (lambda m: m[0][key]), (lambda m: [r[key] for r in m[1:]])
    np.testing.assert_allclose(first(m4), first(m32), rtol=1e-2, atol=1e-4)
    np.testing.assert_allclose(later(m4), later(m32), rtol=1e-1, atol=1e-4)
  gaps = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), t4, t32))
  moved = [float(np.max(np.abs(ab["b"]))) for ab in t4["policy"]["layers"].values()]
  # each B moved by Adam steps ~lr 3e-2; a parted token moves some B's apart by a fraction
  # of a step (0.25 of the least-moved B's path in PPO on AMD Zen 3), while an adapter
  # that gets no gradient does not move at all
  assert max(gaps) < 0.5 * min(moved), (gaps, moved)
  qlora = learners[0]
  for tree in (qlora.frozen, qlora.ref_params) if recipe == "grpo" else (qlora.frozen,):
    assert all(isinstance(tree["layers"][n], quant4.Packed4) for n in ("q", "down"))
  assert saved4 == saved32 and not any("uint8" in v for v in saved4.values()), saved4


@pytest.mark.slow
def test_qlora_dpo_learns_as_the_float_base(tmp_path, monkeypatch):
  """DPO (its reference: the frozen base without adapters) and SimPO (reference-free), 4
  LoRA steps on the tiny synthetic pairs: DPO's loss falls from log 2 over the float32
  base and by at least 0.8 of that over the NF4 base, whose reference pass read the
  4-bit base (no float copy); SimPO's QLoRA loss falls too, with no reference made; the
  QLoRA checkpoints hold what the float one does.
  Mutation caught: `common.load_model` ignoring base_bits (no Packed4 in the base)."""
  reference_inputs = []
  make_reference_fn = dpo_lib.make_reference_fn

  def recording_reference_fn(*args, **kwargs):
    ref_fn = make_reference_fn(*args, **kwargs)
    return lambda params, batch: (reference_inputs.append(params), ref_fn(params, batch))[1]

  monkeypatch.setattr(dpo_lib, "make_reference_fn", recording_reference_fn)
  falls = {}
  for loss, bits in (("dpo", 32), ("dpo", 4), ("simpo", 4)):
    cfg = dpo_configs.get_config("tiny")
    cfg.loss, cfg.lora.enabled, cfg.model.base_bits = loss, True, bits
    cfg.train.steps, cfg.checkpoint.every = 4, 4
    workdir = tmp_path / f"{loss}{bits}"
    dpo_recipe.run(cfg, str(workdir))
    losses = _losses(workdir)
    falls[loss, bits] = losses[0] - losses[-1], _saved_layout(workdir)
  assert falls["dpo", 32][0] > 0.1 and falls["dpo", 4][0] > 0.8 * falls["dpo", 32][0], falls
  assert falls["simpo", 4][0] > 0.1, falls
  assert falls["dpo", 4][1] == falls["dpo", 32][1], falls
  assert len(reference_inputs) == 2 * 4  # a reference pass per DPO step, none for SimPO
  assert isinstance(reference_inputs[-1]["layers"]["q"], quant4.Packed4)


def test_qlora_embedding_follows_the_trainer_matmul_dtype():
  """base_bits=4 keeps the frozen embedding in bfloat16 where the trainer's matmuls are
  bfloat16 (`common.qlora_embed_dtype`), as loaded (float32) where they are float32.
  Mutation caught: `qlora_embed_dtype` always giving model.dtype."""
  for compute, dtype in (("bfloat16", jax.numpy.bfloat16), ("float32", np.float32)):
    cfg = _config(4)
    cfg.train.compute_dtype = compute
    _, params, _ = common.load_model(cfg)
    assert params["embed"].dtype == dtype and isinstance(params["layers"]["q"], quant4.Packed4)
