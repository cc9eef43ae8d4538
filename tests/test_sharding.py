"""The (data, fsdp) mesh: partition rules, and one train step agreeing across meshes.

The multi-device checks run in a subprocess with 8 simulated CPU devices (the
device count is fixed when JAX starts). Weights are compared after one SGD step
with learning rate 1 and no clipping, so the update IS the gradient: a sum
instead of a mean over devices, or a shard's gradient left unreduced, shows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from conftest import run_with_devices
from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import lora as lora_lib
from rlpost.models import policy
from rlpost.rl import objectives
from rlpost.rl.batch import RLBatch
from rlpost.supervised import sft
from rlpost.train import sharding
from rlpost.train import step as train

# Every dimension divides by 4 (vocab 264, not the byte tokenizer's 261); in ODD_VOCAB
# the (tied) embedding does not split and stays replicated.
CONFIG = families.get_config("tiny", vocab_size=264)
ODD_VOCAB = families.get_config("tiny", vocab_size=262)
ROWS, SEQ = 8, 24


def test_rules_split_layer_weights_on_their_first_weight_dim():
  specs = sharding.tree_specs(decoder.init_params(jax.random.key(0), CONFIG), _mesh_like(4))
  assert specs["embed"] == P(sharding.FSDP)
  assert specs["layers"]["q"] == P(None, sharding.FSDP)
  assert specs["layers"]["down"] == P(None, sharding.FSDP)
  assert sharding.leaf_spec("final_norm", (30,), 4) == P()  # 30 does not split: replicated
  assert sharding.leaf_spec("actor/layers/q/b", (2, 16, 64), 4) == P(None, sharding.FSDP)
  assert sharding.leaf_spec("layers/q", (2, 32, 64), 1) == P()  # fsdp 1: no split at all
  with pytest.raises(ValueError, match="actor/layers/q/b .*divides it"):
    sharding.leaf_spec("actor/layers/q/b", (2, 6, 64), 4)


def test_mesh_settings_fail_with_the_fix():
  with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
    sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4))
  with pytest.raises(ValueError, match=r"MeshConfig\.fsdp=0: use >= 1"):
    sharding.MeshConfig(fsdp=0)
  assert dict(sharding.make_mesh().shape) == {sharding.DATA: jax.device_count(), sharding.FSDP: 1}


class _MeshLike:
  def __init__(self, fsdp):
    self.shape = {sharding.DATA: 1, sharding.FSDP: fsdp}


def _mesh_like(fsdp):
  return _MeshLike(fsdp)


def _sft_batch():
  rng = np.random.default_rng(0)
  examples = []
  for r in range(ROWS):
    n = SEQ - r
    tokens = rng.integers(5, ODD_VOCAB.vocab_size, n).astype(np.int32)
    mask = np.arange(n) >= 6 + r % 3
    examples.append((tokens, mask))
  return sft.make_batch(examples, seq_len=SEQ, pad_id=0, micro_batch_size=1, gather_bucket=8)


def _grpo_batch():
  rng = np.random.default_rng(1)
  T = 10
  tokens = rng.integers(5, CONFIG.vocab_size, (ROWS, SEQ)).astype(np.int32)
  valid = np.ones((ROWS, SEQ), bool)
  valid[:, :3] = np.arange(3)[None] >= (np.arange(ROWS) % 3)[:, None]
  loss_mask = (np.arange(T)[None] < T - np.arange(ROWS)[:, None] % 4).astype(np.float32)
  return RLBatch(
    tokens=tokens,
    positions=np.maximum(np.cumsum(valid, 1) - 1, 0).astype(np.int32),
    valid=valid,
    loss_mask=loss_mask,
    sampler_logp=(-rng.random((ROWS, T)) * loss_mask).astype(np.float32),
    advantages=rng.normal(size=ROWS).astype(np.float32),
  )


def one_step(data: int, fsdp: int, loss: str):
  """(update of every trainable leaf after one SGD(1) step, loss) on a data x fsdp mesh."""
  mesh = sharding.make_mesh(sharding.MeshConfig(data, fsdp), jax.devices()[: data * fsdp])
  if loss == "sft":  # all weights train; the embedding replicated
    params = decoder.init_params(jax.random.key(0), ODD_VOCAB)
    fwd = policy.ForwardConfig(ODD_VOCAB, remat="dots")
    trainable, frozen, batch = params, None, _sft_batch()
    loss_fn = sft.make_loss_fn(sharding.train_forward(fwd, mesh))
  else:  # LoRA adapters over frozen (split) base weights
    params = decoder.init_params(jax.random.key(0), CONFIG)
    fwd = policy.ForwardConfig(CONFIG, lora=lora_lib.LoraConfig(rank=8), remat="dots")
    adapters = lora_lib.init_adapters(jax.random.key(1), params, fwd.lora)
    adapters = jax.tree.map(lambda x: x + 0.01, adapters)  # B != 0: A gets gradients too
    trainable, frozen, batch = {"policy": adapters}, params, _grpo_batch()
    algo = objectives.GRPOConfig(num_generations=2, beta=0.0)
    loss_fn = objectives.make_grpo_loss_fn(algo, sharding.train_forward(fwd, mesh))
  opt = optax.sgd(1.0)
  state = train.place(train.init_train_state(trainable, opt, jax.random.key(2)), mesh)
  before = jax.device_get(state.trainable)
  step = train.make_train_step(loss_fn, opt, mesh, micro_batch_size=1)
  state, metrics = step(state, train.place(frozen, mesh), jax.tree.map(jnp.asarray, batch))
  after = jax.device_get(state.trainable)
  return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), after, before), float(
    metrics["loss"]
  )


def check_meshes_agree():
  """Run in the 8-device subprocess (see the test below)."""
  assert jax.device_count() == 8
  for loss in ("sft", "grpo"):
    ref, ref_loss = one_step(1, 1, loss)
    for data, fsdp in ((8, 1), (2, 4)):
      got, got_loss = one_step(data, fsdp, loss)
      assert abs(got_loss - ref_loss) < 1e-5, (loss, data, fsdp, got_loss, ref_loss)
      for path, a, b in zip(
        jax.tree_util.tree_leaves_with_path(ref), jax.tree.leaves(ref), jax.tree.leaves(got)
      ):
        assert np.abs(a).max() > 0, (loss, path[0])
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=f"{loss} {data}x{fsdp} {path[0]}")
  # fsdp = 4: every device holds a quarter of the weights and AdamW state (+5%)
  mesh = sharding.make_mesh(sharding.MeshConfig(2, 4))
  params = decoder.init_params(jax.random.key(0), CONFIG)
  opt = train.make_optimizer(learning_rate=1e-3, total_steps=10)
  state = train.place(train.init_train_state(params, opt, jax.random.key(0)), mesh)
  loss_fn = sft.make_loss_fn(
    sharding.train_forward(policy.ForwardConfig(CONFIG, remat="dots"), mesh)
  )
  step = train.make_train_step(loss_fn, opt, mesh, micro_batch_size=1)
  for moment in ("placed", "after a step"):
    if moment == "after a step":
      state, _ = step(state, None, jax.tree.map(jnp.asarray, _sft_batch()))
    total = sum(x.nbytes for x in jax.tree.leaves((state.trainable, state.opt_state)))
    held = sharding.device_bytes((state.trainable, state.opt_state))
    assert len(held) == 8 and max(held.values()) <= total / 4 * 1.05, (moment, held, total)


@pytest.mark.slow
def test_data_fsdp_and_one_device_give_the_same_update():
  """SFT (all weights) and GRPO (LoRA over split base weights): one step on 1 device, on
  data=8 and on data=2 x fsdp=4 agree within 1e-5; fsdp=4 holds 1/4 of the bytes.
  Over 20 s: a fresh 8-device process compiles seven train steps (2 losses x 3 meshes,
  and AdamW on 2 x 4), none of them shared with another test.

  Mutations caught: dividing a split leaf's gradient by fsdp twice (or not at all), a
  replicated leaf's gradient left per device, the layer weights not gathered.
  """
  run_with_devices("import test_sharding; test_sharding.check_meshes_agree()", devices=8)


# Which recipes each family runs on the fsdp mesh: every family trains all of its weights
# (SFT) and LoRA adapters over its split base (SFT LoRA, then the refused resume), and
# samples from split weights (GRPO; PPO for llama); DPO and PPO run once. Until session
# 74 every family ran every recipe (15 runs): a recipe's fsdp code is the same for each
# family, and each family's own layer weights are split by every recipe it runs.
FSDP_FAMILY_RUNS = {
  "llama_tiny": ("sft", "ppo"),
  "qwen2_tiny": ("sft", "grpo", "dpo"),
  "qwen3_tiny": ("sft", "grpo"),
}


def check_recipes_run_on_fsdp(tmp: str):
  """Run in the 2-device subprocess (see the test below)."""
  import math
  import shutil

  import test_families
  from conftest import run_metrics, with_overrides
  from experiments.configs import sft as sft_configs
  from rlpost.recipes import sft as sft_recipe

  assert jax.device_count() == 2
  fsdp = {"mesh.fsdp": 2, "checkpoint.every": 1}
  for preset, recipes in FSDP_FAMILY_RUNS.items():
    runs = test_families.run_every_recipe(preset, f"{tmp}/{preset}", fsdp, recipes)
    for k, last in enumerate(runs):
      assert last["step"] == 1 and math.isfinite(last["loss"]), (preset, k, last)
  # SFT (all weights, AdamW): fsdp=2 follows data=2 step by step; a checkpoint written
  # on one mesh resumes on the other. The data=2 run's first two steps are also the
  # switched run's (a copy of its workdir), so 7 steps run where 9 did.
  cfg = lambda mesh: with_overrides(
    sft_configs.get_config("tiny"), {"train.steps": 3, "checkpoint.every": 1, **mesh}
  )
  sft_recipe.run(cfg({"mesh.fsdp": 1}), f"{tmp}/data", stop_after=2)
  shutil.copytree(f"{tmp}/data", f"{tmp}/switch")
  sft_recipe.run(cfg({"mesh.fsdp": 1}), f"{tmp}/data")
  sft_recipe.run(cfg({"mesh.fsdp": 2}), f"{tmp}/switch")
  sft_recipe.run(cfg({"mesh.fsdp": 2}), f"{tmp}/fsdp")
  data, switch, split = (
    [r for r in run_metrics(f"{tmp}/{d}") if "loss" in r] for d in ("data", "switch", "fsdp")
  )
  assert len(data) == len(switch) == len(split) == 3
  for key in ("loss", "grad_norm"):
    for a, b, c in zip(data, switch, split):
      np.testing.assert_allclose([b[key], c[key]], a[key], rtol=1e-5, err_msg=key)


@pytest.mark.slow
def test_every_recipe_runs_on_an_fsdp_mesh(tmp_path):
  """Every recipe and every model family on a 2-device fsdp mesh (issue 37): SFT (LoRA and
  full), DPO, GRPO over prompts and PPO (actor + critic tree) over FrozenLake train a step,
  checkpoint and log on llama_tiny, qwen2_tiny and qwen3_tiny (`FSDP_FAMILY_RUNS`: 10 runs;
  `test_families.run_every_recipe` also refuses a resume with another family); then Gemma's tiny
  SFT matches data parallelism and resumes across the two meshes. Over 20 s (one of the
  suite's longest): one 2-device process builds and compiles ten runs' samplers and
  train steps, none shared with a one-device test; one launch serves all of them (the
  family runs were single-device runs of their own until session 25).

  Mutation caught: the family check on resume dropped (`loop._refuse_another_family`)."""
  run_with_devices(
    f"import test_sharding; test_sharding.check_recipes_run_on_fsdp({str(tmp_path)!r})",
    devices=2,
    timeout=900,
  )


def check_rows_must_split_over_the_trainer_devices():
  """Run in the 4-device subprocess (see the test below)."""
  from conftest import with_overrides
  from experiments.configs import agentic as agentic_configs
  from experiments.configs import grpo_gsm8k, ppo_gsm8k
  from experiments.configs import sft as sft_configs
  from rlpost.recipes import rl
  from rlpost.recipes import sft as sft_recipe

  assert jax.device_count() == 4
  cases = [
    # (check, config, overrides, message): each passes on one device.
    (
      rl,
      grpo_gsm8k,
      "tiny",
      {"train.batch_tasks": 1, "algo.num_generations": 2, "train.micro_batch_size": 1},
      "mesh=",
    ),
    (
      rl,
      grpo_gsm8k,
      "tiny",
      {"train.batch_tasks": 1, "algo.num_generations": 8, "train.micro_batch_size": 4},
      "give 2 rows on each of the 4 devices",
    ),
    (
      rl,
      ppo_gsm8k,
      "tiny",
      {"train.batch_tasks": 8, "algo.mini_batch_size": 8, "train.micro_batch_size": 4},
      "give 2 rows on each of the 4 devices",
    ),
    (
      sft_recipe,
      sft_configs,
      "tiny",
      {"train.batch_size": 8, "train.micro_batch_size": 4},
      "give 2 rows on each of the 4 devices",
    ),
    (
      rl,
      agentic_configs,
      "frozenlake_tiny",
      {"train.batch_tasks": 1, "algo.num_generations": 2, "train.micro_batch_size": 1},
      "mesh=",
    ),
  ]
  for recipe, configs, variant, overrides, message in cases:
    cfg = with_overrides(configs.get_config(variant), overrides)
    try:
      recipe.check_config(cfg)
    except ValueError as e:
      assert message in str(e), (variant, overrides, str(e))
    else:
      raise AssertionError(f"{recipe.__name__} accepted {overrides} on 4 devices")
    one_device = with_overrides(configs.get_config(variant), {**overrides, "mesh.data": 1})
    recipe.check_config(one_device)


def test_batches_that_do_not_split_over_the_devices_fail_naming_the_fields():
  """Before any model loads, not deep inside shard_map: rows must divide over the
  trainer's devices and micro_batch_size (per device) must divide each device's share."""
  run_with_devices(
    "import test_sharding; test_sharding.check_rows_must_split_over_the_trainer_devices()",
    devices=4,
  )
