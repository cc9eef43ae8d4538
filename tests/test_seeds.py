"""experiments.seeds end to end on the tiny model, and the per-item outcome files
(rlpost.recipes.item_outcomes) it reads."""

import json
import os
import re
import signal
import sys
import threading
import time
import types

import numpy as np
import pytest
from conftest import run_metrics, with_overrides

from conftest import import_main
from experiments import intervals
from experiments.configs import agentic as agentic_configs
from rlpost import errors
from rlpost.envs import frozenlake, held_out
from rlpost.recipes import item_outcomes, reports
from rlpost.train import provenance

seeds = import_main("experiments.seeds")


def test_outcome_files_are_replaced_whole_never_appended_or_left_half(tmp_path, monkeypatch):
  """A second write of a step replaces its lines (a resumed run's evaluation adds none);
  a write that fails midway leaves the old file and no temporary one. Mutation caught:
  `write` opening the target itself in append mode (no temporary file)."""
  line = lambda k: item_outcomes.item(k, "ab", 0.5, True, 2, "x" * 999)
  item_outcomes.write(str(tmp_path), 3, [line(1), line(2)])
  item_outcomes.write(str(tmp_path), 3, [line(7)])
  assert item_outcomes.read(str(tmp_path)) == {3: [line(7)]}
  assert len(line(7)["completion"]) == item_outcomes.COMPLETION_CHARS

  def broken(record):
    raise RuntimeError("disk full")

  monkeypatch.setattr(item_outcomes.json, "dumps", broken)
  with pytest.raises(RuntimeError, match="disk full"):
    item_outcomes.write(str(tmp_path), 3, [line(8)])
  monkeypatch.undo()
  assert item_outcomes.read(str(tmp_path)) == {3: [line(7)]}
  assert [p.name for p in (tmp_path / "eval").iterdir()] == ["step_3.jsonl"]


@pytest.mark.parametrize(
  "text, said",
  [
    ('{"item": 1, "key"', "step_0.jsonl:2: invalid JSON"),
    ("[1, 2]", "step_0.jsonl:2: expected a JSON object, got list"),
    ('{"item": 1, "key": null, "reward": 1.0, "turns": 1}', "field 'success' is missing"),
    ('{"item": 1, "key": null, "reward": 1.0, "success": 1, "turns": 1}', "'success' is 1"),
    ('{"item": true, "key": null, "reward": 1.0, "success": true, "turns": 1}', "'item' is True"),
    ('{"item": 1, "key": 3, "reward": 1.0, "success": true, "turns": 1}', "'key' is 3"),
    (json.dumps(item_outcomes.item(5, "ab", 1.0, True, 1, "")), "item 5 (key ab) is listed twice"),
  ],
)
def test_an_outcome_file_with_a_bad_line_is_refused_naming_the_line(tmp_path, text, said):
  """`read` (what `seeds report` and `keep` count from) refuses a line that is not JSON,
  not an object, lacks a field or holds the wrong type, or repeats an item, naming the
  file and line: a recount never silently drops or doubles an item. Mutation caught:
  the duplicate check dropped (item_outcomes_duplicate_item_kept), the line check dropped
  (item_outcomes_line_types_unchecked)."""
  item_outcomes.write(str(tmp_path), 0, [item_outcomes.item(5, "ab", 0.0, False, 2, "x")])
  with open(item_outcomes.path(str(tmp_path), 0), "a") as f:
    f.write(text + "\n")
  with pytest.raises(errors.DataError, match=re.escape(said)):
    item_outcomes.read(str(tmp_path))


