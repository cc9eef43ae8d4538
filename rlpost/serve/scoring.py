"""Top-k alternatives of sampled tokens (`top_logprobs`) by one teacher-forced forward.

The sampler reports only the sampled token's logprob; the alternatives come from a
forward over [prompt | sampled tokens] with the sampler's temperature (1 for greedy),
log_softmax over the full vocabulary. The output projection runs a few positions at a
time (`lax.map`; at most CHUNK, within LOGITS_BUDGET), so no [B, N, V] array exists.
"""

import functools

import jax
import jax.numpy as jnp

from rlpost.models import decoder

MAX_TOP_LOGPROBS = 20  # OpenAI's limit; the forward always keeps this many (one program)
CHUNK = 16  # positions per projection, fewer when [B, CHUNK, V] would pass LOGITS_BUDGET
LOGITS_BUDGET = 1 << 24  # float32 elements (64 MiB)


@functools.partial(jax.jit, static_argnames=("model_config", "temperature", "k"))
def top_logprobs(
  params, prompt_BxP, lengths_B, sampled_BxN, mask_BxN, *, model_config, temperature, k
):
  """The k most likely next tokens before each sampled one.

  Args:
    prompt_BxP: [B, P] int32, left-padded prompts; lengths_B [B] int32 their lengths.
    sampled_BxN: [B, N] int32, sampled tokens; mask_BxN [B, N] bool marks them.
    temperature: logits are divided by it (> 0).

  Returns:
    (ids [B, N, k] int32, logprobs [B, N, k] float32), most likely first; rows of
    unsampled slots hold whatever the padding predicts.
  """
  B, P = prompt_BxP.shape
  N = sampled_BxN.shape[1]
  tokens = jnp.concatenate([prompt_BxP, sampled_BxN], axis=1)
  valid = jnp.concatenate([jnp.arange(P)[None, :] >= (P - lengths_B)[:, None], mask_BxN], axis=1)
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  causal = jnp.tril(jnp.ones((P + N, P + N), bool))
  attn = causal[None] & valid[:, None, :]
  hidden, _ = decoder.forward(
    params, tokens, positions, attn, config=model_config, return_hidden=True
  )
  before = hidden[:, P - 1 : P + N - 1]  # [B, N, D]: the state predicting each sampled token
  chunk = max(1, min(CHUNK, LOGITS_BUDGET // (B * model_config.vocab_size)))
  chunks = jnp.pad(before, ((0, 0), (0, -N % chunk), (0, 0)))
  chunks = chunks.reshape(B, -1, chunk, chunks.shape[-1]).swapaxes(0, 1)

  def one(h_BxCxD):
    logits = decoder.logits_from_hidden(params, h_BxCxD) / temperature
    logp, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), k)
    return ids.astype(jnp.int32), logp

  ids, logp = jax.lax.map(one, chunks)
  unchunk = lambda x: x.swapaxes(0, 1).reshape(B, -1, k)[:, :N]
  return unchunk(ids), unchunk(logp)
