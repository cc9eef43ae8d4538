"""Rollouts on devices of their own (`mesh.rollout`): the weights reach them device to
device and bitwise, and a run sampling there trains as one sampling on the trainer's
devices. 8 simulated CPU devices split 4 + 4, in a subprocess."""

import jax
import numpy as np
import pytest

from conftest import run_with_devices
from rlpost.train import sharding


def check_sync_is_device_to_device_and_bitwise():
  """Run in the 8-device subprocess (see the test below)."""
  from rlpost.models import decoder, lora
  from test_gemma3 import CONFIG

  config = sharding.MeshConfig(data=2, fsdp=2, rollout=4)
  trainer, rollout = sharding.make_mesh(config), sharding.rollout_mesh(config)
  trainer_ids = {d.id for d in trainer.devices.flat}
  rollout_ids = {d.id for d in rollout.devices.flat}
  assert trainer_ids == {0, 1, 2, 3} and rollout_ids == {4, 5, 6, 7}
  params = decoder.init_params(jax.random.key(0), CONFIG)
  adapters = lora.init_adapters(jax.random.key(1), params, lora.LoraConfig(rank=4))
  tree = sharding.shard({"params": params, "adapters": adapters}, trainer)
  assert any(
    len(x.sharding.device_set) == 4 and not x.is_fully_replicated for x in jax.tree.leaves(tree)
  )
  with jax.transfer_guard_host_to_device("disallow"), jax.transfer_guard_device_to_host("disallow"):
    synced = sharding.sync(tree, rollout)
    jax.block_until_ready(synced)
  for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(synced)):
    assert {d.id for d in b.sharding.device_set} == rollout_ids and b.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_weights_reach_the_rollout_devices_without_a_host_round_trip():
  """Trainer on devices 0-3 (data 2 x fsdp 2, weights split), sampler on 4-7: after
  `sync` every leaf is replicated on 4-7 and bitwise equal, with host transfers
  disallowed. Mutation caught: a copy through host memory (np.asarray, then device_put)."""
  run_with_devices(
    "import test_rollout_mesh; test_rollout_mesh.check_sync_is_device_to_device_and_bitwise()",
    devices=8,
  )


