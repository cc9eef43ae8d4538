"""GRPO-family RL (GRPO, Dr.GRPO, DAPO, GSPO) as functions composed by experiments/grpo.py.

One iteration (GUIDE section 3):
  prompts -> sample G completions each (shared prefill) -> rewards (host)
  -> [DAPO: drop zero-signal groups, sample more prompts] -> advantages
  -> ref logprobs (beta > 0, base params / LoRA off) -> old logprobs (mu > 1)
  -> mu x train_step(state, frozen, batch)

With mu = 1 the loss uses old_logp = stop_gradient(logp): the importance ratio
is exactly 1 and the gradient is the on-policy policy gradient. The gap between
the sampler's logprobs and the trainer's recomputation is logged
(`sampler_logp_gap`) and can be corrected with truncated IS (`algo.tis_cap`).
"""
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import advantages as adv_lib
from rlpost import algorithms
from rlpost import rewards as rewards_lib
from rlpost import rollout
from rlpost import host_memory
from rlpost import sampling
from rlpost.data import prompts as prompts_lib
from rlpost.data.cursor import Cursor, next_indices
from rlpost.models import gemma3
from rlpost.models import lora as lora_lib


@dataclasses.dataclass(frozen=True)
class Setup:
  """Static pieces of a GRPO run, resolved once from the ConfigDict."""
  model: gemma3.Config
  algo: algorithms.GRPOConfig
  sampling: sampling.SamplingConfig
  lora: lora_lib.LoraConfig | None
  num_iterations: int
  batch_prompts: int
  micro_batch_size: int
  dynamic_sampling: bool
  max_resample_rounds: int
  overlong_buffer: int
  overlong_penalty: float
  logprob_chunk: int
  compute_dtype: str      # matmul inputs of the trainer's forward/backward (rollout: params')
  remat: str              # activation policy of the trainer's forward: dots | full
  template: str
  shuffle: bool


def validate(cfg) -> None:
  """Raises ValueError naming the field for settings that cannot work together."""
  a, t = cfg.algo, cfg.train
  G = a.num_generations
  if a.name not in ("grpo", "drgrpo", "dapo", "gspo"):
    raise ValueError(f"algo.name={a.name!r} is not one of grpo, drgrpo, dapo, gspo")
  if G < 2:
    raise ValueError(f"algo.num_generations={G} must be >= 2: group-relative advantages need "
                     "several completions per prompt")
  rows = t.batch_prompts * G
  if rows % t.micro_batch_size:
    raise ValueError(f"train.batch_prompts * algo.num_generations = {rows} rows is not divisible "
                     f"by train.micro_batch_size={t.micro_batch_size}; choose a divisor of {rows}")
  if a.num_iterations < 1:
    raise ValueError(f"algo.num_iterations={a.num_iterations} must be >= 1")
  if cfg.data.source not in ("gsm8k", "arithmetic", "digit"):
    raise ValueError(f"data.source={cfg.data.source!r} is not one of gsm8k, arithmetic, digit")
  if cfg.data.template not in prompts_lib.TEMPLATES:
    raise ValueError(f"data.template={cfg.data.template!r} is not one of {prompts_lib.TEMPLATES}")
  if t.steps < 1:
    raise ValueError(f"train.steps={t.steps} must be >= 1")
  if t.compute_dtype not in gemma3.COMPUTE_DTYPES:
    raise ValueError(f"train.compute_dtype={t.compute_dtype!r} is not one of "
                     f"{gemma3.COMPUTE_DTYPES}")
  if t.remat not in ("dots", "full"):
    raise ValueError(f"train.remat={t.remat!r} is not one of dots (keep matmul outputs), "
                     "full (keep layer inputs only: less memory, one more forward)")


def make_setup(cfg, model_config: gemma3.Config, tokenizer) -> Setup:
  validate(cfg)
  a = cfg.algo
  algo = algorithms.GRPOConfig(
      advantage_estimator=a.advantage, num_generations=a.num_generations, beta=a.beta,
      kl_kind=a.kl,
      epsilon_low=a.epsilon_low, epsilon_high=a.epsilon_high, epsilon_c=a.epsilon_c or None,
      importance=a.importance, aggregation=a.aggregation,
      max_tokens=cfg.sampling.max_new_tokens, tis_cap=a.tis_cap or None)
  sc = sampling.SamplingConfig(
      temperature=cfg.sampling.temperature, stop_ids=(tokenizer.eos_id, tokenizer.end_of_turn_id),
      max_new_tokens=cfg.sampling.max_new_tokens, pad_id=tokenizer.pad_id,
      prompt_bucket=cfg.sampling.prompt_bucket)
  lora = (lora_lib.LoraConfig(rank=cfg.lora.rank, alpha=cfg.lora.alpha)
          if cfg.lora.enabled else None)
  return Setup(model=model_config, algo=algo, sampling=sc, lora=lora,
               num_iterations=a.num_iterations, batch_prompts=cfg.train.batch_prompts,
               micro_batch_size=cfg.train.micro_batch_size, dynamic_sampling=a.dynamic_sampling,
               max_resample_rounds=a.max_resample_rounds, overlong_buffer=a.overlong_buffer,
               overlong_penalty=a.overlong_penalty, logprob_chunk=cfg.train.logprob_chunk,
               compute_dtype=cfg.train.compute_dtype, remat=cfg.train.remat,
               template=cfg.data.template, shuffle=cfg.data.shuffle)


