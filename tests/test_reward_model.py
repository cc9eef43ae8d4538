"""Reward models: the Bradley-Terry loss, the score's token, a tiny run and its resume."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_metrics, with_overrides

from experiments.configs import reward_model as rm_configs
from rlpost.data import chat
from rlpost.models import decoder, families, policy
from rlpost.ops import masks
from rlpost.recipes import common
from rlpost.recipes import reward_model as rm_recipe
from rlpost.supervised import classifier_metrics, dpo, losses, reward_model
from rlpost.text import tokenizer as tokenizer_lib

CONFIG = families.get_config("tiny")
FWD = policy.ForwardConfig(CONFIG)
TOK = tokenizer_lib.byte_tokenizer()


def test_bradley_terry_loss_and_gradient_equal_the_formula():
  """-mean log sigmoid(s_c - s_r) in float64, its gradient d/ds_c = -(1 - sigmoid(m)) / B
  and d/ds_r its negative; accuracy counts strict wins. Mutation caught: the margin's sign
  flipped (rejected over chosen)."""
  rng = np.random.default_rng(0)
  chosen, rejected = rng.normal(0, 3, 7), rng.normal(0, 3, 7)
  m = chosen - rejected
  loss, metrics = losses.bradley_terry_loss(jnp.asarray(chosen), jnp.asarray(rejected))
  np.testing.assert_allclose(loss, np.mean(np.log1p(np.exp(-m))), rtol=1e-6)
  np.testing.assert_allclose(metrics["accuracy"], np.mean(m > 0))
  grad = jax.grad(lambda c, r: losses.bradley_terry_loss(c, r)[0], (0, 1))
  gc, gr = grad(jnp.asarray(chosen, jnp.float32), jnp.asarray(rejected, jnp.float32))
  want = -(1 - 1 / (1 + np.exp(-m))) / len(m)
  np.testing.assert_allclose(gc, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(gr, -want, rtol=1e-5, atol=1e-7)


def test_a_score_reads_the_hidden_state_at_the_responses_last_token():
  """A row's score is the head on the hidden state of its last response token: the same
  as scoring the unpadded sequence alone at its final position (so padding after the
  response, and the other rows, change nothing). Mutation caught: the score read at the
  first response token."""
  pairs = dpo.tokenize_pairs(dpo.synthetic_pairs(4, 0), TOK, 32)
  batch = dpo.make_pair_batch(pairs, seq_len=32, pad_id=TOK.pad_id, micro_batch_size=1)
  params = decoder.init_params(jax.random.key(0), CONFIG)
  dim = params["embed"].shape[1]
  head = {"w": jax.random.normal(jax.random.key(1), (dim, 1)), "b": jnp.float32(0.3)}
  trainable = {"trunk": params, "head": head}
  got = reward_model.scores(trainable, None, batch["rejected"], FWD)
  for i, (prompt, _, rejected) in enumerate(pairs):
    tokens, _ = chat.concat_prompt_response(prompt, rejected)
    ids, pos = tokens[None], np.arange(len(tokens))[None]
    mask = masks.causal_attention_mask(np.ones_like(ids))
    hidden = policy.hidden_states(params, None, ids, pos, mask, FWD)
    want = hidden[0, -1] @ head["w"][:, 0] + head["b"]
    np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tiny_reward_model_ranks_held_out_pairs_and_resumes_exactly(tmp_path):
  """The tiny config on DPO's synthetic pairs: held-out pairwise accuracy (`eval/accuracy`,
  the last 16 pairs, never trained on) reaches 1.0 from chance; stopped after 20 steps and
  resumed, the run ends with the uninterrupted run's weights and metrics (~9 s: two
  40-step tiny runs); `common.reward_model_from_run` restores its weights, and scores RL rows (left-padded
  prompts, completion slots) as the pair rows it trained on. Mutation caught: the
  Bradley-Terry margin with its sign flipped."""
  cfg = rm_configs.get_config("tiny")
  state, record = rm_recipe.run(cfg, str(tmp_path / "whole"))
  assert record["eval/accuracy"] == 1.0 and record["eval/margin"] > 1.0, record
  first = run_metrics(tmp_path / "whole")[cfg.eval.every - 1]
  assert first["eval/accuracy"] >= 0.9
  rm_recipe.run(cfg, str(tmp_path / "resumed"), stop_after=20)
  resumed, _ = rm_recipe.run(cfg, str(tmp_path / "resumed"))
  for a, b in zip(jax.tree.leaves(state.trainable), jax.tree.leaves(resumed.trainable)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert run_metrics(tmp_path / "whole") == run_metrics(tmp_path / "resumed")
  trainable, frozen, fwd, tok = common.reward_model_from_run(str(tmp_path / "whole"))
  for a, b in zip(jax.tree.leaves(state.trainable), jax.tree.leaves(trainable)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  pairs = dpo.tokenize_pairs(dpo.synthetic_pairs(4, 5), tok, cfg.data.seq_len)
  rows = dpo.make_pair_batch(pairs, seq_len=cfg.data.seq_len, pad_id=tok.pad_id, micro_batch_size=1)
  want = reward_model.scores(trainable, frozen, rows["chosen"], fwd)
  got = reward_model.batch_scores(trainable, frozen, _rl_rows([(p, c) for p, c, _ in pairs]), fwd)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  _check_scored_examples(tmp_path, trainable, frozen, fwd, tok, 2 * cfg.data.seq_len)


def _check_scored_examples(tmp_path, trainable, frozen, fwd, tok, seq_len):
  """`score_examples` on labelled samples written as KTO records (held-out pairs' chosen
  labelled correct, rejected wrong) in rows of `seq_len` (the refusals do not fit the run's
  own): the pair rows' scores in file order, labels as written, AUROC 1.0 for this trained
  model; a record longer than the rows is an error naming its file and line."""
  held_out = dpo.synthetic_pairs(6, 7)
  path = tmp_path / "examples.jsonl"
  records = [
    {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
    for r in held_out
    for k in ("chosen", "rejected")
  ]
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  scores, labels = rm_recipe.score_examples(str(tmp_path / "whole"), str(path), seq_len)
  assert labels.tolist() == [r["label"] for r in records]
  rows = dpo.make_pair_batch(
    dpo.tokenize_pairs(held_out, tok, seq_len),
    seq_len=seq_len,
    pad_id=tok.pad_id,
    micro_batch_size=1,
  )
  for half, got in (("chosen", scores[0::2]), ("rejected", scores[1::2])):
    want = reward_model.scores(trainable, frozen, rows[half], fwd)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert classifier_metrics.auroc(scores, labels) == 1.0
  records[3]["completion"] = "9" * seq_len
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  with pytest.raises(
    ValueError, match=r"examples\.jsonl:4: prompt \+ completion is \d+ tokens, longer"
  ):
    rm_recipe.score_examples(str(tmp_path / "whole"), str(path), seq_len)


def _rl_rows(examples):
  """An `RLBatch` of (prompt, response) ids: prompts left-padded to the longest + 3 slots,
  responses in completion slots (loss mask on them) with a padded tail of 5."""
  from rlpost.rl import batch as batch_lib  # pylint: disable=g-import-not-at-top

  n = len(examples)
  P, T = max(len(p) for p, _ in examples) + 3, max(len(r) for _, r in examples) + 5
  tokens, valid = np.zeros((n, P + T), np.int32), np.zeros((n, P + T), bool)
  positions, loss_mask = np.zeros((n, P + T), np.int32), np.zeros((n, T), np.float32)
  for i, (prompt, response) in enumerate(examples):
    tokens[i, P - len(prompt) : P], tokens[i, P : P + len(response)] = prompt, response
    valid[i, P - len(prompt) : P + len(response)] = True
    positions[i, P - len(prompt) :] = np.arange(len(prompt) + T)
    loss_mask[i, : len(response)] = 1
  return batch_lib.RLBatch(tokens, positions, valid, loss_mask, np.zeros((n, T), np.float32))


def test_held_out_pairs_are_checked():
  """Holding out more than half the pairs fails naming eval.num_examples."""
  cfg = rm_configs.get_config("tiny")
  cfg.eval.num_examples = 40
  with pytest.raises(ValueError, match=r"config\.eval\.num_examples=40: would hold out 40 of 64"):
    rm_recipe.records(cfg)


@pytest.mark.slow
def test_a_reward_models_scores_join_the_rl_rewards(tmp_path, monkeypatch):
  """GRPO on the tiny digit task with `reward_model.path` (weight 2, rule_weight 0.5): each
  episode's reward is 0.5 * its rule-based reward + 2 * the reward model's score of its
  rows (checked against `batch_scores` of the restored model, over a base of its own, on
  the same rows: the LoRA reward model reads the policy's base, loading none), the score
  on the last turn's reward; the metrics report it. A reward model over another model
  family's tokenizer is refused, naming reward_model.path. Mutation caught: the score
  added without its weight."""
  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top
  from rlpost.rl import batch as batch_lib  # pylint: disable=g-import-not-at-top

  rm_cfg = rm_configs.get_config("tiny")
  rm_cfg.train.steps, rm_cfg.checkpoint.every, rm_cfg.lora.enabled = 5, 5, True
  rm_recipe.run(rm_cfg, str(tmp_path / "rm"))
  cfg = with_overrides(
    grpo_gsm8k.get_config("tiny"),
    {
      "train.steps": 1,
      "reward_model.path": str(tmp_path / "rm"),
      "reward_model.weight": 2.0,
      "reward_model.rule_weight": 0.5,
    },
  )
  seen, inner = [], rl._with_learned_reward  # pylint: disable=protected-access
  monkeypatch.setattr(rl, "_with_learned_reward", lambda p, out: seen.append(out) or inner(p, out))
  rl.run(cfg, str(tmp_path / "grpo"))
  (before,) = seen
  loads, load = [], common.load_model
  monkeypatch.setattr(common, "load_model", lambda c: loads.append(c) or load(c))
  after, _ = inner(rl.build(cfg), before)
  assert len(loads) == 1  # the LoRA reward model reads the policy's base, no copy of its own
  monkeypatch.setattr(common, "load_model", load)
  trainable, frozen, fwd, _ = common.reward_model_from_run(str(tmp_path / "rm"))  # its own
  want = reward_model.batch_scores(trainable, frozen, batch_lib.to_device(before.batch), fwd)
  np.testing.assert_allclose(after.rewards, 0.5 * before.rewards + 2 * np.asarray(want), 1e-5, 1e-5)
  np.testing.assert_allclose(after.turn_rewards.sum(1), after.rewards, 1e-5, 1e-5)
  record = run_metrics(tmp_path / "grpo")[-1]
  np.testing.assert_allclose(record["reward_model/score"], np.mean(want), 1e-5, 1e-5)
  rm_cfg.model.preset = "llama_tiny"  # a byte tokenizer with ChatML's turn tokens
  rm_recipe.run(rm_cfg, str(tmp_path / "rm_llama"))
  cfg.reward_model.path = str(tmp_path / "rm_llama")
  with pytest.raises(ValueError, match=r"config\.reward_model\.path=.*its tokenizer"):
    rl.build(cfg)


def test_learned_reward_joins_each_episodes_last_turn():
  """Multi-turn rows (PPO's per-turn rewards, the agentic recipe): the weighted score goes
  on each row's last sampled token, after the rule-based turn rewards are weighted, and
  into the episode reward; a row with no sampled token keeps no turn score."""
  import types  # pylint: disable=g-import-not-at-top

  from rlpost.envs import multiturn  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import blocks, rl  # pylint: disable=g-import-not-at-top
  from rlpost.rl import batch as batch_lib  # pylint: disable=g-import-not-at-top

  loss_mask = np.array([[1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]], np.float32)
  turn = np.zeros((3, 6), np.float32)
  turn[0, 1], turn[0, 3], turn[1, 0], turn[1, 4] = 1.0, -0.5, 0.25, 2.0
  n, s = loss_mask.shape[0], loss_mask.shape[1] + 2
  rows = batch_lib.RLBatch(
    np.zeros((n, s), np.int32),
    np.zeros((n, s), np.int32),
    np.ones((n, s), bool),
    loss_mask,
    0 * turn,
  )
  out = multiturn.Rollout(rows, turn.sum(1), turn, [])
  config = types.SimpleNamespace(reward_model=blocks.LearnedRewardConfig("rm", 2.0, 0.5))
  p = types.SimpleNamespace(config=config, scorer=lambda b: np.array([0.1, -1.0, 3.0], np.float32))
  got, metrics = rl._with_learned_reward(p, out)  # pylint: disable=protected-access
  want = 0.5 * turn
  want[0, 3] += 0.2
  want[1, 4] += -2.0
  np.testing.assert_allclose(got.turn_rewards, want, atol=1e-6)
  np.testing.assert_allclose(
    got.rewards, 0.5 * turn.sum(1) + 2.0 * np.array([0.1, -1.0, 3.0]), 1e-6
  )
  np.testing.assert_allclose(metrics["reward_model/score"], np.mean([0.1, -1.0, 3.0]), 1e-6)