def test_the_best_constant_answer_is_reported_where_the_answers_are_known(tmp_path):
  """Outcome lines with reference answers ("1", "1", "2", " 3") on the items both seeds
  evaluated: the constant baseline is "1" on half of them, in the JSON and the table;
  files without answers give none. Mutation caught: `constant_baseline` counting the
  first answer instead of the most frequent one."""
  answers = {10: "2", 11: "1", 12: "1", 13: " 3"}
  for seed in (0, 1):
    lines = [item_outcomes.item(k, "d", 0.0, seed == k % 2, 1, "1", a) for k, a in answers.items()]
    item_outcomes.write(str(tmp_path / f"seed_{seed}"), 0, lines)
  (point,) = seeds.report([str(tmp_path)], "success", 200)["points"]
  assert point["constant"] == {"answer": "1", "mean": 0.5}
  assert "| 0.500 ('1') |" in seeds.markdown(
    {"metric": "success", "points": [point], "comparison": []}
  )
  episode = types.SimpleNamespace(
    seed=4, reward=1.0, infos=[{"success": True, "answer": 7}], texts=["7"]
  )
  assert item_outcomes.episode_items([episode], ["k"])[0]["answer"] == "7"
  for seed in (0, 1):  # files of a run whose environment has no reference answers
    item_outcomes.write(
      str(tmp_path / f"seed_{seed}"), 0, [item_outcomes.item(10, "d", 0, 0, 1, "")]
    )
  assert seeds.report([str(tmp_path)], "success", 200)["points"][0]["constant"] is None


def test_keep_killed_midway_leaves_every_kept_file_whole(tmp_path, monkeypatch):
  """A keep that fails while copying (killed, disk full) leaves the earlier copies as they
  were and no temporary file, for plain and gzipped files alike. Mutation caught: `keep`
  copying onto the kept file itself."""
  seed_dir = tmp_path / "run" / "seed_0"
  item_outcomes.write(str(seed_dir), 0, [item_outcomes.item(7, None, 1.0, True, 3, "a\nb")])
  (seed_dir / "eval_outcomes.jsonl").write_text('{"step": 0, "episodes": []}\n')
  outcomes = tmp_path / "outcomes"
  seeds.keep(str(seed_dir.parent), "k", str(outcomes))
  before = {p: p.read_bytes() for p in outcomes.rglob("*") if p.is_file()}
  assert len(before) == 2
  item_outcomes.write(str(seed_dir), 0, [item_outcomes.item(8, None, 0.0, False, 3, "c\nd")])
  (seed_dir / "eval_outcomes.jsonl").write_text('{"step": 0, "episodes": [{"seed": 8}]}\n')

  def killed(src, dst, *args, **kwargs):  # a path (copyfile) or an open file (copyfileobj)
    if isinstance(dst, str):
      dst = open(dst, "wb")  # pylint: disable=consider-using-with
    dst.write(b"{")
    dst.flush()
    raise OSError("disk full")

  gz = outcomes / "k" / "seed_0" / "eval_outcomes.jsonl.gz"
  for name in ("copyfile", "copyfileobj"):  # killed in the first file, then in the gzipped one
    with monkeypatch.context() as m:
      m.setattr(seeds.shutil, name, killed)
      with pytest.raises(OSError, match="disk full"):
        seeds.keep(str(seed_dir.parent), "k", str(outcomes))
    assert sorted(p for p in outcomes.rglob("*") if p.is_file()) == sorted(before)
    assert gz.read_bytes() == before[gz]
    assert item_outcomes.read(str(outcomes / "k" / "seed_0"))[0][0]["item"] == (
      7 if name == "copyfile" else 8
    )
  seeds.keep(str(seed_dir.parent), "k", str(outcomes))
  assert item_outcomes.read(str(outcomes / "k" / "seed_0"))[0][0]["item"] == 8


