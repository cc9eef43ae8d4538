"""Host-side orchestration of one rollout: prompts -> sampler -> texts -> RL batch.

The RL batch (what `train_step` consumes; N = B * G rows, prompt-major):
  tokens          [N, P + T] int32  left-padded prompt, then the completion
  positions       [N, P + T] int32  per-row positions (pad slots: 0)
  valid           [N, P + T] bool   real prompt tokens and generated tokens
  completion_mask [N, T]     float32 1 on generated tokens (stop token included)
  sampler_logp    [N, T]     float32 logprobs the sampler reported
Algorithms add advantages [N], old_logp / ref_logp [N, T] (see experiments/grpo.py).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import logprobs as logprobs_lib
from rlpost import sampling
from rlpost.models import gemma3
from rlpost.logprobs import causal_attention_mask


def rollout_batch(tokens_BxP, lengths_B, out: sampling.SampleOutput, num_samples: int) -> dict:
  """Joins left-padded prompts (repeated per sample) and sampled completions."""
  prompts = np.repeat(np.asarray(tokens_BxP), num_samples, axis=0)
  lengths = np.repeat(np.asarray(lengths_B), num_samples)
  N, P = prompts.shape
  T = out.tokens.shape[1]
  mask = np.asarray(out.mask)
  prompt_valid = np.arange(P)[None, :] >= (P - lengths)[:, None]
  prompt_pos = np.maximum(np.arange(P)[None, :] - (P - lengths)[:, None], 0)
  completion_pos = lengths[:, None] + np.arange(T)[None, :]
  return {
      "tokens": np.concatenate([prompts, np.asarray(out.tokens)], 1).astype(np.int32),
      "positions": np.concatenate([prompt_pos, completion_pos], 1).astype(np.int32),
      "valid": np.concatenate([prompt_valid, mask], 1),
      "completion_mask": mask.astype(np.float32),
      "sampler_logp": np.asarray(out.logprobs, np.float32),
  }


def _stop_length(tokens: list[int], tokenizer, stop_strings) -> int | None:
  """Fewest leading tokens whose decoded text contains a stop string (None: never).

  Decodes whole prefixes (decoding token by token would drop SentencePiece's
  word-initial spaces); containment only grows with the prefix, so a binary
  search needs O(log n) decodes.
  """
  hit = lambda n: any(s in tokenizer.decode(tokens[:n]) for s in stop_strings)
  if not tokens or not hit(len(tokens)):
    return None
  lo, hi = 1, len(tokens)         # hit(hi) holds; find the smallest such n
  while lo < hi:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if hit(mid) else (mid + 1, hi)
  return lo


def truncate_at_stop_strings(batch: dict, tokenizer, stop_strings) -> dict:
  """Ends each completion at the token that completes any of `stop_strings` (host side).

  The sampler stops on token ids only; multi-token stops (e.g. a few-shot
  prompt's "</answer>") are applied here by shrinking the masks, exactly as if
  generation had stopped there.
  """
  if not stop_strings:
    return batch
  mask = batch["completion_mask"].copy()
  P = batch["tokens"].shape[1] - mask.shape[1]
  for row in range(mask.shape[0]):
    n = int(mask[row].sum())
    end = _stop_length([int(t) for t in batch["tokens"][row, P:P + n]], tokenizer, stop_strings)
    if end is not None:
      mask[row, end:] = 0
  valid = batch["valid"].copy()
  valid[:, P:] = mask > 0
  return {**batch, "completion_mask": mask, "valid": valid}


def completion_texts(batch: dict, tokenizer) -> list[str]:
  """Decoded completions (masked tokens dropped)."""
  T = batch["completion_mask"].shape[1]
  comp = batch["tokens"][:, -T:]
  return [tokenizer.decode([int(t) for t, m in zip(row, mrow) if m > 0])
          for row, mrow in zip(comp, batch["completion_mask"])]


def completion_logprobs(params, batch: dict, *, model_config: gemma3.Config, temperature: float,
                        adapters=None, lora_scale: float = 1.0, chunk: int = 256,
                        return_entropy: bool = False, remat: str | None = None,
                        compute_dtype=None):
  """Per-token logprobs [N, T] (and entropy) of the completion tokens under `params`.

  Uses the same forward and temperature scaling as the sampler, so with the
  sampler's own params it reproduces `sampler_logp` (float32, ~1e-5). `remat` is
  `gemma3.forward`'s activation-checkpointing policy (training only);
  `compute_dtype` its matmul input dtype (None: the params' dtype).
  """
  tokens, valid = batch["tokens"], batch["valid"]
  T = batch["completion_mask"].shape[1]
  P = tokens.shape[1] - T
  hidden, _ = gemma3.forward(params, tokens, batch["positions"], causal_attention_mask(valid),
                             config=model_config, return_hidden=True, adapters=adapters,
                             lora_scale=lora_scale, remat=remat, compute_dtype=compute_dtype)
  return logprobs_lib.token_logprobs(hidden[:, P - 1:P + T - 1], params["embed"], tokens[:, P:],
                                     batch["completion_mask"] > 0, temperature=temperature,
                                     chunk=chunk, return_entropy=return_entropy,
                                     compute_dtype=compute_dtype)


@functools.partial(jax.jit, static_argnames=("model_config", "temperature", "lora_scale", "chunk",
                                             "compute_dtype"))
def completion_logprobs_jit(params, batch, adapters=None, *, model_config, temperature,
                            lora_scale=1.0, chunk=256, compute_dtype=None):
  """Jitted `completion_logprobs` without entropy (reference / old-policy logprobs)."""
  return completion_logprobs(params, batch, model_config=model_config, temperature=temperature,
                             adapters=adapters, lora_scale=lora_scale, chunk=chunk,
                             compute_dtype=compute_dtype)
