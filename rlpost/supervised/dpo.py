"""DPO: pair batches, reference logprobs computed once per batch, and the loss function.

A pair batch is `{"chosen": sft batch, "rejected": sft batch, "ref_chosen": [N],
"ref_rejected": [N]}`: row i of both halves is pair i (prompt + response,
right-padded, loss mask on the response), built with `rlpost.sft.make_batch`, so
only response positions are projected onto the vocabulary. The reference
sequence logprobs are filled in by `make_reference_fn` outside the train step
(the reference never needs gradients): the base params with adapters off under
LoRA, a copy of the initial params for full-parameter DPO.
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.data import chat
from rlpost.models import policy
from rlpost.supervised import losses as sft_losses
from rlpost.supervised import sft

Pair = tuple[np.ndarray, np.ndarray, np.ndarray]  # prompt, chosen, rejected ids


def tokenize_pairs(records: Sequence[dict], tokenizer, max_len: int) -> list[Pair]:
  """`chat.tokenize_dpo` of every record."""
  return [chat.tokenize_dpo(r, tokenizer, max_len) for r in records]


def make_pair_batch(
  pairs: Sequence[Pair],
  *,
  seq_len: int,
  pad_id: int,
  micro_batch_size: int,
  gather_bucket: int = 64,
) -> dict:
  """Pair batch (module docstring) with zero reference logprobs (see `with_reference`)."""
  halves = {}
  for name, col in (("chosen", 1), ("rejected", 2)):
    examples = [chat.concat_prompt_response(p[0], p[col]) for p in pairs]
    halves[name] = sft.make_batch(
      examples,
      seq_len=seq_len,
      pad_id=pad_id,
      micro_batch_size=micro_batch_size,
      gather_bucket=gather_bucket,
    )
  zeros = np.zeros((len(pairs),), np.float32)
  return {**halves, "ref_chosen": zeros, "ref_rejected": zeros.copy()}


def _sequence_logprobs(params, adapters, half, fwd: policy.ForwardConfig):
  logp = sft.target_logprobs(params, adapters, half, fwd)
  return sft_losses.sequence_logprob(logp, half["target_mask"])


def make_reference_fn(fwd: policy.ForwardConfig, micro_batch_size: int):
  """Jitted `ref_fn(params, batch) -> batch` with "ref_<half>" [N] filled for each half
  (a dict: "chosen" and "rejected" of a pair batch, "completion" and "mismatched" of a
  KTO batch).

  `params` is the reference (no adapters). Runs `micro_batch_size` rows at a time
  (lax.map), so its memory is that of one forward pass of a micro-batch. `fwd`
  is the loss function's, so that the policy's first logprobs equal the
  reference's (its LoRA and remat settings are not used here).
  """
  fwd = dataclasses.replace(fwd.without_remat(), lora=None)

  @jax.jit
  def ref_fn(params, batch):
    out = dict(batch)
    for name in [k for k, v in batch.items() if isinstance(v, dict)]:
      half = batch[name]
      rows = half["tokens"].shape[0]
      micro = jax.tree.map(
        lambda x: x.reshape((rows // micro_batch_size, micro_batch_size) + x.shape[1:]), half
      )
      logp = jax.lax.map(lambda mb: _sequence_logprobs(params, None, mb, fwd), micro)
      out[f"ref_{name}"] = jax.lax.stop_gradient(logp.reshape(rows))
    return out

  return ref_fn


PAIR_LOSSES = ("dpo", "orpo", "simpo")  # the preference losses over pairs
REFERENCE_FREE = ("orpo", "simpo")  # these read no reference logprobs


def make_loss_fn(fwd: policy.ForwardConfig, loss: str = "dpo", **hparams):
  """`loss_fn(trainable, frozen, micro_batch) -> (loss, metrics)` for `make_train_step`.

  `loss`: dpo (sigmoid DPO against the batch's reference logprobs, `hparams` beta and
  label_smoothing), orpo (`hparams` lam) or simpo (beta, gamma): the
  `supervised.losses` function of that name over the micro-batch's pairs, their sequence
  logprobs and response token counts; its metrics (batch means), "loss" aside.
  """
  if loss not in PAIR_LOSSES:
    raise ValueError(f"preference loss {loss!r}: use one of {PAIR_LOSSES}")

  def loss_fn(trainable, frozen, micro_batch):
    params, adapters = policy.policy_params(trainable, frozen, fwd)
    halves = [micro_batch[name] for name in ("chosen", "rejected")]
    chosen, rejected = (_sequence_logprobs(params, adapters, h, fwd) for h in halves)
    if loss == "dpo":
      refs = micro_batch["ref_chosen"], micro_batch["ref_rejected"]
      value, metrics = sft_losses.dpo_loss(chosen, rejected, *refs, **hparams)
    else:
      counts = [h["target_mask"].sum(axis=-1) for h in halves]
      fn = sft_losses.orpo_loss if loss == "orpo" else sft_losses.simpo_loss
      value, metrics = fn(chosen, rejected, *counts, **hparams)
    return value, {k: v for k, v in metrics.items() if k != "loss"}

  return loss_fn


def make_kto_batch(
  examples: Sequence[tuple[np.ndarray, np.ndarray, bool]],
  *,
  seq_len: int,
  pad_id: int,
  micro_batch_size: int,
  gather_bucket: int = 64,
) -> dict:
  """A KTO batch of (prompt ids, completion ids, label) examples: "completion" (row i:
  prompt i + completion i), "mismatched" (row i: prompt i+1 (mod N) + completion i, cut
  to seq_len: the completions under prompts they were not written for, KTO's KL
  estimate), "desirable" [N] bool, and zero "ref_completion" / "ref_mismatched" [N]
  (`make_reference_fn` fills them)."""
  n = len(examples)
  if n < 2:
    raise ValueError(f"a KTO batch needs >= 2 examples for its KL estimate, got {n}")
  prompts = [p for p, _, _ in list(examples[1:]) + list(examples[:1])]  # row i: prompt i+1 (mod N)
  rows = {
    "completion": [chat.concat_prompt_response(p, c) for p, c, _ in examples],
    "mismatched": [
      chat.concat_prompt_response(p, c[: seq_len - len(p)])
      for p, (_, c, _) in zip(prompts, examples)
    ],
  }
  batch = {
    name: sft.make_batch(
      half,
      seq_len=seq_len,
      pad_id=pad_id,
      micro_batch_size=micro_batch_size,
      gather_bucket=gather_bucket,
    )
    for name, half in rows.items()
  }
  zeros = np.zeros((n,), np.float32)
  labels = np.asarray([label for _, _, label in examples], bool)
  return {**batch, "desirable": labels, "ref_completion": zeros, "ref_mismatched": zeros.copy()}


def make_kto_loss_fn(fwd: policy.ForwardConfig, **hparams):
  """`loss_fn(trainable, frozen, micro_batch) -> (loss, metrics)`: KTO (`supervised.losses.
  kto_loss`, `hparams` beta, lambda_d, lambda_u) of a KTO micro-batch, its KL reference
  point estimated over the micro-batch's mismatched rows."""

  def loss_fn(trainable, frozen, micro_batch):
    params, adapters = policy.policy_params(trainable, frozen, fwd)
    logp = {
      name: _sequence_logprobs(params, adapters, micro_batch[name], fwd)
      for name in ("completion", "mismatched")
    }
    value, metrics = sft_losses.kto_loss(
      logp["completion"],
      micro_batch["ref_completion"],
      micro_batch["desirable"],
      logp["mismatched"],
      micro_batch["ref_mismatched"],
      **hparams,
    )
    return value, {k: v for k, v in metrics.items() if k != "loss"}

  return loss_fn


def synthetic_pairs(num_pairs: int, seed: int) -> list[dict[str, str]]:
  """Tiny preference set: prompt "a+b=", chosen the sum, rejected a refusal."""
  rng = np.random.default_rng(seed)
  pairs = rng.integers(0, 50, size=(num_pairs, 2))
  return [
    {"prompt": f"{a}+{b}=", "chosen": str(int(a + b)), "rejected": "I don't know."}
    for a, b in pairs
  ]


def unpaired(pairs: list[dict]) -> list[dict]:
  """KTO records of preference pairs: each chosen answer a desirable record, each rejected
  one an undesirable record, interleaved (prompt and system kept)."""
  return [
    {
      **{k: p[k] for k in ("prompt", "system") if k in p},
      "completion": p[key],
      "label": key == "chosen",
    }
    for p in pairs
    for key in ("chosen", "rejected")
  ]


def synthetic_kto(num_pairs: int, seed: int) -> list[dict]:
  """`synthetic_pairs` unpaired (`unpaired`)."""
  return unpaired(synthetic_pairs(num_pairs, seed))


def initial_reference(params):
  """A copy of the params (full-parameter DPO: the train state's params are donated)."""
  return jax.tree.map(jnp.copy, params)