def test_keep_copies_only_outcomes_and_configs_and_reports_the_same(tmp_path):
  """`keep` copies every seed's eval/step_N.jsonl, config.json and provenance.jsonl (no
  checkpoints, no
  temporary files, no other seed-less folder; a one-turn run's eval_outcomes.jsonl
  neither) into outcomes/NAME, and the report of the kept folder equals the report of the
  run's; a multi-turn run's eval_outcomes.jsonl is kept gzipped, the same bytes each time,
  reading back as written. Mutation caught: `keep` copying only the last evaluation step
  of each seed."""
  run = tmp_path / "run"
  for seed in (0, 2):
    for step in (0, 20):
      lines = [
        item_outcomes.item(k, f"d{k}", k % 3, (k + seed + step) % 2, 1, "a", str(k))
        for k in range(6)
      ]
      item_outcomes.write(str(run / f"seed_{seed}"), step, lines)
    (run / f"seed_{seed}" / "config.json").write_text('{"seed": %d}' % seed)
    (run / f"seed_{seed}" / "checkpoints").mkdir()
    (run / f"seed_{seed}" / "checkpoints" / "big").write_bytes(b"0" * 100)
  (run / "seed_0" / "eval" / "step_40.jsonl.tmp123").write_text("half")
  (run / "seed_0" / "eval_outcomes.jsonl").write_text('{"step": 0, "episodes": []}\n')
  (run / "other").mkdir()
  started = [provenance.record(str(run / "seed_2"), step) for step in (0, 20)]
  copied = seeds.keep(str(run), "demo_1", str(tmp_path / "outcomes"))
  kept = tmp_path / "outcomes" / "demo_1"
  assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(
    [
      f"seed_{s}/{f}"
      for s in (0, 2)
      for f in ("config.json", "eval/step_0.jsonl", "eval/step_20.jsonl")
    ]
    + ["seed_2/provenance.jsonl"]
  )
  assert len(copied) == 7 and provenance.read(str(kept / "seed_2")) == started
  rep = seeds.report([str(kept)], "success", 100)  # seed_0 started before provenance.jsonl
  assert rep["provenance"] == {str(kept): {"seed_2": provenance.summary(started)}}
  assert "seed_2: started at steps [0, 20], commits" in seeds.markdown(rep)
  strip = lambda rep: [{k: v for k, v in p.items() if k != "dir"} for p in rep["points"]]
  assert strip(seeds.report([str(kept)], "success", 100)) == strip(
    seeds.report([str(run)], "success", 100)
  )
  multi = tmp_path / "multi" / "seed_1"  # a multi-turn run also keeps its replies, gzipped
  item_outcomes.write(str(multi), 5, [item_outcomes.item(7, None, 1.0, True, 3, "a\nb\n\nc")])
  records = [
    {"step": 5, "episodes": [{"seed": 7, "success": True, "replies": ["a\n", "b\n", "c"]}]}
  ]
  (multi / "eval_outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  gz = tmp_path / "outcomes" / "demo_2" / "seed_1" / "eval_outcomes.jsonl.gz"
  assert str(gz) in seeds.keep(str(multi.parent), "demo_2", str(tmp_path / "outcomes"))
  first = gz.read_bytes()
  seeds.keep(str(multi.parent), "demo_2", str(tmp_path / "outcomes"))
  assert gz.read_bytes() == first and reports.read_outcomes(str(gz)) == records
  (tmp_path / "bad.jsonl").write_text(json.dumps(records[0]) + "\n\n" + '{"step": 6}\n')
  with pytest.raises(seeds.errors.DataError, match=r"bad.jsonl:3: not an evaluation record"):
    reports.read_outcomes(str(tmp_path / "bad.jsonl"))  # a replayer's KeyError otherwise
  (tmp_path / "bad.jsonl").write_text("{not json\n")
  with pytest.raises(seeds.errors.DataError, match=r"bad.jsonl:1: not JSON"):
    reports.read_outcomes(str(tmp_path / "bad.jsonl"))
  (tmp_path / "bad.jsonl.gz").write_bytes(first[:10])
  with pytest.raises(seeds.errors.DataError, match=r"bad.jsonl.gz: unreadable"):
    reports.read_outcomes(str(tmp_path / "bad.jsonl.gz"))
  with pytest.raises(seeds.errors.DataError, match=r"absent.jsonl: No such file .*WORKDIR/"):
    reports.read_outcomes(str(tmp_path / "absent.jsonl"))
  with pytest.raises(seeds.errors.FlagError, match="keep NAME='../x'"):
    seeds.keep(str(run), "../x", str(tmp_path / "outcomes"))
  (tmp_path / "outcomes" / "a_file").write_text("")
  with pytest.raises(seeds.errors.FlagError, match=r"keep NAME='a_file': .* is a file"):
    seeds.keep(str(run), "a_file", str(tmp_path / "outcomes"))
  with pytest.raises(seeds.errors.FlagError, match=r"^keep .*absent: no such directory"):
    seeds.keep(str(tmp_path / "absent"), "x", str(tmp_path / "outcomes"))


def test_child_argv_runs_one_seed_and_parallel_names_failures(tmp_path, monkeypatch):
  argv = ["seeds.py", "run", "--config=c.py:x", "--seeds", "0,1", "--parallel=2", "--config.a=1"]
  assert seeds.child_argv(argv, 1)[1:] == [
    "-m", "experiments.seeds", "run", "--config=c.py:x", "--config.a=1", "--seeds=1"
  ]  # fmt: skip
  exit_with_seed = lambda argv, seed: [sys.executable, "-c", f"raise SystemExit({seed} % 2)"]
  monkeypatch.setattr(seeds, "child_argv", exit_with_seed)
  with pytest.raises(seeds.errors.UsageError, match=r"seeds \[1, 3\] failed"):
    seeds.run_parallel(argv, [0, 1, 2, 3], str(tmp_path), 3)
  assert sorted(p.name for p in tmp_path.iterdir()) == [f"seed_{k}.log" for k in range(4)]
  with pytest.raises(seeds.errors.FlagError, match="--seeds=1,1"):
    seeds.parse_seeds("1,1")
  with pytest.raises(seeds.errors.FlagError, match="--parallel=0: seeds trained at once"):
    seeds.run_parallel(argv, [0, 1], str(tmp_path), 0)


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
  """Two seeds of a 3-iteration tiny GRPO run on 4x4 maps drawn from seeds (holes rare),
  evaluated greedily every 2 iterations and after the last (steps 0, 2, 3) on 8 held-out
  maps, 2 maps x 4 episodes per iteration: (root, config)."""
  root = tmp_path_factory.mktemp("seeds")
  cfg = with_overrides(
    agentic_configs.get_config("frozenlake_tiny"),
    {
      "env.fixed_map": "",
      "env.hole_prob": 0.05,  # half the maps all frozen: by seed alone many trained on
      "train.steps": 3,
      "eval.every": 2,
      "eval.num_tasks": 8,
      "algo.num_generations": 4,
      "train.batch_tasks": 2,
      "log.trajectories_every": 0,
    },
  )
  seeds.run_seeds(cfg, [0, 1], str(root))
  return root, cfg


@pytest.mark.slow
def test_two_seeds_run_evaluate_unseen_maps_and_report_intervals(two_seeds, monkeypatch):
  """Each seed's evaluation files hold 8 distinct maps, none drawn by a seed of the
  episode budget (maps recomputed here from the item seeds), their digests; the metrics
  say eval/overlap 0 and count the first 8 seeds' maps as computed here; the report's
  means are the files' means; a finished seed is skipped, and refused when the config
  changed. Mutations caught: `rl.evaluate` playing seeds offset + k instead of the
  held-out set's; `write` writing straight to the target (`tmp = target`, the first
  test); the finished seed's config unchecked (seeds_finished_seed_config_unchecked);
  no evaluation after a last step eval.every does not divide (rl_last_step_not_evaluated).
  Over 3 s: two tiny runs (compiled once, the second seed reuses the programs)."""
  root, cfg = two_seeds
  # excluded: the seeds of the episode budget, 3 steps x 2 tasks x 4 episodes
  trained = {frozenlake.generate_map(4, s, 0.05) for s in range(24)}
  first = [frozenlake.generate_map(4, 1_000_000 + k, 0.05) for k in range(8)]
  steps_seen = {}
  for k in (0, 1):
    found = item_outcomes.read(str(root / f"seed_{k}"))
    steps_seen[k] = sorted(found)
    for lines in found.values():
      maps = [frozenlake.generate_map(4, x["item"], 0.05) for x in lines]
      assert len(set(maps)) == 8 and not set(maps) & trained
      assert [x["key"] for x in lines] == [held_out.key_digest(m) for m in maps]
    record = run_metrics(root / f"seed_{k}")[-1]
    assert record["eval/overlap"] == 0 and record["eval/distinct"] == 8
    before = (sum(m in trained for m in first), len(set(first)))
    assert (record["eval/overlap_before"], record["eval/distinct_before"]) == before
    assert before[0] >= 3  # by seed alone, several maps trained on
    assert record["greedy/reward/mean"] == pytest.approx(np.mean([x["reward"] for x in lines]))
  assert steps_seen == {0: [0, 2, 3], 1: [0, 2, 3]}  # every 2, and after the last
  monkeypatch.setattr(seeds, "copy", None)  # a seed that ran again would fail here
  seeds.run_seeds(cfg, [0, 1], str(root))
  changed = cfg.copy_and_resolve_references()
  changed.train.learning_rate = 2 * cfg.train.learning_rate
  with pytest.raises(
    errors.FlagError,
    match=r"seed_0 finished with another config \(train\."
    r"learning_rate: .* new --workdir_root",
  ):
    seeds.run_seeds(changed, [0, 1], str(root))


@pytest.mark.slow
def test_report_of_two_seeds_and_the_same_dir_paired(two_seeds, tmp_path):
  """The report's mean per step is the mean of both seeds' per-item rewards, inside its
  interval; the dir against itself differs by 0 with p = 1; the PNG is written."""
  root, _ = two_seeds
  rep = seeds.report([str(root), str(root)], "reward", 300)
  points = [p for p in rep["points"] if p["run"] == 0]
  assert [p["step"] for p in rep["points"]] == [0, 2, 3] * 2
  for p in points:
    rewards = [
      [x["reward"] for x in item_outcomes.read(str(root / f"seed_{k}"))[p["step"]]] for k in (0, 1)
    ]
    assert p["mean"] == pytest.approx(np.mean(rewards)) and p["lo"] <= p["mean"] <= p["hi"]
    assert (p["seeds"], p["items"], p["seed_ids"], p["distinct"]) == (2, 8, [0, 1], 8)
  assert [(c["step"], c["difference"], c["p"]) for c in rep["comparison"]] == [
    (0, 0.0, 1.0),
    (2, 0.0, 1.0),
    (3, 0.0, 1.0),
  ]
  table = seeds.markdown(rep)
  assert table.count("\n| 2 | 8 | +0.000 |") == 1 and "95% interval" in table
  png = seeds.plot(rep, str(tmp_path / "curves.png"))
  assert (tmp_path / "curves.png").stat().st_size > 1000 and png.endswith(".png")
  json.dumps(rep)  # the report is JSON as it is
  assert intervals.mean_interval([np.ones(3)])["mean"] == 1.0


def test_a_paired_report_says_when_the_runs_share_no_item_or_no_step(tmp_path):
  """Two dirs that evaluated step 0 on different items get a comparison row saying no
  item was shared (not a silently missing row); dirs with no step in common say so.
  Mutation caught: the empty comparison dropped (seeds_unshared_comparison_dropped)."""
  one = lambda k: item_outcomes.item(k, None, 1.0, True, 1, "")
  item_outcomes.write(str(tmp_path / "a" / "seed_0"), 0, [one(1)])
  item_outcomes.write(str(tmp_path / "b" / "seed_0"), 0, [one(2)])
  item_outcomes.write(str(tmp_path / "c" / "seed_0"), 5, [one(1)])
  rep = seeds.report([str(tmp_path / "a"), str(tmp_path / "b")], "success", 50)
  assert rep["comparison"] == [{"step": 0, "items": 0}]
  assert "| 0 | 0 | - (no item evaluated by every seed of both) |" in seeds.markdown(rep)
  rep = seeds.report([str(tmp_path / "a"), str(tmp_path / "c")], "success", 50)
  assert rep["comparison"] == [] and "share no evaluation step" in seeds.markdown(rep)


def test_parallel_seeds_stop_with_their_command_and_logs_are_appended(tmp_path, monkeypatch):
  """`run --parallel` terminated (SIGTERM) stops its running seeds before it exits, so none
  goes on holding its workdir against the rerun; a rerun appends to each seed's log.
  Mutations caught: the running seeds left alone (seeds_parallel_children_orphaned), the
  log opened for writing (seeds_parallel_log_truncated)."""
  sleep_s = [120]
  code = "import os, time; print({}, os.getpid(), flush=True); time.sleep({})"
  monkeypatch.setattr(
    seeds, "child_argv", lambda argv, seed: [sys.executable, "-c", code.format(seed, sleep_s[0])]
  )
  logs = [tmp_path / f"seed_{k}.log" for k in (0, 1)]

  def terminate_once_both_started():
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in logs) and time.monotonic() < deadline:
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=terminate_once_both_started, daemon=True).start()
  with pytest.raises(SystemExit) as stopped:
    seeds.run_parallel([], [0, 1], str(tmp_path), 2)
  assert stopped.value.code == 128 + signal.SIGTERM
  for pid in [int(p.read_text().split()[1]) for p in logs]:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  sleep_s[0] = 0
  seeds.run_parallel([], [0, 1], str(tmp_path), 2)
  assert [len(p.read_text().splitlines()) for p in logs] == [2, 2]


