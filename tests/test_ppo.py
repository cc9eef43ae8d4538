"""PPO end to end on the tiny model: learning, critic warm-up, first-pass invariants,
exact resume, config errors."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ppo_gsm8k
from rlpost.data.cursor import Cursor
from rlpost.recipes import rl
from rlpost.train import checkpoint
import real_models
from conftest import (
  GSM8K_DIR,
  assert_adapters_trained,
  require_gemma3,
  require_shared,
  run_metrics,
  run_unread_below_entry,
  with_overrides,
)


def _config(variant="tiny", **overrides):
  return with_overrides(ppo_gsm8k.get_config(variant), overrides)


_metrics = run_metrics

# Four iterations (the default two of them critic-only), two epochs per batch, a checkpoint
# every 2: the first-pass test's run is the resume test's uninterrupted one.
MU2 = {"train.steps": 4, "checkpoint.every": 2, "algo.num_iterations": 2}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
  """`straight_run(overrides)`: (final TrainState, workdir) of the uninterrupted tiny run
  with `overrides`, run once per module (nothing mutates the returned state)."""
  done = {}

  def run(overrides):
    key = tuple(sorted(overrides.items()))
    if key not in done:
      workdir = tmp_path_factory.mktemp("straight")
      state, builds = run_unread_below_entry(_config(**overrides), workdir)
      assert builds == 1  # every ConfigDict read below the entry raised (test_grpo)
      done[key] = state, workdir
    return done[key]

  return run


@pytest.mark.slow
@pytest.mark.contracting_codegen
def test_tiny_ppo_learns_and_its_critic_explains_the_returns(tmp_path):
  """The `:tiny` variant as shipped: the reward rises and the critic predicts the returns.
  Over 20 s (26 s cold): every iteration of the shipped variant runs, at LLVM -O1
  (`contracting_codegen`: its programs run long enough to pay for it, not for the
  default's compile; measured at -O1: reward 0.04 -> 8.0, explained variance 0.56)."""
  cfg = _config(**{"checkpoint.every": 100})
  rl.run(cfg, str(tmp_path))
  records = _metrics(tmp_path)
  rewards = [r["reward/mean"] for r in records]
  start, end = np.mean(rewards[:3]), np.mean(rewards[-4:])
  assert end >= start + 2.5, f"reward {start:.2f} -> {end:.2f}: {rewards}"
  ev = np.mean([r["explained_variance"] for r in records[-5:]])
  assert ev > 0.1, [r["explained_variance"] for r in records]
  warmup = cfg.algo.critic_warmup_steps
  assert [r["actor_on"] for r in records[: warmup + 1]] == [0.0] * warmup + [1.0]
  for key in ("vf_clip_frac", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl"):
    assert key in records[-1]
  assert records[-1]["grad_norm/actor"] > 0 and records[-1]["grad_norm/critic"] > 0


def _host(x):
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return np.asarray(x)


def _bytes_equal(a, b):
  leaves_a, leaves_b = map(jax.tree.leaves, (a, b))
  assert len(leaves_a) == len(leaves_b)
  return all(np.array_equal(_host(x), _host(y)) for x, y in zip(leaves_a, leaves_b))


@pytest.mark.slow
@pytest.mark.parametrize("mode,lora", [("full", False), ("lora", True), ("shared", False)])
def test_critic_warmup_freezes_the_actor_and_its_optimizer_state(mode, lora):
  """Warm-up iterations: actor weights AND its AdamW state bitwise unchanged (weight decay
  on), the critic moves; the first iteration after it moves the actor.

  Mutation caught: the gate only zeroing the gradient (AdamW's decay and moment updates
  would still move the actor), and a gate flag that never reaches the optimizer.
  """
  cfg = _config(
    **{
      "lora.enabled": lora,
      "critic.mode": mode,
      "train.weight_decay": 0.1,
      "algo.critic_warmup_steps": 2,
      "train.steps": 4,
    }
  )
  p = rl.build(cfg)
  state, cursor = p.state, Cursor(0, 0, 0)
  actor0 = jax.device_get(state.trainable["policy"])
  actor_opt0 = jax.device_get(state.opt_state.inner_states["policy"])
  critic0 = jax.device_get(state.trainable["critic"])
  for index in range(2):
    state, cursor, metrics = rl.iteration(p, state, cursor, index)
    assert metrics["actor_on"] == 0.0
  assert _bytes_equal(actor0, jax.device_get(state.trainable["policy"]))
  assert _bytes_equal(actor_opt0, jax.device_get(state.opt_state.inner_states["policy"]))
  assert not _bytes_equal(critic0, jax.device_get(state.trainable["critic"]))
  state, cursor, metrics = rl.iteration(p, state, cursor, 2)
  assert metrics["actor_on"] == 1.0
  assert not _bytes_equal(actor0, jax.device_get(state.trainable["policy"]))


@pytest.mark.slow
@pytest.mark.parametrize("micro,whiten", [(16, True), (8, False)])
def test_gae_in_the_train_step_equals_the_separate_value_pass(micro, whiten):
  """A batch used once skips the no-gradient value pass: the step's own values (under
  stop_gradient), GAE in the loss, statistics from summed moments (two micro-batches
  here when whitening is off). Same losses, gradient norms and statistics as with the
  separate pass.

  Mutations caught: in-step values scaled by 0.999, the reference logprobs fed to
  the KL reward as the sampler's, moments averaged instead of summed per micro-batch.
  """
  cfg = _config(
    **{
      "algo.mini_batch_size": None,
      "algo.whiten_advantages": whiten,
      "train.micro_batch_size": micro,
    }
  )
  p = rl.build(cfg)
  assert p.learner.settings.gae_in_step
  state, cursor = p.state, Cursor(0, 0, 0)
  index = cfg.algo.critic_warmup_steps + 2  # critic and actor have both moved (lr 0 at step 0)
  for i in range(index):
    state, cursor, _ = rl.iteration(p, state, cursor, i)
  settings = dataclasses.replace(p.learner.settings, gae_in_step=False)
  separate = p._replace(learner=p.learner._replace(settings=settings))
  copy = jax.tree.map(jnp.copy, state)
  _, _, fused = rl.iteration(p, state, cursor, index)
  _, _, apart = rl.iteration(separate, copy, cursor, index)
  assert not any(k.startswith("moments/") for k in fused)
  keys = (
    "explained_variance", "returns/mean", "returns/std", "values/mean", "values/std",
    "advantages/mean", "advantages/std", "loss", "pg_loss", "vf_loss",
    "grad_norm/actor", "grad_norm/critic",
  )  # fmt: skip
  for key in keys:
    np.testing.assert_allclose(fused[key], apart[key], rtol=2e-4, atol=1e-6, err_msg=key)
  assert fused["values/std"] > 0.01 and fused["kl"] > 1e-6  # controls


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_first_pass_of_every_iteration_has_ratio_one_and_zero_kl(lora, straight_run):
  """num_iterations = 2: old logprobs come from a separate pass, so ratio 1 can fail.
  4 iterations, the actor on from the third (the full-weights run is the resume test's).

  Mutation caught: the reference logprobs fed as the old ones (the actor has moved
  from the reference after the warm-up), and a LoRA split that ignores the adapters.
  """
  state, workdir = straight_run({**MU2, "lora.enabled": lora})
  records = _metrics(workdir)
  assert [r["actor_on"] for r in records] == [0.0, 0.0, 1.0, 1.0]
  for r in records:
    assert abs(r["ratio_mean/first_pass"] - 1.0) < 1e-5, (lora, r["step"])
    assert abs(r["approx_kl/first_pass"]) < 1e-6, (lora, r["step"])
  assert abs(records[0]["kl/first_pass"]) < 1e-6  # actor == reference before it trains
  assert abs(records[-1]["kl/first_pass"]) > 1e-6  # control: the actor moved (k1 may be < 0)
  assert records[0]["sampler_logp_gap/first_pass"] < 1e-4
  if lora:
    assert_adapters_trained(jax.device_get(state.trainable["policy"]))


@pytest.mark.slow
def test_resume_is_bitwise_with_the_warmup_switch_inside_the_resumed_span(straight_run, tmp_path):
  """2 iterations + restart + 2 == 4 straight: actor, critic, both optimizer states, metrics.
  The critic warm-up (2 iterations) ends at the restart: the resumed run must switch the
  actor on at once, its gated AdamW state as saved (the uninterrupted run is shared with
  the first-pass test; was a warm-up of 3 over a separate run)."""
  straight, straight_dir = straight_run({**MU2, "lora.enabled": False})
  cfg = _config(**MU2)
  rl.run(cfg, str(tmp_path / "split"), stop_after=2)
  resumed = rl.run(cfg, str(tmp_path / "split"))
  assert _bytes_equal(straight, resumed)  # the whole TrainState
  assert _metrics(straight_dir) == _metrics(tmp_path / "split")
  assert [r["actor_on"] for r in _metrics(tmp_path / "split")] == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
  "overrides,expected",
  [
    ({"critic.mode": "twin"}, ["config.critic.mode='twin'", "lora, full, shared"]),
    ({"algo.gae_lambda": -0.1}, ["config.algo.gae_lambda=-0.1", "[0, 1]"]),
    ({"algo.critic_lambda": 1.5}, ["config.algo.critic_lambda=1.5", "[0, 1]"]),
    ({"algo.critic_warmup_steps": 40}, ["config.algo.critic_warmup_steps=40", "train.steps=40"]),
    ({"algo.mini_batch_size": 5}, ["config.algo.mini_batch_size=5", "divisor of 16"]),
    ({"train.micro_batch_size": 3}, ["config.train.micro_batch_size=3", "divisor of 8"]),
    ({"critic.learning_rate": -1.0}, ["config.critic.learning_rate=-1.0", "> 0"]),
    # 0 is not "unset" (None is): it must not fall back to 10x the actor's rate.
    ({"critic.learning_rate": 0.0}, ["config.critic.learning_rate=0.0", "> 0"]),
    ({"critic.mode": ""}, ["config.critic.mode=''", "lora, full, shared"]),
    ({"critic.nosuch": 1}, ["config.critic.nosuch", "valid fields of config.critic"]),
    ({"algo.advantage_estimator": "rloo"}, ["config.algo.advantage_estimator", "valid fields"]),
    ({"rollout.dynamic_sampling": True}, ["config.rollout.dynamic_sampling=True", "use False"]),
    ({"sampling.temperature": 0.0}, ["config.sampling.temperature=0.0", "> 0"]),
    ({"rollout.max_staleness": 1}, ["config.algo.tis_cap=None", "max_staleness=1"]),
    # No mini-batch size: the whole batch, which must not be empty (was: modulo by zero).
    (
      {"train.batch_tasks": 0, "algo.mini_batch_size": None},
      ["config.train.batch_tasks=0", ">= 1"],
    ),
  ],
)
def test_bad_config_fails_at_start_naming_field_value_and_choices(overrides, expected, tmp_path):
  cfg = _config(**overrides)
  with pytest.raises(ValueError) as err:
    rl.check_config(cfg)
  for text in expected:
    assert text in str(err.value), str(err.value)
  with pytest.raises(ValueError):
    rl.run(cfg, str(tmp_path))
  assert not os.path.exists(tmp_path / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_ppo_iterations_with_the_lora_critic(tmp_path):
  """Gemma 3 270M, LoRA actor + lora critic: one warm-up and one actor iteration, two
  epochs each, so the old logprobs come from a separate trainer pass. Over 20 s: the
  sampler, actor and critic steps compile for 18 layers (fast code generation: 40 s alone,
  49 s with XLA's default), and the model is loaded once per worker
  (tests/real_models.py)."""
  require_shared(GSM8K_DIR)
  require_gemma3()
  cfg = _config(
    "gemma3_270m",
    **{
      "data.data_dir": str(GSM8K_DIR),
      "train.steps": 2,
      "train.batch_tasks": 2,
      "train.micro_batch_size": 2,
      "algo.critic_warmup_steps": 1,
      "algo.num_iterations": 2,
      "sampling.max_new_tokens": 8,
      # plain prompts (28-105 tokens: 64- or 128-slot buckets) instead of few-shot ones
      # (201-277): a quarter of the 18-layer work; longer contexts are test_real_model's
      "data.template": "plain",
      "train.compute_dtype": "float32",  # pinned: the checks below are float32 agreement
    },
  )
  rl.run(cfg, str(tmp_path), loaded=real_models.loaded_for(cfg))
  records = _metrics(tmp_path)
  assert [r["actor_on"] for r in records] == [0.0, 1.0]
  for r in records:
    assert np.isfinite(r["loss"]) and abs(r["ratio_mean/first_pass"] - 1.0) < 1e-5, r
    # float32 sampler and trainer agree on the real model.
    assert r["sampler_logp_gap/first_pass"] < 1e-3, r
  assert abs(records[0]["kl/first_pass"]) < 1e-6  # actor == reference before it trains
  assert records[1]["grad_norm/critic"] > 0
  assert checkpoint.manager(str(tmp_path)).latest_step() == 2


@pytest.mark.parametrize("head_lr", [None, 0.5])
def test_the_value_head_trains_at_its_own_learning_rate(head_lr):
  """The PPO optimizer with plain SGD and no clipping, on unit gradients: the critic's
  trunk moves by critic.learning_rate (0.03) and its head by critic.head_learning_rate
  (0.5; None: the critic's rate too) times the schedule's factor, the same for both; the
  actor, gated off during the warm-up, does not move. Mutation caught: the head labelled
  as the trunk (it would move at the critic's rate)."""
  from rlpost.recipes import learners  # pylint: disable=g-import-not-at-top

  cfg = _config(
    **{"train.optimizer": "sgd", "train.max_grad_norm": 0.0, "critic.head_learning_rate": head_lr}
  )
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  c = rl.check_config(cfg)
  settings = c.settings
  assert settings.head_learning_rate == head_lr
  optimizer = learners.ppo_optimizer(c, settings)
  trainable = {
    "policy": {"w": jnp.zeros(3)},
    "critic": {"params": {"w": jnp.zeros(4)}, "head": {"w": jnp.zeros((4, 1)), "b": jnp.zeros(())}},
  }
  grads = jax.tree.map(jnp.ones_like, trainable)
  state = optimizer.init(trainable)
  for _ in range(3):  # past the warm-up's zero rate
    updates, state = optimizer.update(grads, state, trainable, actor_on=False)
  trunk = -float(updates["critic"]["params"]["w"][0])
  assert trunk > 0 and float(jnp.abs(updates["policy"]["w"]).max()) == 0.0
  rate = settings.critic_learning_rate if head_lr is None else head_lr
  for leaf in jax.tree.leaves(updates["critic"]["head"]):
    np.testing.assert_allclose(
      -np.asarray(leaf), trunk * rate / settings.critic_learning_rate, rtol=1e-5
    )


@pytest.mark.slow
def test_normalised_values_track_the_returns_and_the_optimizer_leaves_them(tmp_path):
  """Tiny PPO with `critic.value_norm_decay=0.5` (4 iterations): the running return
  statistics are the first batch's returns' mean, then each iteration halfway towards the
  batch's (`value_norm/mean` against the logged `returns/mean`), so nothing but
  `with_return_stats` moves them (not AdamW's weight decay); the final critic holds them
  with count 4, and the run's losses and values stay finite. Mutation caught: the stats
  labelled as critic parameters (the optimizer's decay moves them)."""
  state = rl.run(
    _config(**{"train.steps": 4, "critic.value_norm_decay": 0.5, "train.weight_decay": 0.1}),
    str(tmp_path),
  )
  records = _metrics(tmp_path)
  assert len(records) == 4
  want = None
  for r in records:
    want = r["returns/mean"] if want is None else 0.5 * want + 0.5 * r["returns/mean"]
    np.testing.assert_allclose(r["value_norm/mean"], want, rtol=1e-4, atol=1e-6)
    assert np.isfinite(r["loss"]) and np.isfinite(r["values/mean"])
  stats = state.trainable["critic"]["stats"]
  assert float(stats["count"]) == 4
  np.testing.assert_allclose(float(stats["mean"]), want, rtol=1e-4, atol=1e-6)
