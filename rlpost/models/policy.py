"""The policy seen by a trainer: one static forward config, and which weights train.

`ForwardConfig` holds every setting of a training-side forward pass besides the
weights (architecture, LoRA, matmul dtype, activation remat, logprob chunk,
sampling temperature): one frozen, hashable value to close over or pass as a
static argument, instead of five keyword arguments threaded through each call.

Trainable vs frozen: with LoRA the train state holds the adapters and the base
params are passed alongside, frozen; without LoRA the train state holds the
params. `policy_params` turns (trainable, frozen) back into (params, adapters).
"""

import dataclasses
import functools

import jax

from rlpost.models import decoder
from rlpost.models import lora as lora_lib
from rlpost.ops import logprobs as logprobs_lib
from rlpost.ops.masks import causal_attention_mask

REMAT = {"none": None, "dots": "dots", "full": "full"}  # name -> decoder.forward's policy


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
  """Static settings of the trainer's forward pass.

  model: the architecture.
  lora: adapter config when LoRA trains (adapters unmerged in the forward), else None.
  compute_dtype: matmul input dtype of the trainer (float32 accumulation; see
    `decoder.forward`); None: the params' dtype.
  remat: activation policy for the backward pass, one of REMAT.
  logprob_chunk: tokens per chunk of the [chunk, V] output projection.
  temperature: logits are divided by it (the sampler's, so that trainer and
    sampler compute the same logprobs); 1 for SFT / DPO.
  fsdp_axis: inside the train step's shard_map with FSDP, the mesh axis over
    which each layer's weights are gathered in the layer scan
    (`rlpost.train.sharding.train_forward`); None everywhere else.
  """

  model: decoder.Config
  lora: lora_lib.LoraConfig | None = None
  compute_dtype: str | None = None
  remat: str = "none"
  logprob_chunk: int = 256
  temperature: float = 1.0
  fsdp_axis: str | None = None

  def __post_init__(self):
    if self.compute_dtype is not None and self.compute_dtype not in decoder.COMPUTE_DTYPES:
      raise ValueError(
        f"ForwardConfig.compute_dtype={self.compute_dtype!r}: use one of {decoder.COMPUTE_DTYPES}"
      )
    if self.remat not in REMAT:
      raise ValueError(
        f"ForwardConfig.remat={self.remat!r}: use one of {tuple(REMAT)} (none "
        "keeps every activation, dots keeps matmul outputs, full keeps layer "
        "inputs only)"
      )
    if self.logprob_chunk < 1:
      raise ValueError(f"ForwardConfig.logprob_chunk={self.logprob_chunk}: use >= 1 tokens")
    if not self.temperature > 0:
      raise ValueError(
        f"ForwardConfig.temperature={self.temperature}: the trainer needs a "
        "temperature > 0 (greedy sampling has no logprobs to train on)"
      )

  @property
  def lora_scale(self) -> float:
    return self.lora.scale if self.lora else 1.0

  def without_remat(self) -> "ForwardConfig":
    """The same forward for calls without gradients (reference / old-policy logprobs)."""
    return dataclasses.replace(self, remat="none")


def policy_params(trainable, frozen, fwd: ForwardConfig):
  """(params, adapters): LoRA trains adapters over frozen base params; else the params train."""
  return (frozen, trainable) if fwd.lora else (trainable, None)


_merged_weights = jax.jit(lora_lib.merged_weights, static_argnums=2)


def sampling_params(trainable, frozen, fwd: ForwardConfig):
  """Weights the sampler reads: LoRA merged once per rollout (exactly the trained policy).
  Only the merged stacks come out of a program; the rest is passed through (a program's
  output is a copy: 0.25 s a rollout for Gemma 3 270M's embedding)."""
  params, adapters = policy_params(trainable, frozen, fwd)
  if adapters is None:
    return params
  adapted = {name: params["layers"][name] for name in adapters["layers"]}
  merged = _merged_weights(adapted, adapters, fwd.lora)
  return {**params, "layers": {**params["layers"], **merged}}


