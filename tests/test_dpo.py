"""DPO: log 2 at policy == reference, gradient direction, learning a synthetic preference set."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import dpo as dpo_configs
from rlpost.supervised import dpo
from rlpost.supervised import sft
from rlpost.recipes import dpo as dpo_recipe
from rlpost.text import tokenizer as tokenizer_lib
from rlpost.models import decoder
from rlpost.models import families
from rlpost.models import policy
from conftest import assert_adapters_trained

CONFIG = families.get_config("tiny")
FWD = policy.ForwardConfig(CONFIG)
TOK = tokenizer_lib.byte_tokenizer()
SEQ = 32
BETA = 0.1


def _pair_batch(n, seed=0, micro=None):
  pairs = dpo.tokenize_pairs(dpo.synthetic_pairs(n, seed), TOK, SEQ)
  return dpo.make_pair_batch(pairs, seq_len=SEQ, pad_id=TOK.pad_id, micro_batch_size=micro or n)


@jax.jit
def _sequence_sum(params, half):
  logp = sft.target_logprobs(params, None, half, FWD)
  return jnp.sum(jnp.where(half["target_mask"], logp, 0.0))


_sequence_sum_grad = jax.jit(jax.grad(_sequence_sum))  # one program for both parametrizations


@pytest.mark.slow
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_policy_equals_reference(label_smoothing):
  """Loss is log 2 and grad = -(1 - 2 ls) beta / (2 N) * grad(sum chosen - sum rejected)."""
  params = decoder.init_params(jax.random.key(0), CONFIG)
  n = 4
  batch = jax.device_get(dpo.make_reference_fn(FWD, 2)(params, _pair_batch(n, micro=2)))
  batch_one = _pair_batch(n)  # one micro-batch, as the loss function sees it
  batch_one["ref_chosen"], batch_one["ref_rejected"] = batch["ref_chosen"], batch["ref_rejected"]
  loss_fn = dpo.make_loss_fn(FWD, beta=BETA, label_smoothing=label_smoothing)
  (loss, metrics), grads = jax.jit(
    jax.value_and_grad(lambda p: loss_fn(p, None, batch_one), has_aux=True)
  )(params)
  np.testing.assert_allclose(loss, math.log(2.0), rtol=1e-6)
  np.testing.assert_allclose(metrics["reward_margin"], 0.0, atol=1e-6)
  g_chosen = _sequence_sum_grad(params, batch_one["chosen"])
  g_rejected = _sequence_sum_grad(params, batch_one["rejected"])
  scale = -(1 - 2 * label_smoothing) * BETA / (2 * n)
  expected = jax.tree.map(lambda c, r: scale * (c - r), g_chosen, g_rejected)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads, expected)
  # A small step against the gradient raises chosen logprobs relative to rejected ones.
  stepped = jax.tree.map(lambda p, g: p - 1e-1 * g, params, grads)
  before = _sequence_sum(params, batch_one["chosen"]) - _sequence_sum(params, batch_one["rejected"])
  after = _sequence_sum(stepped, batch_one["chosen"]) - _sequence_sum(
    stepped, batch_one["rejected"]
  )
  assert after > before


def test_reference_matches_sequence_logprobs():
  params = decoder.init_params(jax.random.key(1), CONFIG)
  batch = jax.device_get(dpo.make_reference_fn(FWD, 2)(params, _pair_batch(4, micro=2)))
  whole = _pair_batch(4)
  target_logprobs = jax.jit(lambda p, b: sft.target_logprobs(p, None, b, FWD))
  for name in ("chosen", "rejected"):
    logp = target_logprobs(params, whole[name])
    expected = np.sum(np.where(whole[name]["target_mask"], logp, 0.0), axis=1)
    np.testing.assert_allclose(batch[f"ref_{name}"], expected, rtol=1e-5)


@pytest.mark.slow
def test_learns_synthetic_preferences(tmp_path):
  cfg = dpo_configs.get_config("tiny")
  cfg.train.steps = 30
  cfg.checkpoint.every = 1000
  state, record = dpo_recipe.run(cfg, str(tmp_path))
  assert record["reward_accuracy"] > 0.9, record
  # Preference accuracy over the whole training set, policy vs the initial params.
  n = cfg.data.num_synthetic
  pairs = dpo.tokenize_pairs(dpo.synthetic_pairs(n, cfg.seed), TOK, cfg.data.seq_len)
  batch = dpo.make_pair_batch(
    pairs, seq_len=cfg.data.seq_len, pad_id=TOK.pad_id, micro_batch_size=n
  )
  initial = decoder.init_params(jax.random.key(cfg.seed), CONFIG)
  ref_fn = dpo.make_reference_fn(FWD, n)
  ref, policy = ref_fn(initial, batch), ref_fn(state.trainable, batch)
  margin = (policy["ref_chosen"] - ref["ref_chosen"]) - (
    policy["ref_rejected"] - ref["ref_rejected"]
  )
  assert float(jnp.mean(margin > 0)) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("loss, overrides", [("orpo", {"orpo.lam": 1.0}), ("simpo", {})])
def test_reference_free_losses_learn_held_out_preferences_without_a_reference(
  loss, overrides, tmp_path, monkeypatch
):
  """ORPO and SimPO from `cfg.loss`, on the synthetic pairs: no reference copy is made and
  no reference pass runs; on 32 held-out pairs (another seed) the trained policy gives the
  chosen answer the higher mean token logprob in > 90% of pairs, and the mean margin grew
  from the initial model's. Mutation caught: the losses' pairs swapped (chosen and rejected
  halves exchanged in `make_loss_fn`)."""

  def refuse(*_):
    raise AssertionError(f"{loss} is reference-free: it must make no reference")

  monkeypatch.setattr(dpo, "initial_reference", refuse)
  monkeypatch.setattr(dpo, "make_reference_fn", refuse)
  cfg = dpo_configs.get_config("tiny")
  cfg.loss, cfg.train.steps, cfg.checkpoint.every = loss, 30, 1000
  for key, value in overrides.items():
    block, name = key.split(".")
    cfg[block][name] = value
  state, record = dpo_recipe.run(cfg, str(tmp_path))
  assert np.isfinite(record["loss"]) and "reward_accuracy" in record
  batch = _pair_batch(32, seed=cfg.seed + 1)

  def margins(params):
    mean = {}
    for half in ("chosen", "rejected"):
      logp = sft.target_logprobs(params, None, batch[half], FWD)
      mask = batch[half]["target_mask"]
      mean[half] = jnp.sum(jnp.where(mask, logp, 0.0), -1) / mask.sum(-1)
    return np.asarray(mean["chosen"] - mean["rejected"])

  trained = margins(state.trainable)
  initial = margins(decoder.init_params(jax.random.key(cfg.seed), CONFIG))
  assert np.mean(trained > 0) > 0.9 and trained.mean() > initial.mean(), (trained, initial)


@pytest.mark.slow
def test_kto_learns_held_out_preferences_from_unpaired_examples(tmp_path, monkeypatch):
  """KTO (`--config.loss=kto`) on the synthetic pairs as unpaired examples (each chosen
  answer desirable, each rejected one undesirable): its batches hold each completion under
  its own prompt and under the next example's (the KL estimate), with reference logprobs
  for both; on 32 held-out pairs the policy raises the chosen answer's logprob over the
  rejected one's, relative to the reference, in > 90% of pairs. Mutation caught: the
  labels ignored (every example treated as desirable)."""
  built = []
  inner = dpo.make_kto_batch
  monkeypatch.setattr(
    dpo, "make_kto_batch", lambda *a, **k: built.append(inner(*a, **k)) or built[-1]
  )
  cfg = dpo_configs.get_config("tiny")
  cfg.loss, cfg.train.steps, cfg.checkpoint.every = "kto", 40, 1000
  state, record = dpo_recipe.run(cfg, str(tmp_path))
  assert np.isfinite(record["loss"]) and record["kl"] >= 0
  b = built[0]
  assert b["desirable"].any() and not b["desirable"].all()
  tokens, mismatched = b["completion"]["tokens"], b["mismatched"]["tokens"]
  assert not np.array_equal(tokens, mismatched)  # other prompts, the same completions
  for i in range(len(tokens)):  # row i's completion, cut where the other prompt is longer
    own = tokens[i][b["completion"]["target_mask"][i]]
    other = mismatched[i][b["mismatched"]["target_mask"][i]]
    assert 0 < len(other) <= len(own) and np.array_equal(other, own[: len(other)]), i
  batch = _pair_batch(32, seed=cfg.seed + 1)
  initial = decoder.init_params(jax.random.key(cfg.seed), CONFIG)
  ref_fn = dpo.make_reference_fn(FWD, 32)
  ref, policy = ref_fn(initial, batch), ref_fn(state.trainable, batch)
  margin = (policy["ref_chosen"] - ref["ref_chosen"]) - (
    policy["ref_rejected"] - ref["ref_rejected"]
  )
  assert float(jnp.mean(margin > 0)) > 0.9, margin


@pytest.mark.slow
def test_lora_dpo_runs_and_validates(tmp_path):
  cfg = dpo_configs.get_config("tiny")
  cfg.lora.enabled, cfg.train.steps = True, 2
  state, record = dpo_recipe.run(cfg, str(tmp_path))
  assert np.isfinite(record["loss"]) and "reward_margin" in record
  assert_adapters_trained(jax.device_get(state.trainable))
  cfg.dpo.beta = 0.0
  with pytest.raises(ValueError, match=r"dpo\.beta"):
    dpo_recipe.check_config(cfg)
  cfg.dpo.beta, cfg.data.source = 0.1, "jsonl"
  with pytest.raises(ValueError, match=r"data\.path"):
    dpo_recipe.check_config(cfg)


def test_empty_preference_file_fails_naming_data_path(tmp_path):
  """A JSONL file with no records (empty, or blank lines only) fails naming data.path,
  before a model is loaded, as SFT's does.

  Mutation caught: no emptiness check (the run loads the model, then fails deep in the
  data cursor with 'dataset_size=0 must be >= 1').
  """
  path = tmp_path / "prefs.jsonl"
  path.write_text("\n  \n")
  cfg = dpo_configs.get_config("tiny")
  cfg.data.source, cfg.data.path = "jsonl", str(path)
  dpo_recipe.check_config(cfg)
  with pytest.raises(ValueError, match=r"config\.data\.path=.*prefs\.jsonl.*no preference pairs"):
    dpo_recipe.records(cfg)


def test_infinite_dpo_beta_fails_naming_the_field():
  """`--config.dpo.beta=inf` fails at start-up naming config.dpo.beta (it used to train on
  NaN losses: inf * a zero margin).

  Mutation caught: `beta > 0` without isfinite.
  """
  cfg = dpo_configs.get_config("tiny")
  cfg.dpo.beta = float("inf")
  with pytest.raises(ValueError, match=r"config\.dpo\.beta=inf: must be a finite number > 0"):
    dpo_recipe.check_config(cfg)


@pytest.mark.parametrize(
  "overrides, match",
  [
    ({"loss": "ipo"}, r"config\.loss='ipo': use one of dpo, orpo, simpo"),
    ({"loss": "simpo", "simpo.beta": 0.0}, r"config\.simpo\.beta=0\.0: must be a finite"),
    ({"loss": "simpo", "simpo.gamma": float("nan")}, r"config\.simpo\.gamma=nan"),
    ({"loss": "orpo", "orpo.lam": -1.0}, r"config\.orpo\.lam=-1\.0: must be a finite number >= 0"),
    ({"loss": "kto", "kto.lambda_u": 0.0}, r"config\.kto\.lambda_u=0\.0: must be a finite"),
    (
      {"loss": "kto", "train.batch_size": 1, "train.micro_batch_size": 1},
      r"config\.train\.batch_size=1: KTO estimates",
    ),
  ],
)
def test_a_bad_preference_loss_or_its_setting_is_named(overrides, match):
  """The loss name and each loss's own block are checked at start-up, naming the field;
  a bad setting of a loss not chosen is not read."""
  cfg = dpo_configs.get_config("tiny")
  cfg.orpo.lam = -5.0  # read only when loss=orpo
  for key, value in overrides.items():
    if "." in key:
      block, name = key.split(".")
      cfg[block][name] = value
    else:
      cfg[key] = value
  with pytest.raises(ValueError, match=match):
    dpo_recipe.check_config(cfg)