def test_keep_refuses_to_pool_seeds_of_another_config_and_report_flags_them(tmp_path):
  """`keep` into a NAME whose other seeds ran another config is refused, naming the field;
  a kept seed the keep replaces, a config differing in `seed` only, and one from before a
  field was added (read at the value it ran with) are fine. `report` on a root mixing
  configs says so. Mutations caught: the check comparing the seed too
  (seeds_config_check_counts_the_seed), the kept copies left out
  (seeds_keep_ignores_kept_configs)."""

  def run(root, seeds, lr, checker=True):
    for k in seeds:
      item_outcomes.write(
        str(root / f"seed_{k}"), 0, [item_outcomes.item(1, "a", 1.0, True, 1, "")]
      )
      env = {"name": "gsm8k", **({"checker": "exact"} if checker else {})}
      config = {"seed": k, "env": env, "train": {"learning_rate": lr}}
      (root / f"seed_{k}" / "config.json").write_text(json.dumps(config))

  kept_root = tmp_path / "outcomes"
  run(tmp_path / "old", [0, 1], 1e-4, checker=False)
  seeds.keep(str(tmp_path / "old"), "x", str(kept_root))
  run(tmp_path / "more", [2], 1e-4)
  seeds.keep(str(tmp_path / "more"), "x", str(kept_root))  # env.checker added since: same run
  run(tmp_path / "redo", [0, 1, 2], 3e-4)
  seeds.keep(str(tmp_path / "redo"), "x", str(kept_root))  # replaces every kept seed
  run(tmp_path / "other", [3], 1e-4)
  with pytest.raises(
    errors.FlagError,
    match=r"x/seed_0 ran another config than \S*other/seed_3: train\.learning_rate: 0\.0003 -> "
    r"0\.0001\. .*another NAME",
  ):
    seeds.keep(str(tmp_path / "other"), "x", str(kept_root))
  assert seeds.report([str(kept_root / "x")], "success", 20)["mixed_configs"] == {}
  run(kept_root / "x", [3], 1e-4)
  rep = seeds.report([str(kept_root / "x")], "success", 20)
  assert "learning_rate" in rep["mixed_configs"][str(kept_root / "x")]
  assert "mixes configs" in seeds.markdown(rep)


