"""rlpost/envs/agent.py: an agent behind the endpoint as an environment (issue 68 part 3).

Fast: the rows `rollout_of` builds from played episodes (hand-made segments), the config's
checks, the task sources, the endpoint's fixed temperature. Slow: one tiny GRPO iteration
of the calculator agent through the endpoint, checked against the session records.
"""

import json
import threading
import types

import numpy as np
import pytest

from rlpost import errors
from rlpost.envs import agent as agent_env
from rlpost.envs import table
from rlpost.rl import advantages as adv_lib
from rlpost.serve import agents
from rlpost.serve import scheduler
from rlpost.serve import sessions

PAD = 0
TOKENIZER = types.SimpleNamespace(pad_id=PAD, decode=lambda ids: " ".join(map(str, ids)))


def _segment(context, *turns):
  """A Segment: `context` ids, then per turn (sampled ids, observation ids after them);
  sampled id t has logprob -t/100."""
  tokens, mask, logp = list(context), [0] * len(context), [0.0] * len(context)
  for sampled, after in turns:
    tokens += sampled + after
    mask += [1] * len(sampled) + [0] * len(after)
    logp += [-t / 100 for t in sampled] + [0.0] * len(after)
  return sessions.Segment(tuple(tokens), tuple(mask), tuple(logp))


def _episode(reward, *segments, error=None):
  return agents.Episode(
    {"q": reward}, reward, 0.0 if error else 1.0, error, segments, max(0, len(segments) - 1)
  )


def test_rows_hold_the_sampled_tokens_with_loss_only_on_them():
  """Each row is its episode's segment, context left-padded, loss on the sampled ids only,
  the reward on the last sampled token. Mutation caught (tests/mutations/mutations.py
  agent_env_reward_on_first_token): the reward on a row's first sampled token."""
  a = _segment([5, 6, 7], ([11, 12], [8, 9]), ([13], []))
  b = _segment([5, 6], ([21, 22, 23], []))
  out = agent_env.rollout_of([_episode(1.0, a), _episode(0.0, b)], [3], 2, TOKENIZER, 4)
  batch = out.batch
  batch.check_shapes()
  assert batch.prompt_len == 4 and batch.completion_len == agent_env.WIDTH_BUCKET
  for n, seg in enumerate((a, b)):
    row = batch.tokens[n][batch.valid[n]]
    assert row.tolist() == list(seg.tokens)
    sampled = [t for t, m in zip(seg.tokens, seg.loss_mask) if m]
    completion = batch.tokens[n, batch.prompt_len :]
    assert completion[batch.loss_mask[n] > 0].tolist() == sampled
    np.testing.assert_allclose(
      batch.sampler_logp[n][batch.loss_mask[n] > 0], [-t / 100 for t in sampled]
    )
  assert out.rewards.tolist() == [1.0, 0.0]
  last = np.flatnonzero(batch.loss_mask[0])[-1]
  assert out.turn_rewards[0, last] == 1.0 and out.turn_rewards.sum() == 1.0
  assert batch.turn_ids[0, :5].tolist() == [0, 0, 0, 0, 1]
  assert batch.turn_ids[0, 5] == -1
  assert out.episodes[0].texts == ["11 12", "13"] and out.episodes[0].seed == 3


def test_a_split_episode_adds_a_mirror_group_with_the_same_advantages():
  """Earlier segments follow in whole groups of G whose rewards are the group's, so GRPO's
  advantage of an earlier segment is its episode's; a blank fills the rows of episodes
  that did not split. Mutations caught: agent_env_first_segment_first (the first segment
  in the first B*G rows), agent_env_mirror_repeats_last (a mirror row repeats an
  unsplit episode, training it twice)."""
  early = _segment([5], ([31, 32], []))
  late = _segment([5, 9], ([33], []))
  plain = _segment([5], ([41], []))
  played = [_episode(1.0, early, late), _episode(0.0, plain)]
  out = agent_env.rollout_of(played, [0], 2, TOKENIZER, 1)
  assert out.batch.tokens.shape[0] == 4
  assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
  adv = np.asarray(adv_lib.grpo(out.rewards, 2))
  np.testing.assert_allclose(adv[2:], adv[:2])
  loss = out.batch.loss_mask
  assert loss[2].sum() == 2 and loss[3].sum() == 0  # the early segment; the blank
  assert out.batch.tokens[0][out.batch.valid[0]].tolist() == list(late.tokens)
  assert out.batch.tokens[2][out.batch.valid[2]].tolist() == list(early.tokens)
  m = agent_env.metrics(out.episodes)
  assert m["agent/prefix_breaks"] == 1 and m["agent/split_rows"] == 2
  assert m["agent/reward"] == 0.5


