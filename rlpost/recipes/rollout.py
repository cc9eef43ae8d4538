"""Where and from which weights an RL run samples, and its loop schedule (a helper module
of the RL recipe, `rlpost.recipes.rl`): the `rollout` block, the
training-sampling and off-policy checks, the sampler's devices and weights, and the
run loop's step (in turn, or pipelined with the older policies carried in checkpoints).
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple

from absl import logging as absl_logging
import jax
import jax.numpy as jnp

from rlpost.envs import multiturn
from rlpost.models import policy
from rlpost.models import quant
from rlpost.models import quant4
from rlpost.models import q4_native
from rlpost.recipes import common
from rlpost.train import compute_paths
from rlpost.train import loop as loop_lib
from rlpost.train import pipeline
from rlpost.train import sharding
from rlpost.train import weight_sync


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """How an iteration's episodes are played and collected: the `rollout` block of every
  RL config, whatever the environment.

  The turn layout (`multiturn.TurnConfig`, resolved by `turns`):
  template: the scaffold around observations, chat | plain; None: the environment's own
    (a prompt dataset's follows its `env.template`), else chat.
  max_turn_tokens: sampled tokens per turn; None: `sampling.max_new_tokens`.
  max_total_tokens: completion slots per row (turns + observations); None: one turn.
  max_prompt_tokens: the longest first prompt an episode accepts (a longer one is an
    error naming it); None: no cap of the rollout's (a dataset caps its prompts with
    `env.max_prompt_tokens`, leaving out longer ones).
  mask_truncated, fixed_shapes, stop_strings: as `multiturn.TurnConfig`'s.

  Collection, for any environment:
  dynamic_sampling: DAPO: drop groups whose G rewards tie (no signal) and play further
    tasks, up to `max_resample_rounds` extra rounds.
  overlong_buffer: DAPO's soft overlong penalty window in TOKENS below the row's sampled
    tokens cap (max_total_tokens); None: off. overlong_penalty: the penalty at the cap.
  max_staleness: None: play, then train, in turn. An int s: a producer thread plays
    ahead (`rlpost.train.pipeline`), each batch by a policy at most s updates old (0: the
    synchronous schedule; s > 0 needs `algo.tis_cap`).
  """

  template: str | None = None
  max_turn_tokens: int | None = None
  max_total_tokens: int | None = None
  max_prompt_tokens: int | None = None
  mask_truncated: bool = False
  fixed_shapes: bool = False
  stop_strings: tuple[str, ...] = ()
  dynamic_sampling: bool = False
  max_resample_rounds: int = 3
  overlong_buffer: int | None = None
  overlong_penalty: float = 1.0
  max_staleness: int | None = None

  def __post_init__(self):
    if not (math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0):
      raise ValueError(
        f"RolloutConfig.overlong_penalty={self.overlong_penalty}: use a finite size >= 0 "
        "(it is subtracted from the reward of over-long completions)"
      )
    if self.max_resample_rounds < 0:
      raise ValueError(f"RolloutConfig.max_resample_rounds={self.max_resample_rounds}: use >= 0")
    if self.overlong_buffer is not None and self.overlong_buffer < 1:
      raise ValueError(
        f"RolloutConfig.overlong_buffer={self.overlong_buffer}: use a "
        "positive number of tokens, or None to turn the penalty off"
      )
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
    self.turns(self.max_turn_tokens or 1)  # the turn fields' own checks (TurnConfig's)

  def turns(self, max_new_tokens: int, scaffold: str | None = None) -> multiturn.TurnConfig:
    """The TurnConfig these fields give with the sampling block's `max_new_tokens` and the
    environment's own `scaffold` (None: it has none)."""
    turn = self.max_turn_tokens or max_new_tokens
    try:
      return multiturn.TurnConfig(
        template=self.template or scaffold or "chat",
        max_turn_tokens=turn,
        max_total_tokens=self.max_total_tokens or turn,
        max_prompt_tokens=self.max_prompt_tokens or NO_PROMPT_CAP,
        mask_truncated=self.mask_truncated,
        fixed_shapes=self.fixed_shapes,
        stop_strings=self.stop_strings,
      )
    except ValueError as e:
      raise ValueError(str(e).replace("TurnConfig.", "RolloutConfig.")) from None


