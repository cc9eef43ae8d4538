"""The GRPO family's update (GRPO, Dr.GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO: the
`algo` block's estimators and losses): G samples per task; advantages by the config's
credit rule (`credit.RULES`) on the whole batch's scores -> reference / old logprobs ->
passes (num_iterations) x mini-batches of the train step (`learner.train_passes`)."""

import dataclasses

import jax
import jax.numpy as jnp

from rlpost.models import policy
from rlpost.rl import advantages as adv_lib
from rlpost.rl import batch as batch_lib
from rlpost.rl import credit
from rlpost.rl import learner as learner_lib
from rlpost.rl import objectives


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
  """algo: the `algo` block; forward: the trainer's forward; rows: one batch's rows;
  mini_batch_size: rows per optimizer step (algo.mini_batch_size or rows); seed: the
  mini-batch orders' (cfg.seed)."""

  algo: objectives.GRPOConfig
  forward: policy.ForwardConfig
  rows: int
  mini_batch_size: int
  seed: int = 0


_advantages = jax.jit(credit.advantages, static_argnames="config")
_tied_groups = jax.jit(
  lambda scores_N, G: jnp.sum(adv_lib.zero_signal_groups(scores_N, G)), static_argnums=1
)
FIRST_PASS = ("ratio_mean", "kl", "sampler_logp_gap", "sampler_logp_gap_mean")


def grpo_update(learner: learner_lib.Learner, state, batch: batch_lib.RLBatch, index: int):
  """Group-relative advantages of `batch.scores` over the whole batch (the rows' returns
  [N], or with turn or state credit per-turn rewards [N, T]), reference and old logprobs
  as needed, then num_iterations passes of mini-batch train steps. Returns (state,
  metrics averaged over the steps, plus the first step's ratio and KL and
  `zero_signal_groups`, the share of groups whose G rewards tie, when G > 1)."""
  algo, forward = learner.settings.algo, learner.settings.forward
  G = algo.num_generations
  scores = batch.scores
  inputs = credit.CreditInputs(scores, batch.loss_mask, batch.turn_ids, batch.tokens)
  advantages = _advantages(inputs, algo)
  returns = scores  # per-turn rewards [N, T]: each row's sum
  if credit.of(algo).rewards == "turn":
    returns = jnp.sum(jnp.where(batch.loss_mask > 0, scores, 0.0), axis=1)
  tied = _tied_groups(returns, G) if G > 1 else None
  batch = dataclasses.replace(batch, advantages=advantages, scores=None)
  params, adapters = policy.policy_params(state.trainable["policy"], learner.frozen, forward)
  logprobs = lambda w, a: policy.completion_logprobs_jit(w, a, batch, forward)
  if algo.beta > 0:
    batch = dataclasses.replace(batch, ref_logp=logprobs(learner.ref_params, None))
  if learner_lib.updates_per_iteration(learner.settings) > 1:
    batch = dataclasses.replace(batch, old_logp=logprobs(params, adapters))
  state, passes = learner_lib.train_passes(learner, state, batch, index)
  metrics = learner_lib.pass_metrics(passes, FIRST_PASS)
  if tied is not None:  # the share of groups, as NumPy's mean of bools gives it
    metrics["zero_signal_groups"] = int(tied) / (batch.tokens.shape[0] // G)
  return state, metrics
