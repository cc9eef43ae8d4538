"""rlpost.envs.table: a user's own environment by MODULE:FUNCTION from the command line,
its checks, and one tiny GRPO run over the packages' environments (reasoning-gym,
gymnasium, textarena) at once, as a user environment mixing them."""

import json
import sys

import numpy as np
import pytest
from absl import flags
from conftest import REPO_ROOT, run_metrics
from ml_collections import config_flags
from optional_packages import require

from rlpost import errors
from rlpost.envs import protocol
from rlpost.envs import reasoning_gym, table, textarena_games, toy_text
from rlpost.recipes import rl

RUNS = f"{REPO_ROOT}/experiments/configs/agentic_runs/envs_tiny.py"


def _cli(*args, monkeypatch):
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", f"{RUNS}:custom", "", flag_values=values)
  argv = ["prog", f"--config={RUNS}:custom", *args]
  monkeypatch.setattr("sys.argv", argv)  # ml_collections reads the overrides there
  values(argv)
  return values["config"].value


def test_a_user_environment_is_chosen_from_the_command_line(monkeypatch):
  """--config.env.name=experiments.examples.my_env:make builds the example's environment
  with its own config class, unchanged library. Mutation caught: `spec_of` refusing names
  with a colon (the table's names only)."""
  cfg = _cli("--config.env.name=experiments.examples.my_env:make", monkeypatch=monkeypatch)
  c = rl.check_config(cfg)
  assert type(c.env).__name__ == "ReverseConfig"
  tasks = rl.make_env(c)
  state, prompt = tasks.env.reset(None, 1)
  assert prompt == "Spell 'gold' backwards: " and tasks.env.step(state, "dlog").reward == 1.0


@pytest.mark.parametrize(
  "name,match",
  [
    ("no_such_pkg.envs:make", r"config\.env\.name='no_such_pkg\.envs:make': module 'no_such_pkg"),
    ("experiments.examples.my_env:nope", r"has no function 'nope'"),
    ("experiments.examples.my_env:WORDS", r"has no function 'WORDS'"),
    ("test_env_table:_not_a_spec", r"_not_a_spec\(\) returned int; return .*EnvSpec"),
    ("frozenlake2", r"config\.env\.name='frozenlake2': use one of .*or MODULE:FUNCTION"),
  ],
)
def test_bad_user_environments_are_named(name, match):
  with pytest.raises(errors.ConfigError, match=match):
    table.env_config({"name": name})


def _not_a_spec():
  return 3


def test_user_config_fields_and_limits_are_checked(monkeypatch):
  """A field of the user's config is checked as a built-in's (named config.env.FIELD), and
  so is the built Env (check_env). Mutation caught: `make` not calling check_env."""
  cfg = _cli(
    "--config.env.name=experiments.examples.my_env:make", "--config.env.max_turns=0",
    monkeypatch=monkeypatch,
  )  # fmt: skip
  with pytest.raises(errors.ConfigError, match=r"config\.env\.max_turns=0: must be >= 1"):
    rl.check_config(cfg)
  bad = protocol.EnvTasks(protocol.Env("bad", None, None, max_turns=0), list, list)
  monkeypatch.setitem(table.ENVS, "bad", table.EnvSpec(table.NoFields, lambda c, r: bad))
  with pytest.raises(errors.ConfigError, match=r"config\.env\.name='bad': .*max_turns=0"):
    table.make("bad", table.NoFields(), protocol.RunInfo(), False)


KINDS = ("reasoning_gym", "gymnasium", "textarena")