def test_mirror_groups_are_padded_to_a_multiple_of_the_batch():
  """2 tasks x G=2, one episode split: 4 rows, a mirror group of 2, then a blank group, so
  the 8 rows split into the micro-batches that divide B*G = 4 (a real-model agent run
  stopped on 12 rows with micro_batch_size=8). The padding trains nothing. Mutation
  caught: the padding loop removed (6 rows)."""
  early, late = _segment([5], ([31, 32], [])), _segment([5, 9], ([33], []))
  plain = [_segment([5], ([40 + k], [])) for k in range(3)]
  played = [_episode(1.0, early, late)] + [_episode(0.0, p) for p in plain]
  out = agent_env.rollout_of(played, [0, 1], 2, TOKENIZER, 1)
  assert out.batch.tokens.shape[0] == 8
  assert out.batch.loss_mask[4].sum() == 2 and not out.batch.loss_mask[5:].any()


def test_failed_episodes_are_zero_weight_rows_and_counted():
  """A failed episode keeps its row with no loss tokens and reward 0; one that made no
  request is a blank. Mutation caught: agent_env_failed_rows_train."""
  seg = _segment([5], ([51, 52], []))
  played = [
    _episode(0.0, seg, error="agent raised RuntimeError: x"),
    _episode(0.0, error="agent timed out after 1 s (timeout_s)"),
    _episode(1.0, seg),
  ]
  out = agent_env.rollout_of(played, [0, 1, 2], 1, TOKENIZER, 1)
  assert out.batch.loss_mask[:2].sum() == 0 and out.batch.sampler_logp[:2].sum() == 0
  assert out.batch.loss_mask[2].sum() == 2
  assert out.turn_rewards[:2].sum() == 0
  m = agent_env.metrics(out.episodes)
  assert m["agent/errors"] == 2 and m["agent/prefix_breaks"] == 0
  assert out.episodes[0].observations[-1].startswith("agent raised")


def test_config_checks_name_the_field(tmp_path):
  run = "experiments.examples.calculator_agent:run"
  with pytest.raises(errors.ConfigError, match="config.env.agent='nope'"):
    table.env_config({"name": "agent", "agent": "nope"})
  with pytest.raises(errors.ConfigError, match="config.env.tasks='csv'"):
    table.env_config({"name": "agent", "agent": run, "tasks": "csv"})
  with pytest.raises(errors.ConfigError, match="config.env.path="):
    table.env_config({"name": "agent", "agent": run, "tasks": "jsonl", "path": str(tmp_path)})
  with pytest.raises(errors.ConfigError, match="threads=0"):
    table.env_config({"name": "agent", "agent": run, "threads": 0})


def test_task_sources(tmp_path):
  """jsonl: the lines as they are (a pool drawn by the cursor); arithmetic and frozenlake:
  drawn from the seed, the same seed the same task."""
  path = tmp_path / "tasks.jsonl"
  path.write_text('{"question": "1+1?", "answer": "2"}\n\n["a", 3]\n')
  run = "experiments.examples.calculator_agent:run"
  config = agent_env.AgentEnvConfig(agent=run, tasks="jsonl", path=str(path))
  tasks = agent_env.build(config, None)
  assert tasks.pool == 2 and tasks.train_tasks([1, 0]) == [
    ["a", 3],
    json.loads(path.read_text().split("\n")[0]),
  ]
  arith = agent_env.build(agent_env.AgentEnvConfig(agent=run), None)
  one, again = arith.train_tasks([7]), arith.train_tasks([7])
  assert one == again and eval(one[0]["question"][8:-1]) == int(one[0]["answer"])  # noqa: S307
  lake = agent_env.build(agent_env.AgentEnvConfig(agent=run, tasks="frozenlake", size=3), None)
  task = lake.train_tasks([4])[0]
  assert len(task["map"]) == 3 and task["seed"] == 4 and task["map"][0][0] == "S"


