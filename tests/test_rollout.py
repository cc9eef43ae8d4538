"""The sampler's weights at each sync (`rlpost.recipes.rollout`): an int8 or 4-bit copy
whose output rows, under LoRA (a frozen output projection), are made once and reused."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import lora
from rlpost.models import policy
from rlpost.models import quant
from rlpost.models import quant4
from rlpost.recipes import rollout

# NF4 needs inputs in multiples of 32 (the tiny preset's width is 16).
_CONFIG = dataclasses.replace(families.get_config("tiny"), embed_dim=64, mlp_dim=128)


def _run_config(weights: str):
  sampling = types.SimpleNamespace(weights=weights, int8_paths="oik:0", int4_matmul="xla")
  return types.SimpleNamespace(mesh=None, sampling=sampling)


def _trained_adapters(params, config):
  adapters = lora.init_adapters(jax.random.key(1), params, config)
  # B = 0 at initialisation merges to nothing: give every adapter a visible delta
  return jax.tree.map(lambda a: a + 0.05, adapters)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_lora_samplers_make_the_output_rows_once_and_read_them_at_every_sync(weights):
  """LoRA with int8 / 4-bit rollouts: `make_sampler` makes the frozen output
  projection's int8 rows once; every sync hands those very arrays to the sampler, and its
  weights equal, bit for bit, both the copy made whole at that sync (no rows kept) and
  `quant.quantize_for_sampling` / `quant4.for_sampling` of the merged params. Full
  fine-tuning (the output projection trains) keeps none. Mutation caught: the rows made
  again at each sync (`sampler_rows_remade_each_sync`)."""
  params = decoder.init_params(jax.random.key(0), _CONFIG)
  config = lora.LoraConfig(rank=4)
  adapters = _trained_adapters(params, config)
  fwd = policy.ForwardConfig(model=_CONFIG, lora=config)
  sampler = rollout.make_sampler(_run_config(weights), params, fwd)
  assert sampler.unembed is not None
  whole = sampler._replace(unembed=None)
  key = jax.random.key(2)
  for step in range(2):
    adapters = jax.tree.map(lambda a: a * (1 + step), adapters)
    got, _ = rollout.sampler_weights(sampler, adapters, fwd, key, None)
    assert got["unembed"].q is sampler.unembed.q
    made, _ = rollout.sampler_weights(whole, adapters, fwd, key, None)
    merged = policy.sampling_params(adapters, params, fwd)
    if weights == "int8":
      want = quant.quantize_for_sampling(merged, paths=quant.parse_paths("oik:0"))
    else:
      want = quant4.for_sampling(merged)
    for other in (made, want):
      assert jax.tree.structure(got) == jax.tree.structure(other)
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(other), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  full = policy.ForwardConfig(model=_CONFIG)
  assert rollout.make_sampler(_run_config(weights), params, full).unembed is None