def hidden_states(
  params,
  adapters,
  tokens_BxS,
  positions_BxS,
  attn_mask_BxSxS,
  fwd: ForwardConfig,
  shared_prefix: int = 0,
) -> jax.Array:
  """Final-normed hidden states [B, S, D] float32 of the policy (no logits); the first
  `shared_prefix` slots computed once (`decoder.forward`)."""
  hidden_BxSxD, _ = decoder.forward(
    params,
    tokens_BxS,
    positions_BxS,
    attn_mask_BxSxS,
    config=fwd.model,
    return_hidden=True,
    adapters=adapters,
    lora_scale=fwd.lora_scale,
    remat=REMAT[fwd.remat],
    compute_dtype=fwd.compute_dtype,
    gather=_layer_gather(fwd.fsdp_axis),
    shared_prefix=shared_prefix,
  )
  return hidden_BxSxD


def _layer_gather(axis: str | None):
  """None, or the function gathering one layer's weight shards (split on their first dim)."""
  if axis is None:
    return None
  return lambda tree: jax.tree.map(lambda x: jax.lax.all_gather(x, axis, axis=0, tiled=True), tree)


def completion_hidden(params, adapters, batch, fwd: ForwardConfig) -> jax.Array:
  """`[N, T, D]` hidden states of an `RLBatch` at the slots that predict its completion.

  Slot P + t - 1 predicts completion token t (slot P + t): logprobs and critic
  values of token t are both read there. The batch's `shared_prefix` slots are
  computed once.
  """
  P, T = batch.prompt_len, batch.completion_len
  mask_BxSxS = causal_attention_mask(batch.valid)
  hidden_BxSxD = hidden_states(
    params, adapters, batch.tokens, batch.positions, mask_BxSxS, fwd, batch.shared_prefix
  )
  return hidden_BxSxD[:, P - 1 : P + T - 1]


def token_logprobs(
  hidden_BxTxD,
  embed_VxD,
  targets_BxT,
  mask_BxT,
  fwd: ForwardConfig,
  return_entropy: bool = False,
  slots_BxC=None,
):
  """`ops.logprobs.token_logprobs` with the config's temperature, chunk and matmul dtype;
  with `slots_BxC` ([B, C] int, -1: none) only those slots are projected
  (`ops.logprobs.token_logprobs_at_slots`)."""
  kwargs = dict(
    temperature=fwd.temperature,
    chunk=fwd.logprob_chunk,
    return_entropy=return_entropy,
    compute_dtype=fwd.compute_dtype,
  )
  if slots_BxC is None:
    return logprobs_lib.token_logprobs(hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, **kwargs)
  return logprobs_lib.token_logprobs_at_slots(
    hidden_BxTxD, embed_VxD, targets_BxT, mask_BxT, slots_BxC, **kwargs
  )


def completion_logprobs(params, adapters, batch, fwd: ForwardConfig, return_entropy: bool = False):
  """Trainer logprobs [N, T] float32 (and entropy) of the completion's loss tokens.

  The same forward and temperature as the sampler, so with the sampler's own
  weights it reproduces `batch.sampler_logp` (float32, ~1e-5). Slots off
  `loss_mask` are 0.
  """
  hidden_BxTxD = completion_hidden(params, adapters, batch, fwd)
  return logprobs_from_hidden(hidden_BxTxD, params, batch, fwd, return_entropy)


def logprobs_from_hidden(hidden_BxTxD, params, batch, fwd, return_entropy):
  """Logprobs [N, T] (and entropy) at the loss tokens; only `batch.loss_slots` when set."""
  return token_logprobs(
    hidden_BxTxD,
    decoder.output_matrix(params),
    batch.tokens[:, batch.prompt_len :],
    batch.loss_mask > 0,
    fwd,
    return_entropy=return_entropy,
    slots_BxC=batch.loss_slots,
  )


@functools.partial(jax.jit, static_argnames=("fwd",))
def completion_logprobs_jit(params, adapters, batch, fwd: ForwardConfig):
  """Jitted `completion_logprobs` without gradients (reference / old-policy logprobs)."""
  return completion_logprobs(params, adapters, batch, fwd.without_remat())