def mixed() -> protocol.EnvTasks:
  """Seed s plays KINDS[s % 3]: a one-digit chain_sum, FrozenLake 4x4 (not slippery),
  GuessTheNumber; each kind's own reset and step."""
  rg = reasoning_gym.ReasoningGymConfig(
    task_config=json.dumps({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    pool=40,
  )
  parts = [
    reasoning_gym.build(rg, protocol.RunInfo(eval_tasks=2)),
    toy_text.build(toy_text.GymConfig(kwargs='{"is_slippery": false}', max_turns=2), None),
    textarena_games.build(textarena_games.TextArenaConfig("GuessTheNumber-v0", 2), None),
  ]

  def tasks(seeds):
    return [(s % 3, parts[s % 3].train_tasks([s])[0]) for s in seeds]

  def reset(task, seed):
    kind, inner = task
    state, text = parts[kind].env.reset(inner, seed)
    return (kind, state), text

  def step(state, text):
    kind, inner = state
    out = parts[kind].env.step(inner, text)
    return out._replace(state=(kind, out.state))

  env = protocol.Env("mixed", reset, step, max_turns=2)
  return protocol.EnvTasks(env, tasks, tasks, pool=39)


@pytest.mark.slow
def test_tiny_grpo_runs_over_every_package_environment(tmp_path):
  """Two GRPO iterations of the tiny model on episodes of all three kinds (3 tasks x 4
  episodes per iteration): every kind is played and scored, the update is finite. Over
  20 s (16 s CPU): one tiny run, compiling a sampler per turn shape. Mutation caught:
  `spec_of` refusing MODULE:FUNCTION names."""
  for module in ("reasoning_gym", "gymnasium", "textarena"):
    require(module)
  from experiments.configs.agentic_runs import envs_tiny  # pylint: disable=g-import-not-at-top

  cfg = envs_tiny.get_config("custom")
  with cfg.unlocked():
    cfg.env.name = "test_env_table:mixed"
    del cfg.env["max_turns"]  # `mixed` returns EnvTasks: a block of `name` alone
  cfg.train.steps, cfg.train.batch_tasks, cfg.train.micro_batch_size = 2, 3, 4
  cfg.eval.every = 0
  cfg.log.trajectories_every, cfg.log.trajectories_logged = 1, 12
  rl.run(cfg, str(tmp_path))
  records = run_metrics(tmp_path)
  assert len(records) == 2 and all(np.isfinite(r["loss"]) for r in records)
  with open(tmp_path / "trajectories.jsonl") as f:
    transcripts = [json.dumps(json.loads(line)) for line in f]
  assert any("<answer>" in t for t in transcripts)  # reasoning-gym's instruction
  assert any("Moves: left, down, right, up." in t for t in transcripts)  # gymnasium's view
  assert any("Guess The Number" in t for t in transcripts)  # textarena's game


@pytest.mark.parametrize(
  "block,extra",
  [
    ({"name": "reasoning_gym"}, "reasoning-gym"),
    ({"name": "gymnasium"}, "gymnasium"),
    ({"name": "textarena"}, "textarena"),
    ({"name": "gsm8k", "checker": "math_verify"}, "math-verify"),
  ],
)
def test_a_missing_package_names_its_pip_install(block, extra, monkeypatch):
  """Without the package (its import fails) the env block is refused with a ConfigError
  (one FATAL line in the mains) naming the setting and `pip install -e '.[EXTRA]'`.
  Mutation caught: `extras.load` letting the ImportError through."""
  module = {"reasoning-gym": "reasoning_gym", "math-verify": "math_verify"}.get(extra, extra)
  monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
  with pytest.raises(
    errors.ConfigError,
    match=rf"config\.env\.\w+=.* needs the package '{module}'.*pip install -e '\.\[{extra}\]'",
  ):
    table.env_config(block)


def _config_variants():
  """(config module, variant) of every RL config the repository ships."""
  import importlib  # pylint: disable=g-import-not-at-top

  from experiments.configs import agentic, common, grpo_gsm8k  # pylint: disable=g-import-not-at-top

  yield from (("grpo_gsm8k", f"{m},{a}") for m in common.MODELS for a in grpo_gsm8k.ALGORITHMS)
  yield from (("ppo_gsm8k", m) for m in common.MODELS)
  yield from (("agentic", f"{v},{a}") for v in agentic.VARIANTS for a in ("grpo", "ppo"))
  for path in sorted((REPO_ROOT / "experiments/configs/agentic_runs").glob("[!_]*.py")):
    module = f"agentic_runs.{path.stem}"
    run = importlib.import_module(f"experiments.configs.{module}")
    kinds = getattr(run, "BLOCKS", None) or getattr(run, "AGENTS", None) or {"": None}
    for kind in kinds:  # KIND,ALGORITHM where the module has kinds
      yield from ((module, f"{kind},{a}" if kind else a) for a in ("grpo", "ppo"))


def test_every_config_offers_every_field_of_its_environment():
  """A field the env block lacks cannot be set from the command line (`--config.env.checker=`
  was "no such field" on the GRPO and PPO configs though README documents it): every
  shipped config's block holds every field of its environment's config class, at its
  default value or the run's own. Mutation caught: prompt_env without "checker"."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top

  missing, checked = {}, 0
  for module, variant in _config_variants():
    config = importlib.import_module(f"experiments.configs.{module}").get_config(variant)
    block = config.env.to_dict()
    fields = {f.name for f in dataclasses.fields(table.spec_of(block["name"]).config)}
    checked += 1
    if fields - set(block):
      missing[f"{module}:{variant}"] = sorted(fields - set(block))
  assert checked > 40 and not missing, missing