# A dataset's prompt is capped where it enters (`env.max_prompt_tokens`): no second cap.
NO_PROMPT_CAP = 1 << 30


def check_training_sampling(s, greedy_why: str, greedy_elsewhere: str) -> None:
  """A training rollout's `sampling` block (`blocks.SamplingBlock`, its own fields already
  checked) samples: a temperature > 0 (`greedy_why`: why this recipe cannot train on
  greedy samples; `greedy_elsewhere`: where greedy decoding belongs)."""
  if not s.temperature > 0:
    common.fail(
      "sampling.temperature",
      s.temperature,
      f"training needs a temperature > 0 ({greedy_why}); {greedy_elsewhere}",
    )


class Sampler(NamedTuple):
  """Where rollouts run: `mesh` (None: on the trainer's devices) and the frozen weights
  (the LoRA base, else None) placed there once; `int8`: None, or the sampler reads an
  int8 copy of the policy made at each weight sync, its dots formed as these
  `quant.Int8Paths` say (`sampling.int8_paths`); `int4`: the sampler reads a 4-bit copy
  made at each sync (`quant4.for_sampling`: the LoRA-merged layers NF4), multiplied in
  `q4_native`'s kernel when `int4_native` (`sampling.int4_matmul`)."""

  mesh: Any
  frozen: Any
  int8: quant.Int8Paths | None = None
  int4: bool = False
  int4_native: bool = False


def make_sampler(c, frozen, forward: policy.ForwardConfig) -> Sampler:
  """The `mesh.rollout` devices with the LoRA base (`frozen`) copied to them once: each
  iteration only the trained weights move, i.e. just the adapters under LoRA (`c`: an
  `rl_config.RLConfig`)."""
  mesh, base = common.rollout_mesh(c), frozen if forward.lora else None
  int8 = None
  if c.sampling.weights == "int8":
    int8, why = compute_paths.int8_paths(c.sampling.int8_paths)
    absl_logging.info("sampling.weights=int8: dots %s (%s)", int8, why)
  int4 = c.sampling.weights == "int4"
  native = int4 and q4_native.resolve(c.sampling.int4_matmul)[0] == "native"
  if mesh is None or base is None:
    return Sampler(mesh, base, int8, int4, native)
  return Sampler(mesh, sharding.sync(base, mesh), int8, int4, native)


def sampler_weights(sampler: Sampler, trainable, forward, key, trainer_mesh, prints=False):
  """(params, key) the sampler reads this iteration (`policy.sampling_params`, LoRA merged).

  With `sampler.int8` (`sampler.int4`) the sampler gets their int8 (4-bit) copy, made
  here once per sync.
  Own rollout devices: the trainable weights are copied there device to device and
  merged with the frozen copy already there. Shared devices: with several processes
  each takes its own replica (`sharding.local_copy`), as it samples its rows alone.

  prints: also return `weight_sync`'s fingerprints (trainer, copy or None, sampler):
  ((params, key), fingerprints).
  """
  if sampler.int4:
    finish = functools.partial(_four_bit_for_sampling, native=sampler.int4_native)
  elif sampler.int8 is None:
    finish = lambda params: params
  else:
    finish = functools.partial(_quantized_for_sampling, paths=sampler.int8)
  if sampler.mesh is None:
    params = policy.sampling_params(trainable, sampler.frozen, forward)
    if jax.process_count() == 1:
      trainer_part = trainable
    elif forward.lora:
      # several processes: the trainer's part fingerprinted from this process's whole
      # replica (a global array's sum would be a collective of its own, and the producer
      # thread must issue none), gathered in the same program as the sampler's weights
      params, key, trainer_part = sharding.local_copy((params, key, trainable), trainer_mesh)
    else:
      params, key = sharding.local_copy((params, key), trainer_mesh)
      trainer_part = params  # all parameters train: the sampler reads the trainable part
    trainer_copy = (trainer_part, None)
  else:
    replica, key = sharding.local_replica((trainable, key))
    copied, key = sharding.place((replica, key), sampler.mesh)
    params = policy.sampling_params(copied, sampler.frozen, forward)
    trainer_copy = (replica, copied)
  weights = finish(params), key
  if not prints:
    return weights
  fingerprints = [None if t is None else weight_sync.fingerprint(t) for t in trainer_copy]
  return weights, (*fingerprints, weight_sync.fingerprint(weights[0]))


