"""The RL run's alarms (rlpost.recipes.alarms): each fires when what it guards breaks."""

import pytest
from conftest import run_metrics, with_overrides

from experiments.configs import agentic
from experiments.configs import grpo_gsm8k
from rlpost import errors
from rlpost.recipes import alarms
from rlpost.recipes import rl
from rlpost.recipes import rollout
from rlpost.train import weight_sync


def _scripted(records):
  """A loop step returning `records[index]` as its metrics."""
  return lambda state, cursor, index: (state, cursor, dict(records[index]))


def test_gap_and_idle_tool_alarms_fire_on_their_iterations(capsys):
  """The gap warns on the iterations above the threshold only; the idle-tool count grows
  on iterations without a call, resets on one, and warns from the `idle_tools`-th on.

  Mutation caught: the idle count not reset by a call."""
  records = [
    {"sampler_logp_gap_mean/first_pass": 1e-6, "tool_call_rate": 0.0},
    {"sampler_logp_gap_mean/first_pass": 0.3, "tool_call_rate": 0.0},
    {"sampler_logp_gap_mean/first_pass": 1e-6, "tool_call_rate": 0.5},
    {"sampler_logp_gap_mean/first_pass": 1e-6, "tool_call_rate": 0.0},
    {"sampler_logp_gap_mean/first_pass": 1e-6, "tool_call_rate": 0.0},
  ]
  step = alarms.watch(_scripted(records), logp_gap=1e-3, idle_tools=2)
  idle = [step(None, None, i)[2]["tools/idle_iterations"] for i in range(5)]
  assert idle == [1.0, 2.0, 0.0, 1.0, 2.0]
  warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
  assert [w.split(":")[0] for w in warnings] == [
    "WARNING step 1",  # the gap
    "WARNING step 1",  # two iterations without a call
    "WARNING step 4",
  ]
  assert "0.3 from the trainer's" in warnings[0] and "alarms.logp_gap=0.001" in warnings[0]
  assert "last 2 iterations (alarms.idle_tools=2)" in warnings[1]
  quiet = alarms.watch(_scripted(records), logp_gap=0.0, idle_tools=0)
  assert "tools/idle_iterations" not in quiet(None, None, 1)[2]
  lagged = [{**r, "staleness": 1} for r in records]  # sampled by an older policy on purpose
  alarms.watch(_scripted(lagged), logp_gap=1e-3, idle_tools=0)(None, None, 1)
  assert not capsys.readouterr().out


def test_default_gap_by_precision_and_refused_values():
  assert alarms.default_logp_gap("float32", "model") < alarms.default_logp_gap(None, "int8")
  assert alarms.default_logp_gap(None, "model") == alarms.LOGP_GAPS["float32", "model"]
  cfg = with_overrides(grpo_gsm8k.get_config("tiny"), {"alarms.logp_gap": -1.0})
  with pytest.raises(errors.ConfigError, match=r"config.alarms.logp_gap=-1.0: must be"):
    rl.check_config(cfg)


@pytest.mark.slow
def test_a_sampler_on_stale_weights_trips_the_gap_alarm_then_stops(tmp_path, monkeypatch, capsys):
  """A tiny LoRA GRPO run whose sampler keeps the initial weights (verl's bug: adapters
  never merged, the base sampled for the whole run): at step 1 its trainer/sampler logprob
  gap warns, at step 2 the weight-sync check stops it, naming the failure (healthy runs
  log `sync/stale_syncs` = 0: test_grpo's first-step test). Mutation caught: the gap
  compared with the threshold the wrong way round; `weight_sync.check` comparing the
  trainer's fingerprints with themselves."""
  cfg = with_overrides(
    grpo_gsm8k.get_config("tiny"),
    {"train.steps": 4, "checkpoint.every": 100, "lora.enabled": True},
  )
  monkeypatch.setattr(rollout.policy, "sampling_params", lambda trainable, frozen, fwd: frozen)
  with pytest.raises(weight_sync.SyncError, match="step 2: .*LoRA adapters not merged"):
    rl.run(cfg, str(tmp_path))
  out = capsys.readouterr().out
  assert "WARNING step 1: the sampler's logprobs" in out and "WARNING step 0" not in out


@pytest.mark.slow
def test_an_agentic_run_whose_tools_are_never_called_warns(tmp_path, capsys):
  """Tiny FrozenLake with the calculator offered (the random tiny model never writes a
  call): `tools/idle_iterations` counts 1, 2, 3 and the warning comes at the second."""
  cfg = with_overrides(
    agentic.get_config("frozenlake_tiny"),
    {"train.steps": 3, "tools.enabled": True, "alarms.idle_tools": 2, "eval.every": 0},
  )
  rl.run(cfg, str(tmp_path))
  assert [r["tools/idle_iterations"] for r in run_metrics(tmp_path)] == [1.0, 2.0, 3.0]
  out = capsys.readouterr().out
  assert "WARNING step 1: no episode called a tool" in out
