"""An interrupted held-out evaluation resumes from its finished chunks (rlpost.recipes.eval_progress)."""

import os

import jax
import pytest
from conftest import with_overrides

from experiments.configs import agentic as agentic_configs
from rlpost.recipes import eval_progress
from rlpost.recipes import item_outcomes
from rlpost.recipes import rl


@pytest.fixture(scope="module")
def pieces():
  cfg = agentic_configs.get_config("frozenlake_tiny")
  cfg = with_overrides(cfg, {"eval.num_tasks": 8, "eval.batch_tasks": 2, "env.fixed_map": ""})
  return rl.build(cfg)


_PLAY = rl._greedy_rollout


class Interrupted(Exception):
  """The kill the test stands in for."""


def _counting(monkeypatch, fail_at=None):
  """Counts `_greedy_rollout` calls; the call numbered `fail_at` raises (an interruption)."""
  calls, inner = [], _PLAY

  def rollout(*args):
    calls.append(args[-1])
    if len(calls) == fail_at:
      raise Interrupted
    return inner(*args)

  monkeypatch.setattr(rl, "_greedy_rollout", rollout)
  return calls


@pytest.mark.slow
def test_an_interrupted_evaluation_plays_only_its_unfinished_chunks(pieces, tmp_path, monkeypatch):
  """8 held-out seeds in chunks of 2: interrupted in the third chunk, the evaluation played
  again plays chunks 3 and 4 only, and its metrics and per-item outcomes equal an
  uninterrupted one's; the kept chunks are gone afterwards. After the policy changes, no
  chunk is reused. Mutations caught: `load` ignoring the fingerprint (the changed policy
  reuses chunks); `evaluate` keeping nothing (`keep = False`: 4 chunks played again).
  Over 3 s: six tiny greedy evaluations."""
  p, whole, cut = pieces, str(tmp_path / "whole"), str(tmp_path / "cut")
  with rl._pool(p.config) as pool:
    want = rl.evaluate(p, pool, p.state, whole, 0)
    calls = _counting(monkeypatch, fail_at=3)
    with pytest.raises(Interrupted):
      rl.evaluate(p, pool, p.state, cut, 0)
    assert len(os.listdir(eval_progress.folder(cut, 0))) == 2
    calls = _counting(monkeypatch)
    got = rl.evaluate(p, pool, p.state, cut, 0)
    assert len(calls) == 2 and [s[0] for s in calls] == [want_seed(p, 4), want_seed(p, 6)]
    assert got == want
    assert item_outcomes.read(cut) == item_outcomes.read(whole)
    assert not os.path.exists(eval_progress.folder(cut, 0))

    calls = _counting(monkeypatch, fail_at=3)
    with pytest.raises(Interrupted):
      rl.evaluate(p, pool, p.state, cut, 5)
    policy = jax.tree.map(lambda x: x * 1.001, p.state.trainable["policy"])
    moved = p.state._replace(trainable={**p.state.trainable, "policy": policy})
    calls = _counting(monkeypatch)
    rl.evaluate(p, pool, moved, cut, 5)
    assert len(calls) == 4


def want_seed(p, index: int) -> int:
  """The held-out set's seed at `index`."""
  return list(rl.held_out_set(p.config, p.tasks, True).seeds)[index]


def test_a_damaged_or_foreign_chunk_is_played_again(tmp_path):
  """`load` returns None for a missing file, a file that does not unpickle, and a chunk
  kept with other seeds or another fingerprint; the kept one otherwise."""
  w = str(tmp_path)
  assert eval_progress.load(w, 0, 0, [1, 2], "d") is None
  eval_progress.save(w, 0, 0, [1, 2], "d", ["a", "b"])
  assert eval_progress.load(w, 0, 0, [1, 2], "d") == ["a", "b"]
  assert eval_progress.load(w, 0, 0, [1, 3], "d") is None
  assert eval_progress.load(w, 0, 0, [1, 2], "e") is None
  with open(os.path.join(eval_progress.folder(w, 0), "0.pkl"), "wb") as f:
    f.write(b"not a pickle")
  assert eval_progress.load(w, 0, 0, [1, 2], "d") is None
  eval_progress.clear(w, 0)
  assert not os.path.exists(eval_progress.folder(w, 0))