def check_split_run_equals_shared_run(tmp: str, int8: bool = False):
  """Run in the 8-device subprocess (see the test below)."""
  from conftest import run_metrics, with_overrides
  from experiments.configs import grpo_gsm8k
  from rlpost.recipes import rl

  synced = []  # what each device-to-device copy onto the rollout devices moves
  inner = sharding.place

  def recording(tree, target):
    synced.append({sharding.path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)})
    return inner(tree, target)

  sampled_on = []
  play = rl._play

  def sampling(p, pool, params, *args):
    sampled_on.append({d.id for d in jax.tree.leaves(params)[0].sharding.device_set})
    assert ("unembed" in params) == int8  # the int8 copy, or the weights themselves
    return play(p, pool, params, *args)

  base = {"train.steps": 3, "lora.enabled": True, "mesh.data": 4, "train.micro_batch_size": 4}
  if int8:
    base |= {"sampling.weights": "int8", "sampling.int8_paths": "oik:0", "algo.tis_cap": 2.0}
  states = {}
  sharding.place, rl._play = recording, sampling
  try:
    for name, rollout in (("shared", 0), ("split", 4)):
      cfg = with_overrides(grpo_gsm8k.get_config("tiny"), {**base, "mesh.rollout": rollout})
      states[name] = rl.run(cfg, f"{tmp}/{name}")
      devices = {4, 5, 6, 7} if rollout else {0, 1, 2, 3}
      assert len(sampled_on) == 3 and all(ids == devices for ids in sampled_on), sampled_on
      sampled_on.clear()
  finally:
    sharding.place, rl._play = inner, play
  shared, split = run_metrics(f"{tmp}/shared"), run_metrics(f"{tmp}/split")
  assert len(shared) == len(split) == 3
  for a, b in zip(shared, split):
    for key in ("reward/mean", "loss", "grad_norm", "kl"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-7, err_msg=key)
  for a, b in zip(*(jax.tree.leaves(states[n].trainable) for n in ("shared", "split"))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
  # LoRA: the base moves once; then each iteration only the adapters (and the key).
  assert len(synced) == 1 + 3 and "embed" in synced[0]
  for leaves in synced[1:]:
    assert leaves and all(
      "embed" not in p and ("/a" in p or "/b" in p or p == "1") for p in leaves
    ), leaves


def check_rows_split_over_sampler_devices():
  """Run in the 8-device subprocess (see the test below)."""
  from rlpost import continuation
  from test_multiturn import _counting_env, _random_params, _rollout

  params = _random_params(0)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[4:]), ("data",))
  replicated = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.P()))
  single = jax.device_put(params, jax.devices()[0])
  seen = []  # per sampler call: (rows, devices its row inputs are split over)
  inner = {name: getattr(continuation, name) for name in ("start", "extend")}

  def recording(name, position):
    def call(*args, **kwargs):
      ids = args[position]
      split = getattr(ids, "sharding", None)
      blocks = 1 if split is None or split.is_fully_replicated else len(split.device_set)
      seen.append((len(ids), blocks))
      return inner[name](*args, **kwargs)

    return call

  continuation.start, continuation.extend = recording("start", 5), recording("extend", 7)
  narrow = 0
  try:
    for seeds, G in (([0, 1, 2, 3], 2), ([4, 5], 4)):  # 4 prompts split; 2 prompts: a row each
      env = _counting_env([])
      whole, _ = _rollout(env, seeds, G=G, total=400, params=single)
      assert all(n == 1 for _, n in seen), seen
      seen.clear()
      split, _ = _rollout(_counting_env([]), seeds, G=G, total=400, params=replicated)
      assert seen[0] == (len(seeds) * G, 4), seen  # the first turn: every row, 4 blocks
      assert all(n == (4 if rows % 4 == 0 else 1) for rows, n in seen), seen
      narrow += sum(rows < 4 for rows, _ in seen)  # later turns too narrow to split
      seen.clear()
      np.testing.assert_array_equal(split.batch.tokens, whole.batch.tokens)
      np.testing.assert_array_equal(split.rewards, whole.rewards)
      np.testing.assert_allclose(split.batch.sampler_logp, whole.batch.sampler_logp, atol=1e-5)
    assert narrow, "no sampler call narrower than the 4 devices"
  finally:
    continuation.start, continuation.extend = inner["start"], inner["extend"]


@pytest.mark.slow
def test_a_run_sampling_on_its_own_devices_trains_as_one_sampling_on_the_trainers(tmp_path):
  """GRPO tiny with LoRA, 3 iterations, trainer on 4 devices (data=4): sampling on 4 other
  devices gives the same rewards, losses and adapters as sampling on the trainer's, and
  per iteration only the adapters are copied (the base once); the same with the
  sampler's int8 copy (made per sync on the sampler's devices, in the "oik" layout).
  Both in one 8-device subprocess (its start-up and shared programs paid once).
  Mutation caught: the adapters not reaching the rollout devices (`sampler_weights`
  syncing zeros for them: the sampler keeps the base). Then multi-turn rollouts (the
  counting environment, episodes of 1-3 turns) with the weights replicated on 4 sampler
  devices equal those on one device (tokens, rewards; logprobs within 1e-5): every row
  input of a sampler call whose rows divide by 4 is split over the 4 devices (each
  samples its block; 2 prompts x 4 samples: a prompt per row), narrower later turns run
  whole. Mutation caught: `sampling.row_sharding` returning None (rows replicated). Slow (~17 s warm, ~60 s cold on a loaded machine): 4 GRPO runs."""
  run_with_devices(
    "import test_rollout_mesh\n"
    f"test_rollout_mesh.check_split_run_equals_shared_run({str(tmp_path / 'model')!r})\n"
    f"test_rollout_mesh.check_split_run_equals_shared_run({str(tmp_path / 'int8')!r}, int8=True)\n"
    "test_rollout_mesh.check_rows_split_over_sampler_devices()",
    devices=8,
  )