def policy_parts(setup: Setup, trainable, frozen):
  """(params, adapters) of the current policy."""
  return (frozen, trainable) if setup.lora else (trainable, None)


def make_loss_fn(setup: Setup):
  """`loss_fn(trainable, frozen, micro_batch) -> (loss, metrics)` for train_step."""
  scale = setup.lora.scale if setup.lora else 1.0

  def loss_fn(trainable, frozen, mb):
    params, adapters = policy_parts(setup, trainable, frozen)
    logp, entropy = rollout.completion_logprobs(
        params, mb, model_config=setup.model, temperature=setup.sampling.temperature,
        adapters=adapters, lora_scale=scale, chunk=setup.logprob_chunk, return_entropy=True,
        remat=setup.remat, compute_dtype=setup.compute_dtype)
    mask = mb["completion_mask"]
    old = mb["old_logp"] if "old_logp" in mb else jax.lax.stop_gradient(logp)
    loss, metrics = algorithms.grpo_loss(logp, old, mb.get("ref_logp"), mb["advantages"], mask,
                                         setup.algo, entropy=entropy,
                                         sampler_logp=mb["sampler_logp"])
    gap = jnp.abs(jax.lax.stop_gradient(logp) - mb["sampler_logp"]) * mask
    return loss, {**metrics, "sampler_logp_gap": gap.max()}
  return loss_fn


_merge = jax.jit(lora_lib.merge, static_argnums=2)


def sampling_params(setup: Setup, trainable, frozen):
  """Weights the sampler reads: LoRA merged once per rollout (exactly the trained policy)."""
  params, adapters = policy_parts(setup, trainable, frozen)
  return params if adapters is None else _merge(params, adapters, setup.lora)


def _left_pad(batch: dict, prompt_len: int, pad_id: int) -> dict:
  """Re-pads the prompt part of an RL batch on the left to `prompt_len` slots."""
  T = batch["completion_mask"].shape[1]
  extra = prompt_len - (batch["tokens"].shape[1] - T)
  if extra == 0:
    return batch
  pad = lambda x, v: np.pad(x, ((0, 0), (extra, 0)), constant_values=v)
  return {**batch, "tokens": pad(batch["tokens"], pad_id), "positions": pad(batch["positions"], 0),
          "valid": pad(batch["valid"], False)}


def concat_batches(batches: list[dict], pad_id: int) -> dict:
  """Row-concatenates RL batches whose prompt lengths may differ."""
  T = batches[0]["completion_mask"].shape[1]
  P = max(b["tokens"].shape[1] - T for b in batches)
  batches = [_left_pad(b, P, pad_id) for b in batches]
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def sample_groups(setup: Setup, params_s, problems, tokenizer, key, reward_fns, examples):
  """One sampling round: G completions for each problem, scored.

  Returns a list of per-group dicts {batch (rows of the RL batch), rewards [G]
  (total), per_fn {name: [G]}, completions, answers}, and the error counts.
  """
  G = setup.algo.num_generations
  texts = [prompts_lib.prompt_text(p, setup.template, examples) for p in problems]
  tokens, lengths = sampling.pad_prompts([tokenizer.encode(t) for t in texts], setup.sampling)
  out = jax.device_get(sampling.sample(params_s, tokens, lengths, key, model_config=setup.model,
                                       config=setup.sampling, num_samples=G))
  batch = rollout.rollout_batch(tokens, lengths, out, G)
  if setup.template != "plain":
    batch = rollout.truncate_at_stop_strings(batch, tokenizer, prompts_lib.STOP_STRINGS)
  prefix = prompts_lib.completion_prefix(setup.template)
  completions = [prefix + c for c in rollout.completion_texts(batch, tokenizer)]
  answers = [p.final for p in problems for _ in range(G)]
  per_fn, errors = rewards_lib.score(reward_fns, [t for t in texts for _ in range(G)],
                                     completions, answers)
  if setup.overlong_buffer:
    per_fn["overlong_penalty"] = np.asarray(adv_lib.overlong_penalty(
        jnp.asarray(batch["completion_mask"].sum(1)), max_len=setup.sampling.max_new_tokens,
        buffer_len=setup.overlong_buffer, penalty_factor=setup.overlong_penalty), np.float32)
  total = sum(per_fn.values())
  groups = []
  for g in range(len(problems)):
    rows = slice(g * G, (g + 1) * G)
    groups.append({"batch": {k: v[rows] for k, v in batch.items()}, "rewards": total[rows],
                   "per_fn": {k: v[rows] for k, v in per_fn.items()},
                   "completions": completions[rows], "answers": answers[rows]})
  return groups, errors


