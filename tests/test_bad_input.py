"""Bad input through the real command line: every data or model file a main cannot use,
and every unusable --dist setting, ends in one FATAL line naming the file (and line) or
the flag and the fix, with exit status 2 and no traceback, as a refused config value does
(issue 36)."""

import json
import socket

import ml_collections
import pytest

from conftest import run_clis

from rlpost import errors

GRPO = ("experiments.grpo", "--config=experiments/configs/grpo_gsm8k.py:tiny")
SFT = ("experiments.sft", "--config=experiments/configs/sft.py:tiny")
DPO = ("experiments.dpo", "--config=experiments/configs/dpo.py:tiny")
RM = ("experiments.reward_model", "--config=experiments/configs/reward_model.py:tiny")
NO_WORKDIR = (
  "experiments.frozenlake_baselines",
  "experiments.textarena_baselines",
  "experiments.sample",
  "experiments.seeds",
)
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


def _cases(d):
  """(name, main, overrides, expected wording) of each bad file, written under `d`."""
  (d / "gsm8k_bad").mkdir()
  (d / "gsm8k_bad" / "train.jsonl").write_text('{"question": "q?", "answer": "two"}\n')
  (d / "gsm8k_bin").mkdir()
  (d / "gsm8k_bin" / "train.jsonl").write_bytes(BINARY)
  (d / "no_reply.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
  (d / "binary.jsonl").write_bytes(BINARY)
  good = json.dumps({"prompt": "a", "completion": "b"})
  (d / "latin1.jsonl").write_bytes(good.encode() + b"\n" + '{"prompt": "caf\xe9"}'.encode("latin1"))
  (d / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
  (d / "x.gguf").write_text("not a model\n")
  kto = json.dumps({"prompt": "p", "completion": "c", "label": True})
  (d / "kto.jsonl").write_text(kto + "\n" + kto.replace("true", '"good"') + "\n")
  same = json.dumps({"prompt": "p", "chosen": "4", "rejected": "4"})
  (d / "same.jsonl").write_text(same + "\n")
  _prompt_file(d / "big.jsonl")
  gsm8k = lambda name: ["--config.data.source=gsm8k", f"--config.data.data_dir={d / name}"]
  sft = lambda name: ["--config.data.source=jsonl", f"--config.data.path={d / name}"]
  return [
    ("malformed GSM8K", GRPO, gsm8k("gsm8k_bad"), "train.jsonl:1: field 'answer' has no '####"),
    ("binary GSM8K", GRPO, gsm8k("gsm8k_bin"), "train.jsonl:1: byte b'\\x89'"),
    ("no assistant turn", SFT, sft("no_reply.jsonl"), "no_reply.jsonl:1: the last message"),
    ("binary data.path", SFT, sft("binary.jsonl"), "binary.jsonl:1: byte b'\\x89'"),
    ("latin-1 line", SFT, sft("latin1.jsonl"), "latin1.jsonl:2: byte b'\\xe9'"),
    (
      "DPO without rejected",
      DPO,
      [f"--config.data.path={d / 'pairs.jsonl'}", "--config.data.source=jsonl"],
      "pairs.jsonl:1: missing field 'rejected'",
    ),
    (
      "KTO label not a boolean",
      DPO,
      [f"--config.data.path={d / 'kto.jsonl'}", "--config.data.source=jsonl", "--config.loss=kto"],
      "kto.jsonl:2: field 'label' must be true",
    ),
    (
      "reward-model pair with one answer twice",
      RM,
      [f"--config.data.path={d / 'same.jsonl'}", "--config.data.source=jsonl"],
      "same.jsonl:1: 'chosen' and 'rejected' are the same text",
    ),
    (
      "not GGUF",
      GRPO,
      ["--config.model.weights=gguf", f"--config.model.path={d / 'x.gguf'}"],
      "x.gguf is not a GGUF file",
    ),
    (
      "a prompt too long",
      GRPO,
      [*_prompt_run(d / "big.jsonl"), "--config.data.on_too_long=error"],
      "big.jsonl:2: the prompt is 1000001 tokens, above env.max_prompt_tokens=2048",
    ),
    (
      "a verifier evaluation without a reward-model run",
      ("experiments.verifier_eval", f"--fit={d / 'kto.jsonl'}"),
      [f"--examples={d / 'kto.jsonl'}"],
      "': no config.json there: give a reward-model run's --workdir",
    ),
    (
      "a copy yardstick of no run (a script's own refusal)",
      ("experiments.reasoning_gym_baselines", "--verbosity=0"),
      [],
      "/run/11': no config.json there (give one seed's run folder)",
    ),
    (
      "a GSM8K evaluation of no run",
      ("experiments.eval_gsm8k", f"--workdir={d / 'run' / '12'}"),
      [],
      "/run/12: cannot read",
    ),
    (
      "a GSM8K split that does not exist",
      ("experiments.eval_gsm8k", "--config=experiments/configs/grpo_gsm8k.py:tiny"),
      ["--split=dev"],
      "--split=dev: value should be one of <train|test>",
    ),
    (
      "no held-out maps for the FrozenLake yardsticks",
      ("experiments.frozenlake_baselines", "--num_maps=0"),
      [],
      "--num_maps=0: 0 is not a positive integer",
    ),
    (
      "a hole probability of 1.5",
      ("experiments.frozenlake_baselines", "--hole_prob=1.5"),
      [],
      "--hole_prob=1.5: must be in [0, 1)",
    ),
    (
      "a textarena game that does not exist",
      ("experiments.textarena_baselines", "--game=Nope-v0"),
      [],
      "--game=Nope-v0 --max_turns=5: game='Nope-v0': use one of",
    ),
    (
      "an output file in no folder",
      ("experiments.sample", "--config=experiments/configs/sample.py:tiny"),
      [f"--output={d / 'absent' / 'o.jsonl'}"],
      "absent/o.jsonl: its folder does not exist; create it first",
    ),
    (
      "a GRPO config given to the PPO entry point",
      ("experiments.ppo", "--config=experiments/configs/agentic.py:frozenlake_tiny"),
      [],
      "experiments.ppo (trains PPO): the config names config.learner='grpo', which would win",
    ),
    (
      "a --learner that is no learner",
      ("experiments.seeds", "run"),
      ["--config=experiments/configs/grpo_gsm8k.py:tiny", f"--workdir_root={d}", "--learner=foo"],
      "--learner=foo: use one of ('grpo', 'ppo')",
    ),
    ("address without port", GRPO, _dist("localhost"), "'localhost': give HOST:PORT"),
    ("no processes", GRPO, _dist("localhost:1", processes=0), "num_processes=0: must be >= 1"),
    (
      "nothing listening",
      GRPO,
      [*_dist(f"localhost:{_free_port()}"), "--dist.connect_timeout_s=1"],
      "nothing accepted a connection there within 1 s",
    ),
  ]


def _dist(address, processes=2):
  return [
    f"--dist.coordinator_address={address}",
    f"--dist.num_processes={processes}",
    "--dist.process_id=1",
  ]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_every_unusable_file_is_one_fatal_line_with_status_2(tmp_path):
  """Each case of issue 36's list through its main: its whole output is one FATAL line
  and the status 2 (one process start for all the cases: forked children,
  tests/cli_batch.py). Mutation caught: the data and model loaders raising a plain
  ValueError again (each a traceback and status 1)."""
  cases = _cases(tmp_path)
  workdir = lambda main, i: [] if main in NO_WORKDIR else [f"--workdir={tmp_path / 'run' / str(i)}"]
  runs = run_clis(
    [
      [main, [flag, *overrides, *workdir(main, i)]]
      for i, (_, (main, flag), overrides, _) in enumerate(cases)
    ]
  )
  failures = []
  for (name, _, _, wording), (status, output) in zip(cases, runs):
    fatal = output.strip().splitlines()  # the whole output: one FATAL line
    if (
      status != 2 or len(fatal) != 1 or not fatal[0].startswith("FATAL") or wording not in fatal[0]
    ):
      failures.append(f"{name}: status {status}, FATAL lines {fatal}\n{output[-1500:]}")
  assert not failures, "\n\n".join(failures)


def _prompt_file(path):
  """Four prompts, the second a million bytes (one token each for the tiny model), the
  last 2046 tokens with BOS: within the 2048-token limit, though too close to it to be
  kept without counting."""
  lines = [{"prompt": "#1 say 7: "}, {"prompt": "x" * 1_000_000}, {"prompt": "#3 say 7: "}]
  lines.append({"prompt": "y" * 2045})
  path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _prompt_run(path):
  return [
    "--config.data.source=jsonl",
    f"--config.data.path={path}",
    "--config.data.rewards=rlpost.rewards.digit:digit_count",
  ]


def test_too_long_prompts_are_left_out_and_counted_before_the_device(tmp_path, capsys):
  """env.on_too_long='skip' (the default): the million-byte prompt is left out when the
  run is built (never padded or sampled), counted and located in the log; the run trains
  on the other three. Mutation caught: the bytes bound taken for the length (the
  2046-token prompt left out)."""
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top
  from conftest import with_overrides  # pylint: disable=g-import-not-at-top
  from experiments.configs import grpo_gsm8k  # pylint: disable=g-import-not-at-top

  _prompt_file(tmp_path / "big.jsonl")
  flags = dict(
    flag[len("--config.") :].split("=", 1) for flag in _prompt_run(tmp_path / "big.jsonl")
  )
  p = rl.build(with_overrides(grpo_gsm8k.get_config("tiny"), flags))
  kept = [t.question for t in p.tasks.train_tasks(list(range(p.tasks.pool)))]
  assert kept == ["#1 say 7: ", "#3 say 7: ", "y" * 2045]
  first = f"(first: {tmp_path / 'big.jsonl'}:2)"
  assert f"left out 1 of 4 prompts longer than env.max_prompt_tokens=2048 tokens {first}" in (
    capsys.readouterr().out
  )


@pytest.mark.parametrize(
  "config,overrides,match",
  [
    (
      "grpo_gsm8k.py:tiny",
      {"data.max_prompt_tokens": 8190},
      r"config\.env\.max_prompt_tokens=8190: with sampling\.max_new_tokens=8 a sequence "
      r"holds = 8198 tokens, above tiny's context of 8192",
    ),
    (
      "agentic.py:frozenlake_tiny",
      {"rollout.max_total_tokens": 8192},
      r"config\.rollout\.max_total_tokens=8192: .* above tiny's context",
    ),
    (
      "sft.py:tiny",
      {"data.seq_len": 9000},
      r"config\.data\.seq_len=9000: a training row holds = 9000 tokens, above tiny's context",
    ),
  ],
)
def test_sequences_beyond_the_models_context_are_refused_with_the_config(config, overrides, match):
  """What a run could sample or train past its model's context (gemma3.CONTEXT_TOKENS) is
  refused when the config is read, naming the field."""
  import importlib  # pylint: disable=g-import-not-at-top

  from conftest import with_overrides  # pylint: disable=g-import-not-at-top
  from rlpost.recipes import rl, sft  # pylint: disable=g-import-not-at-top

  module, variant = config.split(":")
  configs = importlib.import_module(f"experiments.configs.{module[:-3]}")
  cfg = with_overrides(configs.get_config(variant), overrides)
  check = sft.check_config if module == "sft.py" else rl.check_config
  with pytest.raises(errors.ConfigError, match=match):
    check(cfg)


def test_a_learner_that_would_be_ignored_or_is_no_learner_is_refused():
  """`cli.check_learner`: a learner asked for (--learner, or the entry point experiments.grpo
  / ppo) that is none, or that the config's own `learner` would silently override, is a
  FlagError; a config naming none or the same one passes. Mutation caught: the override
  check dropped (learner_overridden_silently)."""
  from experiments import cli  # pylint: disable=g-import-not-at-top

  named = ml_collections.ConfigDict({"learner": "grpo"})
  cli.check_learner(named, "grpo", "--learner=grpo")
  cli.check_learner(ml_collections.ConfigDict(), "ppo", "--learner=ppo")
  with pytest.raises(errors.FlagError, match=r"^--learner=foo: use one of \('grpo', 'ppo'\)"):
    cli.check_learner(named, "foo", "--learner=foo")
  with pytest.raises(errors.FlagError, match=r"^experiments\.ppo: the config names config\.lea"):
    cli.check_learner(named, "ppo", "experiments.ppo")
