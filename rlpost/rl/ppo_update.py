"""PPO's update with a learned critic (the `algo` block: `objectives.PPOConfig`): one
sample per task (or algo.num_generations); critic values and the config's credit rule
(`credit.RULES`: gae, turn_gae), or GAE inside a single train step -> epochs x
mini-batches of the actor + critic train step (`learner.train_passes`)."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import critic as critic_lib
from rlpost.models import policy
from rlpost.rl import batch as batch_lib
from rlpost.rl import learner as learner_lib
from rlpost.rl import objectives


@dataclasses.dataclass(frozen=True)
class PPOSettings:
  """A PPO learner's settings (`rlpost.recipes.learners.ppo_settings`).

  rows: one batch's rows (algo.num_generations per task); mini_batch_size: rows per optimizer
  step; gae_in_step: set by the build (it depends on the mesh): the batch feeds a
  single optimizer step, so GAE runs in the loss on the step's own values.
  """

  algo: objectives.PPOConfig
  critic: critic_lib.CriticLayout
  critic_learning_rate: float
  forward: policy.ForwardConfig
  rows: int
  mini_batch_size: int
  micro_batch_size: int
  seed: int
  gae_in_step: bool = False
  head_learning_rate: float | None = None  # the value head's own rate (None: the critic's)
  value_norm_decay: float | None = None  # running return statistics' weight (None: off)


FIRST_PASS = ("ratio_mean", "approx_kl", "kl", "sampler_logp_gap", "sampler_logp_gap_mean")


def ppo_update(learner: learner_lib.Learner, state, batch: batch_lib.RLBatch, index: int):
  """The critic pass and GAE (or GAE in the step), then epochs of mini-batch train steps.

  `batch.scores`: the rows' rewards [N], placed on each row's last loss token, or
  per-token rewards [N, T] (e.g. per-turn). Returns (state, metrics with value
  statistics, pass means, first-pass ratio / KL, actor_on, time/forward_s).
  """
  settings = learner.settings
  algo = settings.algo
  start = time.perf_counter()
  batch, moments = score_tokens(learner, state, batch)
  jax.block_until_ready(batch)  # honest phase times (the train step would wait anyway)
  forward_s = time.perf_counter() - start
  actor_on = index >= algo.critic_warmup_steps
  opt_args = {"actor_on": jnp.asarray(actor_on)}
  state, passes = learner_lib.train_passes(learner, state, batch, index, opt_args)
  if moments is None:  # GAE ran in the (single) train step
    moments = {k: passes[0].pop(k) for k in list(passes[0]) if k.startswith("moments/")}
  metrics = objectives.value_stats(moments)
  metrics.update(learner_lib.pass_metrics(passes, FIRST_PASS))
  metrics["actor_on"] = float(actor_on)
  metrics["time/forward_s"] = forward_s
  if settings.value_norm_decay is not None:  # after the batch's updates, as PopArt
    critic = critic_lib.with_return_stats(
      state.trainable["critic"],
      np.float32(metrics["returns/mean"]),
      np.float32(metrics["returns/std"]),
      np.float32(settings.value_norm_decay),
    )
    state = state._replace(trainable={**state.trainable, "critic": critic})
    mean, std = jax.device_get(critic_lib.return_stats(critic))
    metrics.update({"value_norm/mean": float(mean), "value_norm/std": float(std)})
  return state, metrics


_ppo_advantages = jax.jit(objectives.ppo_advantages, static_argnames="config")
_moments = jax.jit(objectives.value_moments)


def score_tokens(learner: learner_lib.Learner, state, batch: batch_lib.RLBatch):
  """Fills the batch for PPO's train steps. Returns (batch, value moments or None).

  Always `ref_logp` (beta > 0). Unless `gae_in_step`: also the rollout `values` (and
  `old_logp` when the batch is used more than once), `token_rewards`, `advantages`,
  `returns`, and the batch's `objectives.value_moments`; with `gae_in_step` the train
  step computes those from `scores`.
  """
  settings = learner.settings
  algo = settings.algo
  if algo.beta > 0:
    ref_logp = policy.completion_logprobs_jit(learner.frozen, None, batch, settings.forward)
    batch = dataclasses.replace(batch, ref_logp=ref_logp)
  if settings.gae_in_step:
    return batch, None
  with_old = learner_lib.updates_per_iteration(settings) > 1
  trainable = state.trainable
  old_logp, values = critic_lib.rollout_forward(
    trainable["policy"],
    trainable["critic"],
    learner.frozen,
    batch,
    settings.forward,
    settings.critic,
    with_old,
  )
  # The KL reward uses the logprobs of the policy that sampled (the sampler's own when
  # no separate old-policy pass runs: they agree to float32 rounding).
  logp = batch.sampler_logp if old_logp is None else old_logp
  advantages, returns, token_rewards = _ppo_advantages(
    batch.scores, values, logp, batch.ref_logp, batch.loss_mask, algo, batch.turn_ids
  )
  batch = dataclasses.replace(
    batch,
    old_logp=old_logp,
    values=values,
    returns=returns,
    advantages=advantages,
    token_rewards=token_rewards,
  )
  return batch, jax.device_get(_moments(values, returns, advantages, batch.loss_mask))