_int8_parts = jax.jit(quant.int8_parts, static_argnames=("group", "paths"))


def _quantized_for_sampling(params, paths):
  """`quant.quantize_for_sampling(params, paths=paths)`: one program makes the int8 parts,
  the weights kept are passed through (a program's output would be a copy)."""
  return quant.with_int8_parts(params, _int8_parts(params, paths=paths))


_int4_parts = jax.jit(quant4.sampling_parts)


@jax.jit
def _native_int4_parts(params):
  """`quant4.sampling_parts(params)` with the layers laid out for `q4_native`."""
  unembed, packed = quant4.sampling_parts(params)
  return unembed, q4_native.for_decode({"layers": packed})["layers"]


def _four_bit_for_sampling(params, native: bool):
  """`quant4.for_sampling(params)`, its new parts made by one program (as
  `_quantized_for_sampling`); `native`: the layers laid out for `q4_native`."""
  unembed, packed = (_native_int4_parts if native else _int4_parts)(params)
  return {**params, "unembed": unembed, "layers": {**params["layers"], **packed}}


def loop_step(p, produce, train, max_staleness: int | None, steps: int):
  """The run loop's (step_fn, close, carry) for a recipe's phases

    produce(p, weights, cursor, index) -> (sampled, cursor)
    train(p, state, sampled, index, version, publish) -> (state, published, metrics)

  in turn (max_staleness None), or through `rlpost.train.pipeline` (a producer thread
  sampling from the policy max_staleness updates old). With max_staleness > 0 (else
  carry is None) the `loop.Carry` keeps in each checkpoint the trainable weights
  (`state.trainable["policy"]`) of the older policies the next batches are sampled by,
  and a resumed run remakes their sampler weights from them: it samples what the
  uninterrupted run sampled.
  """
  part = lambda state: state.trainable["policy"]
  synced = {"last": None, "metrics": {}}  # the last weight sync's record (`weight_sync`)

  def weights_of(state, where: str):
    mesh = sharding.mesh_of(state)
    weights, prints = sampler_weights(
      p.sampler, part(state), p.forward, state.key, mesh, prints=True
    )
    synced["last"], synced["metrics"] = weight_sync.check(synced["last"], *prints, where)
    return weights

  produce = functools.partial(produce, p)
  if max_staleness is None:

    def step(state, cursor, index):
      sampled, cursor = produce(weights_of(state, f"step {index}"), cursor, index)
      state, _, metrics = train(p, state, sampled, index, index, None)
      return state, cursor, {**metrics, **synced["metrics"]}

    return step, lambda: None, None

  def publish(state, trainable=None):
    """(sampler weights, the trainable part they are made of) of `state`'s policy, or of
    an older `trainable` part under `state`'s key; no array of `state` among them (the
    next train step donates it)."""
    if trainable is not None:  # an older version a resumed run samples from: not a sync
      mesh = sharding.mesh_of(state)
      weights = sampler_weights(p.sampler, trainable, p.forward, state.key, mesh)
      return _without_arrays_of(state, (weights, trainable))
    weights = weights_of(state, "the weight sync after a train step")
    return _without_arrays_of(state, (weights, part(state)))

  def train_step(state, batch, index, version):
    state, published, metrics = train(p, state, batch, index, version, publish)
    return state, published, {**metrics, **synced["metrics"]}

  pipe = pipeline.step_fn(
    lambda published, cursor, index: produce(published[0], cursor, index),
    train_step,
    publish,
    last=steps,
    max_staleness=max_staleness,
  )
  carry = _lagged_carry(pipe, publish, part, max_staleness) if max_staleness else None
  return pipe.step, pipe.close, carry