def test_report_flags_that_cannot_work_are_refused_naming_the_flag(tmp_path):
  """--metric naming a text field, --draws below 1 and a --png in no folder are each a
  FlagError before any work, not a traceback (ValueError, IndexError, FileNotFoundError).
  Mutation caught: the metric read with float() again (seeds_text_metric_averaged)."""
  item_outcomes.write(str(tmp_path / "seed_0"), 0, [item_outcomes.item(1, "a", 1.0, True, 2, "x")])
  with pytest.raises(
    errors.FlagError,
    match=r"--metric=completion: item 1 holds 'x', not a "
    r"number; average one of \['item', 'reward', 'success', 'turns'\]",
  ):
    seeds.report([str(tmp_path)], "completion", 10)
  with pytest.raises(errors.FlagError, match=r"--draws=0: bootstrap replicates, >= 1"):
    seeds.report([str(tmp_path)], "success", 0)
  with pytest.raises(errors.FlagError, match=r"--png=\S*absent/c.png: no folder \S*absent;"):
    seeds.png_path(str(tmp_path / "absent" / "c.png"), str(tmp_path))
  assert seeds.png_path("", str(tmp_path)) == str(tmp_path / "seeds_report.png")
  assert seeds.report([str(tmp_path)], "turns", 10)["points"][0]["mean"] == 2.0