def test_a_fixed_temperature_overrides_the_request():
  """The training endpoint samples every request at the run's temperature. Mutation
  caught: serve_fixed_temperature_ignored."""
  gen = types.SimpleNamespace(temperature=0.3, top_p=0.5)
  assert scheduler._settings(types.SimpleNamespace(temperature=None), gen) == (0.3, 0.5)
  assert scheduler._settings(types.SimpleNamespace(temperature=1.0), gen) == (1.0, 1.0)
  assert scheduler._settings(types.SimpleNamespace(temperature=0.0), gen) == (0.0, 1.0)


_CALLS = [0]
_LOCK = threading.Lock()


def flaky_run(client, task):
  """The calculator agent, except every fourth episode raises (a failed episode)."""
  from experiments.examples import calculator_agent  # pylint: disable=g-import-not-at-top

  with _LOCK:
    _CALLS[0] += 1
    fail = _CALLS[0] % 4 == 0
  reward = calculator_agent.run(client, task)
  if fail:
    raise RuntimeError("a planned failure")
  return reward


def _last_segment(turns):
  """The turns after the last one whose prompt does not extend the tokens before it."""
  first = len(turns) - 1
  while first > 0:
    before = turns[first - 1].prompt + turns[first - 1].sampled
    if turns[first].prompt[: len(before)] != before:
      break
    first -= 1
  return turns[first:]


@pytest.mark.slow
def test_a_tiny_grpo_iteration_trains_on_the_recorded_tokens(monkeypatch):
  """One GRPO iteration of an agent through the endpoint: every row is its session's
  tokens (the last prompt and its sampled ids), loss exactly on the sampled ids with the
  sampler's logprobs, failed episodes zero-weight, the agent/* metrics reported.
  Mutation caught: agent_env_failed_rows_train."""
  from experiments.configs.agentic_runs import agent_tiny  # pylint: disable=g-import-not-at-top
  from rlpost.data.cursor import Cursor  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  taken, played = {}, []
  take, play = sessions.take, agents.play
  monkeypatch.setattr(
    agents.sessions, "take", lambda r, s, close=False: taken.setdefault(s, take(r, s, close))
  )
  monkeypatch.setattr(agents, "play", lambda *a: played.extend(play(*a)) or played)
  cfg = agent_tiny.get_config("calculator")
  cfg.env.agent = "test_agent:flaky_run"
  cfg.train.batch_tasks, cfg.rollout.max_turn_tokens = 2, 16
  p = rl.build(cfg)
  captured, train = [], rl.train
  monkeypatch.setattr(rl, "train", lambda *a, **k: captured.append(a[2]) or train(*a, **k))
  _, _, metrics = rl.iteration(p, p.state, Cursor(0, 0, 0), 0)
  out, m, _ = captured[0]
  assert m["agent/errors"] == 2 and len(played) == 8
  batch = out.batch
  assert batch.tokens.shape[0] >= 8 and batch.tokens.shape[0] % 4 == 0
  turns = list(taken.values())
  assert len(turns) == 8
  for n, e in enumerate(played):
    loss = batch.loss_mask[n] > 0
    if e.error:
      assert not loss.any() and out.rewards[n] == 0
      continue
    last = turns[n][-1]
    assert batch.tokens[n][batch.valid[n]].tolist() == list(last.prompt + last.sampled)
    completion = batch.tokens[n, batch.prompt_len :]
    assert completion[loss][-len(last.sampled) :].tolist() == list(last.sampled)
    np.testing.assert_allclose(batch.sampler_logp[n][loss][-len(last.sampled) :], last.logprobs)
    assert loss.sum() == sum(len(t.sampled) for t in _last_segment(turns[n]))
  assert np.isfinite(metrics["loss"])
  for name in ("agent/errors", "agent/prefix_breaks", "agent/reward", "reward/mean"):
    assert name in m