def _without_arrays_of(state, tree):
  """`tree` with a copy of each array it shares with `state`, one per array: the sampler
  weights and the trainable part are the same arrays when the sampler reads the params
  as they are (full fine-tuning on the trainer's devices), and stay so."""
  copies = {id(x): None for x in jax.tree.leaves(state)}

  def own(x):
    if id(x) not in copies:
      return x
    if copies[id(x)] is None:
      copies[id(x)] = jnp.copy(x)
    return copies[id(x)]

  return jax.tree.map(own, tree)


def _lagged_carry(pipe: pipeline.Pipeline, publish, part, max_staleness: int) -> loop_lib.Carry:
  """The pipeline's `loop.Carry` (max_staleness s > 0): a checkpoint after step k - 1
  holds the trainable parts of versions max(k - s, first) .. k - 1 and `first`; a resume
  seeds the pipeline with their sampler weights, remade from them."""

  def save():
    held = pipe.held()  # never empty for s > 0: version k - 1 >= first is always there
    meta = {"first": held.first, "versions": sorted(held.weights)}
    return meta, {str(v): trainable for v, (_, trainable) in held.weights.items()}

  def like(state, meta):
    return {str(v): part(state) for v in meta["versions"]}

  def resume(state, index, meta, arrays):
    if meta is None:
      why = (
        "holds no older policies (written by a synchronous or max_staleness=0 run, or by "
        "an older rlpost)"
      )
    else:
      needed = pipeline.lagged_versions(index, meta["first"], max_staleness)
      if all(str(v) in arrays for v in needed):
        seeds = {v: publish(state, arrays[str(v)]) for v in needed}
        pipe.seed(pipeline.Held(meta["first"], seeds))
        return
      why = f"holds the policies of versions {meta['versions']}, not all of {list(needed)}"
    message = (
      f"resuming at step {index} with max_staleness={max_staleness}: the checkpoint {why}, "
      f"so the lag restarts here (batches {index} .. {index + max_staleness - 1} are sampled by "
      "newer policies than in the uninterrupted run, logged as staleness < max_staleness): "
      "this run is not the uninterrupted one"
    )
    absl_logging.warning(message)
    print(message, flush=True)

  return loop_lib.Carry(save, like, resume)


def check_off_policy(s, max_staleness: int | None, tis_cap, field: str = "rollout.max_staleness"):
  """Samples from another policy than the trainer's need a truncated IS cap to correct
  them: an older one (max_staleness s > 0) or an int8 or 4-bit copy (`s.weights`, of the
  `blocks.SamplingBlock`)."""
  weights = s.weights
  if weights in ("int8", "int4") and tis_cap is None:
    common.fail(
      "algo.tis_cap",
      None,
      f"sampling.weights={weights} samples from an {weights} copy of the policy, not the "
      "policy the trainer scores: set a truncated importance sampling cap, e.g. "
      "--config.algo.tis_cap=2.0",
    )
  if max_staleness is not None and max_staleness < 0:
    common.fail(field, max_staleness, "use None (sample, then train), 0 or more")
  if max_staleness and tis_cap is None:
    common.fail(
      "algo.tis_cap",
      None,
      f"{field}={max_staleness} trains on batches sampled by an older policy: set a "
      "truncated importance sampling cap, e.g. --config.algo.tis_cap=2.0",
    )