def collect(setup: Setup, params_s, problems, cursor: Cursor, tokenizer, key, reward_fns,
            examples):
  """Samples and scores `batch_prompts` groups; DAPO dynamic sampling when enabled.

  Dynamic sampling drops groups whose G rewards are all equal (zero advantage,
  no signal) and samples further prompts, up to `max_resample_rounds` extra
  rounds; if the batch is still short it is filled with dropped groups (they
  contribute no policy gradient) and `dynamic/filled` counts them.
  Returns (groups, metrics, cursor).
  """
  B = setup.batch_prompts
  kept, dropped, rounds, errors = [], [], 0, {}
  while True:
    idx, cursor = next_indices(cursor, len(problems), B, shuffle=setup.shuffle)
    groups, errs = sample_groups(setup, params_s, [problems[i] for i in idx], tokenizer,
                                 jax.random.fold_in(key, rounds), reward_fns, examples)
    for name, n in errs.items():
      errors[f"reward/{name}/errors"] = errors.get(f"reward/{name}/errors", 0) + n
    for group in groups:
      no_signal = np.all(group["rewards"] == group["rewards"][0])
      (dropped if setup.dynamic_sampling and no_signal else kept).append(group)
    rounds += 1
    if not setup.dynamic_sampling or len(kept) >= B or rounds > setup.max_resample_rounds:
      break
  filled = max(0, B - len(kept))
  groups = (kept + dropped[:filled])[:B]
  return groups, {**errors, "dynamic/rounds": rounds, "dynamic/filled": filled}, cursor


def rollout_metrics(groups, accuracy_fns) -> dict:
  """Reward mean/std (total and per function), accuracies, lengths, zero-signal fraction."""
  rewards = np.concatenate([g["rewards"] for g in groups])
  lengths = np.concatenate([g["batch"]["completion_mask"].sum(1) for g in groups])
  comps = [c for g in groups for c in g["completions"]]
  answers = [a for g in groups for a in g["answers"]]
  metrics = {"reward/mean": rewards.mean(), "reward/std": rewards.std(),
             "completion_len/mean": lengths.mean(), "completion_len/max": lengths.max(),
             "zero_signal_groups": np.mean([np.all(g["rewards"] == g["rewards"][0])
                                            for g in groups])}
  for name in groups[0]["per_fn"]:
    metrics[f"reward/{name}"] = np.concatenate([g["per_fn"][name] for g in groups]).mean()
  for name, fn in accuracy_fns.items():
    metrics[name] = np.mean([fn(c, a) for c, a in zip(comps, answers)])
  return metrics


def train_batch(setup: Setup, groups) -> dict:
  """The RL batch for train_step: rows of the groups plus advantages [N]."""
  batch = concat_batches([g["batch"] for g in groups], setup.sampling.pad_id)
  rewards = jnp.asarray(np.concatenate([g["rewards"] for g in groups]))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  batch["advantages"] = algorithms.grpo_advantages(rewards, setup.algo)
  return batch


def iteration(setup: Setup, state, frozen, ref_params, train_step, problems, cursor: Cursor,
              index: int, tokenizer, reward_fns, accuracy_fns, examples):
  """One GRPO iteration (rollout, scoring, mu updates). Returns (state, cursor, metrics)."""
  start = time.perf_counter()
  params_s = sampling_params(setup, state.trainable, frozen)
  key = jax.random.fold_in(state.key, index)
  groups, metrics, cursor = collect(setup, params_s, problems, cursor, tokenizer, key,
                                    reward_fns, examples)
  del params_s
  host_memory.release_freed_memory()   # the sampler's weight copies, before the train step
  metrics.update(rollout_metrics(groups, accuracy_fns))
  batch = train_batch(setup, groups)
  rollout_s = time.perf_counter() - start
  params, adapters = policy_parts(setup, state.trainable, frozen)
  lp = lambda p, a: rollout.completion_logprobs_jit(
      p, batch, a, model_config=setup.model, temperature=setup.sampling.temperature,
      lora_scale=setup.lora.scale if setup.lora else 1.0, chunk=setup.logprob_chunk,
      compute_dtype=setup.compute_dtype)
  if setup.algo.beta > 0:
    batch["ref_logp"] = lp(ref_params, None)
  if setup.num_iterations > 1:
    batch["old_logp"] = lp(params, adapters)
  passes = []
  for _ in range(setup.num_iterations):
    state, m = train_step(state, frozen, batch)
    passes.append(m)
  passes = jax.device_get(passes)
  metrics.update({k: np.mean([p[k] for p in passes]) for k in passes[0]})
  metrics["ratio_mean/first_pass"] = passes[0]["ratio_mean"]
  if "kl" in passes[0]:
    metrics["kl/first_pass"] = passes[0]["kl"]
  tokens = float(batch["completion_mask"].sum())
  metrics.update({"time/rollout_s": rollout_s,
                  "time/train_s": time.perf_counter() - start - rollout_s,
                  "tokens_per_s": tokens / (time.perf_counter() - start)})
  return state, cursor, metrics
