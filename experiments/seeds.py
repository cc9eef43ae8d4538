r"""One config over several seeds, and a report with intervals from their per-item outcomes.

  python -m experiments.seeds run --config=experiments/configs/agentic.py:frozenlake_gemma3 \
      --seeds=0,1,2 --workdir_root=/tmp/fl_grpo [--parallel=3] [--config.train.steps=30 ...]
  python -m experiments.seeds report /tmp/fl_grpo [/tmp/fl_ppo] [--metric=success]
  python -m experiments.seeds keep /tmp/fl_grpo frozenlake_grpo

`run` trains the config once per seed (`config.seed=K`) in DIR/seed_K, one after another,
or with `--parallel=N` as N processes at a time (each appending to DIR/seed_K.log, and
stopped with the command when it is interrupted or terminated). A seed whose metrics
reach `train.steps` is skipped, or refused when its config.json records another config
(a FlagError naming the fields); an interrupted one resumes from its checkpoints (the
recipe's own resume, which reports a changed field). `--learner`: the learner when the
config names none (as experiments.grpo / ppo choose theirs).

`report` reads every DIR/seed_K/eval/step_N.jsonl (`rlpost.recipes.item_outcomes`) and
prints JSON, then a Markdown table: per evaluation step, the mean of `--metric` over
seeds and items and its 95% interval (`experiments.intervals`: seeds, then items,
resampled; a fixed bootstrap seed, so the same files give the same report); with a
second DIR, the paired difference (first minus second) on the items both evaluated
(same item id and content key), its interval and a sign-flip p-value. Where the
outcome lines carry the reference answers (reasoning-gym, GSM8K, prompt datasets), each
step also gets the best constant answer's success rate on its items (`constant`): a
policy that says the most frequent answer to everything scores that much, so a score
near it is no sign of solving the task. A DIR whose seeds ran different configs (any
field but `seed` in their config.json) is flagged (`mixed_configs`). Curves with their
bands go to `--png` (default DIR/seeds_report.png).

`keep DIR NAME` copies what a cited number is recounted from into the code tree,
experiments/results/outcomes/NAME (`OUTCOMES_ROOT`): every seed_K/eval/step_N.jsonl,
seed_K/config.json and seed_K/provenance.jsonl (each start's commit and CPU, which
`report` lists per seed) and, for a multi-turn run (a line of more than one turn), its
seed_K/eval_outcomes.jsonl gzipped, the turns' replies one by one that a line's joined
completion cannot always give back (the scripted yardsticks replay them:
`textarena_baselines`, `frozenlake_baselines`); nothing else (no checkpoints, no
transcripts). `report` reads that folder as it reads DIR, so the number survives the
machine its run was on. One NAME holds one config: a keep whose seeds ran another config
than the seeds already kept there (and not replaced by this keep) is refused.
"""

import copy
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from absl import flags
import numpy as np

from experiments import cli
from experiments import intervals
from rlpost import config_moves, errors
from rlpost.recipes import item_outcomes, reports
from rlpost.train import provenance

_CONFIG = cli.define_config(None, "The config to run (run only): path.py[:variant].")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "run: the seeds, comma-separated.")
_ROOT = flags.DEFINE_string("workdir_root", "", "run: DIR; seed K runs in DIR/seed_K.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "run: seeds trained at once (processes).")
_LEARNER = flags.DEFINE_string("learner", "", "run: the learner if the config names none.")
_METRIC = flags.DEFINE_string("metric", "success", "report: the per-item field averaged.")
_PNG = flags.DEFINE_string("png", "", "report: curves (default FIRST_DIR/seeds_report.png).")
_DRAWS = flags.DEFINE_integer("draws", intervals.DRAWS, "report: bootstrap replicates.")

_SEED_DIR = re.compile(r"seed_(\d+)")
OUTCOMES_ROOT = os.path.join(os.path.dirname(__file__), "results", "outcomes")
_KEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
USAGE = "usage: python -m experiments.seeds run --config=... | report DIR [DIR2] | keep DIR NAME"


def parse_seeds(text: str) -> list[int]:
  """'0,1,2' -> [0, 1, 2]; anything else is a FlagError naming --seeds."""
  try:
    seeds = [int(s) for s in text.split(",")]
  except ValueError:
    seeds = []
  if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
    raise errors.FlagError(
      f"--seeds={text}: give distinct non-negative integers, comma-separated, e.g. 0,1,2"
    )
  return seeds


def finished(workdir: str, steps: int) -> bool:
  """Whether the run in `workdir` logged its step `steps` (its last)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    return any(json.loads(line).get("step", -1) >= steps for line in f if line.strip())


def run_seeds(config, seeds: list[int], root: str, learner: str | None = None) -> list[str]:
  """Trains `config` with each seed in root/seed_K, in turn (finished seeds skipped);
  returns the workdirs."""
  from rlpost.recipes import rl  # pylint: disable=g-import-not-at-top

  if "seed" not in config:
    raise errors.ConfigError("config.seed: this config has no seed field to vary")
  workdirs = []
  for seed in seeds:
    workdir = os.path.join(root, f"seed_{seed}")
    workdirs.append(workdir)
    if finished(workdir, config.train.steps):
      _refuse_finished_with_another_config(workdir, config, seed)
      print(f"seed {seed}: finished in {workdir}, skipped")
      continue
    cfg = copy.deepcopy(config)
    cfg.seed = seed
    rl.run(cfg, workdir, learner=learner)
  return workdirs


def _refuse_finished_with_another_config(workdir: str, cfg, seed: int) -> None:
  """A FlagError when the finished run in `workdir` recorded another config than `cfg`
  with `seed` (its config.json against `cfg` with moved fields at their new places; a
  field `cfg` leaves at "auto", which the run resolved for its machine, is not compared):
  skipping it would report the old config's numbers as this one's."""
  from rlpost.recipes import rl_config  # pylint: disable=g-import-not-at-top

  recorded = _config_json(workdir)
  if recorded is None:
    return
  wanted = {**json.loads(rl_config.migrated(cfg).to_json_best_effort()), "seed": seed}
  auto = tuple(k for k, v in config_moves.flat(wanted).items() if v == "auto")
  changed = config_moves.differences(recorded, wanted, ignore=auto)
  if changed:
    raise errors.FlagError(
      f"{workdir} finished with another config ({_first_three(changed)}), so it "
      "would be skipped and its numbers reported as this config's: give a new "
      "--workdir_root (or remove that seed's folder to train it again)"
    )


def child_argv(argv: list[str], seed: int) -> list[str]:
  """This command's argv for one seed alone (--seeds and --parallel replaced)."""
  drop = ("--seeds", "--parallel")
  kept, skip = [], False
  for arg in argv[1:]:
    if skip:
      skip = False
    elif arg.split("=")[0] in drop:
      skip = "=" not in arg  # "--seeds 0,1": its value is the next argument
    elif arg != "run":
      kept.append(arg)
  return [sys.executable, "-m", "experiments.seeds", "run", *kept, f"--seeds={seed}"]


STOP_GRACE_S = 30  # seconds a seed's process gets to exit after SIGTERM


def _exit_on_sigterm(signum, frame):
  raise SystemExit(128 + signum)


def _stop(running: dict) -> None:
  """Terminates the still-running seeds' processes ({seed: (Popen, log)}) and waits."""
  for proc, _ in running.values():
    proc.terminate()
  for seed, (proc, log) in running.items():
    try:
      proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()
    print(f"seed {seed}: stopped (rerun the command to resume it)")


def run_parallel(argv: list[str], seeds: list[int], root: str, parallel: int) -> None:
  """Each seed as its own process (this command with --seeds=K), `parallel` at a time,
  output appended to root/seed_K.log; raises UsageError naming the seeds that failed.
  Interrupted (Ctrl-C, SIGTERM), it stops its running seeds (SIGTERM, then SIGKILL after
  STOP_GRACE_S) before it exits: none goes on unwatched, holding its workdir's lock
  against the rerun (which resumes each from its checkpoints)."""
  if parallel < 1:
    raise errors.FlagError(f"--parallel={parallel}: seeds trained at once, >= 1")
  os.makedirs(root, exist_ok=True)
  waiting, running, failed = list(seeds), {}, []
  previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
  try:
    while waiting or running:
      while waiting and len(running) < parallel:
        seed = waiting.pop(0)
        log = open(os.path.join(root, f"seed_{seed}.log"), "a", encoding="utf-8")
        proc = subprocess.Popen(child_argv(argv, seed), stdout=log, stderr=subprocess.STDOUT)
        running[seed] = (proc, log)
      for seed, (proc, log) in list(running.items()):
        if proc.poll() is not None:
          log.close()
          del running[seed]
          print(f"seed {seed}: exit status {proc.returncode} (log {log.name})")
          if proc.returncode:
            failed.append(seed)
      time.sleep(0.5)
  finally:
    signal.signal(signal.SIGTERM, previous)
    _stop(running)
  if failed:
    raise errors.UsageError(f"seeds {failed} failed; see {root}/seed_K.log")


def load(root: str, metric: str, command: str = "report") -> dict:
  """{step: {seed: {(item, key): value of `metric`}}} from root/seed_K/eval/step_N.jsonl
  (`command` names the subcommand in errors)."""
  if not os.path.isdir(root):
    raise errors.FlagError(f"{command} {root}: no such directory (a run's --workdir_root)")
  found = {}
  for name in sorted(os.listdir(root)):
    match = _SEED_DIR.fullmatch(name)
    if not match:
      continue
    for step, lines in item_outcomes.read(os.path.join(root, name)).items():
      if lines and metric not in lines[0]:
        raise errors.FlagError(f"--metric={metric}: the outcome lines hold {sorted(lines[0])}")
      values = {(x["item"], x["key"]): _number(x, metric) for x in lines}
      found.setdefault(step, {})[int(match.group(1))] = values
  if not found:
    raise errors.FlagError(f"{command} {root}: no seed_K/eval/step_N.jsonl files (run `run` first)")
  return found


def _number(line: dict, metric: str) -> float:
  """line[metric] as a float: FlagError when it is text (a completion, an answer) or absent."""
  value = line.get(metric)
  if isinstance(value, (int, float)):  # bool included
    return float(value)
  numeric = sorted(k for k, v in line.items() if isinstance(v, (bool, int, float)))
  raise errors.FlagError(
    f"--metric={metric}: item {line['item']} holds {str(value)[:40]!r}, not a number; "
    f"average one of {numeric}"
  )


def answers(root: str) -> dict:
  """{step: {(item, key): reference answer}} from root's outcome lines that carry one."""
  found = {}
  for name in sorted(os.listdir(root)):
    if _SEED_DIR.fullmatch(name):
      for step, lines in item_outcomes.read(os.path.join(root, name)).items():
        known = {(x["item"], x["key"]): x["answer"] for x in lines if "answer" in x}
        found.setdefault(step, {}).update(known)
  return found


def constant_baseline(items: list, answers_of: dict) -> dict | None:
  """The most frequent reference answer among `items` and its share of them: the success
  rate of answering it to everything (None unless every item's answer is known)."""
  if not items or any(k not in answers_of for k in items):
    return None
  values = [answers_of[k].strip() for k in items]
  best = max(sorted(set(values)), key=values.count)
  return {"answer": best, "mean": values.count(best) / len(values)}


def tables(runs: list[dict]) -> tuple[list, list[list[np.ndarray]]]:
  """(the items every seed of every run evaluated, sorted; per run its outcome table:
  one [items] array per seed)."""
  shared = set.intersection(*[set(v) for run in runs for v in run.values()])
  items = sorted(shared, key=lambda k: (k[0], str(k[1])))
  return items, [[np.array([run[s][k] for k in items]) for s in sorted(run)] for run in runs]


def png_path(png: str, first_root: str) -> str:
  """Where `report`'s curves go: `png`, or FIRST_DIR/seeds_report.png when it is "";
  FlagError (before any work) when `png`'s folder does not exist."""
  if not png:
    return os.path.join(first_root, "seeds_report.png")
  folder = os.path.dirname(os.path.abspath(png))
  if not os.path.isdir(folder):
    raise errors.FlagError(f"--png={png}: no folder {folder}; create it first")
  return png


def report(roots: list[str], metric: str, draws: int) -> dict:
  """The report's JSON (module docstring)."""
  if draws < 1:
    raise errors.FlagError(
      f"--draws={draws}: bootstrap replicates, >= 1 (default {intervals.DRAWS})"
    )
  loaded = [load(r, metric) for r in roots]
  out = {"metric": metric, "dirs": roots, "points": [], "comparison": []}
  out["provenance"] = {root: ran_on(root) for root in roots}
  mixed = {root: config_mismatch(seed_configs(root)) for root in roots}
  out["mixed_configs"] = {root: why for root, why in mixed.items() if why}
  for index, (root, found) in enumerate(zip(roots, loaded)):
    known = answers(root)
    for step, run in found.items():
      items, (table,) = tables([run])
      point = intervals.mean_interval(table, draws=draws) if items else {"items": 0}
      keys = {k for _, k in items}
      distinct = None if None in keys else len(keys)  # content keys: distinct items
      where = {"run": index, "dir": root, "step": step, "seed_ids": sorted(run)}
      where["distinct"] = distinct
      where["constant"] = constant_baseline(items, known.get(step, {}))
      out["points"].append({**where, **point})
  if len(roots) == 2:
    for step in sorted(set(loaded[0]) & set(loaded[1])):
      items, (a, b) = tables([loaded[0][step], loaded[1][step]])
      diff = intervals.paired_difference(a, b, draws=draws) if items else {"items": 0}
      out["comparison"].append({"step": step, **diff})
  return out


def ran_on(root: str) -> dict:
  """{seed_K: `provenance.summary`} of root's seeds that recorded one (runs started
  before provenance.jsonl existed are left out)."""
  found = {}
  for name in sorted(os.listdir(root)):
    records = provenance.read(os.path.join(root, name)) if _SEED_DIR.fullmatch(name) else []
    if records:
      found[name] = provenance.summary(records)
  return found


def markdown(rep: dict) -> str:
  """The report as Markdown tables."""
  constant = lambda c: "-" if not c else f"{c['mean']:.3f} ({c['answer'][:20]!r})"
  rows = [
    f"| {p['dir']} | {p['step']} | {p.get('seeds', 0)} | {p['items']} ({p['distinct']}) | "
    + (f"{p['mean']:.3f} | [{p['lo']:.3f}, {p['hi']:.3f}] |" if "mean" in p else "- | - |")
    + f" {constant(p.get('constant'))} |"
    for p in rep["points"]
  ]
  head = (
    f"| dir | step | seeds | items (distinct) | mean {rep['metric']} | 95% interval "
    "| best constant answer |"
  )
  text = [head, "|---" * 7 + "|"]
  text += rows
  if len(rep.get("dirs", ())) == 2 and not rep["comparison"]:
    text += ["", "No paired comparison: the two dirs share no evaluation step."]
  if rep["comparison"]:
    text += ["", "| step | items | difference (first - second) | 95% interval | p (items) |"]
    text += ["|---" * 5 + "|"]
    text += [
      f"| {c['step']} | {c['items']} | {c['difference']:+.3f} | "
      f"[{c['lo']:+.3f}, {c['hi']:+.3f}] | {c['p']:.4f} |"
      if c["items"]
      else f"| {c['step']} | 0 | - (no item evaluated by every seed of both) | - | - |"
      for c in rep["comparison"]
    ]
  for root, why in rep.get("mixed_configs", {}).items():
    text += ["", f"**{root} mixes configs**: {why}. Its means pool different runs."]
  for root, seeds in rep.get("provenance", {}).items():
    text += [""] + [
      f"- {root}/{seed}: started at steps {p['starts']}, commits {', '.join(p['commits'])}"
      + (" (with uncommitted changes)" if p["dirty"] else "")
      + f"; {'; '.join(p['cpus'])}"
      for seed, p in seeds.items()
    ]
  return "\n".join(text)


def _config_json(workdir: str) -> dict | None:
  """workdir/config.json (None when absent); DataError when it is not JSON."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError as e:
    raise errors.DataError(f"{path}: not JSON ({e}); a run writes it at its start") from None


def seed_configs(root: str) -> dict[str, dict]:
  """{root/seed_K: its config.json} of root's seeds that have one."""
  names = sorted(os.listdir(root)) if os.path.isdir(root) else []
  found = {os.path.join(root, n): None for n in names if _SEED_DIR.fullmatch(n)}
  found = {where: _config_json(where) for where in found}
  return {where: config for where, config in found.items() if config is not None}


def config_mismatch(configs: dict[str, dict]) -> str | None:
  """Which of `configs` ({where: config.json}) ran another config than the first, and the
  first fields that differ (the seed aside); None when all ran one config."""
  if not configs:
    return None
  (first, reference), *others = configs.items()
  for where, config in others:
    changed = config_moves.differences(config, reference, ignore=("seed",))
    if changed:
      return f"{where} ran another config than {first}: {_first_three(changed)}"
  return None


def _first_three(changed: list[str]) -> str:
  """The first three changed fields, and how many more."""
  more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
  return "; ".join(changed[:3]) + more


def keep(root: str, name: str, outcomes_root: str = OUTCOMES_ROOT) -> list[str]:
  """Copies root/seed_K/{eval/step_N.jsonl, config.json, provenance.jsonl} to
  outcomes_root/name/ (the same layout; an earlier copy of the same file is replaced), and
  a multi-turn run's eval_outcomes.jsonl gzipped; returns the copied paths."""
  if not _KEEP_NAME.fullmatch(name):
    raise errors.FlagError(
      f"keep NAME={name!r}: use letters, digits, '_', '.', '-' (a folder name)"
    )
  load(root, "success", "keep")  # report's checks: a workdir root with outcome files
  kept, ours = os.path.join(outcomes_root, name), seed_configs(root)
  if os.path.exists(kept) and not os.path.isdir(kept):
    raise errors.FlagError(f"keep NAME={name!r}: {kept} is a file; choose another NAME")
  replaced = {os.path.basename(where) for where in ours}  # kept copies these replace
  staying = {k: v for k, v in seed_configs(kept).items() if os.path.basename(k) not in replaced}
  mismatch = config_mismatch({**ours, **staying})
  if mismatch:
    raise errors.FlagError(
      f"keep {root} {name}: {mismatch}. One NAME holds the seeds of one config: keep this "
      f"run under another NAME (or remove {kept} if it is stale)"
    )
  copied = []
  for seed_dir in sorted(os.listdir(root)):
    if not _SEED_DIR.fullmatch(seed_dir):
      continue
    src = os.path.join(root, seed_dir)
    steps = item_outcomes.read(src)
    names = [os.path.relpath(item_outcomes.path(src, step), src) for step in steps]
    names += [f for f in ("config.json", provenance.FILE) if os.path.exists(os.path.join(src, f))]
    for rel in names:
      dst = os.path.join(outcomes_root, name, seed_dir, rel)
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      _replaced(dst, lambda tmp, rel=rel: shutil.copyfile(os.path.join(src, rel), tmp))
      copied.append(dst)
    replies = os.path.join(src, reports.EVAL_OUTCOMES)
    multi_turn = any(line["turns"] > 1 for lines in steps.values() for line in lines)
    if multi_turn and os.path.exists(replies):
      copied.append(_gzipped(replies, os.path.join(outcomes_root, name, seed_dir)))
  return copied


def _gzipped(path: str, folder: str) -> str:
  """`path` gzipped into `folder` (the same bytes give the same file: no time stamp)."""
  dst = os.path.join(folder, os.path.basename(path) + ".gz")

  def write(tmp):
    with open(path, "rb") as src, open(tmp, "wb") as raw:
      with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        shutil.copyfileobj(src, out)

  _replaced(dst, write)
  return dst


def _replaced(dst: str, write) -> None:
  """`write(tmp)` then `tmp` renamed onto `dst`: a keep killed midway leaves each kept
  file whole (the old copy or the new), never a truncated one."""
  tmp = f"{dst}.{os.getpid()}.tmp"
  try:
    write(tmp)
    os.replace(tmp, dst)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def plot(rep: dict, path: str) -> str:
  """Each dir's mean per step with its 95% band, to `path` (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for index, root in enumerate(rep["dirs"]):
    pts = [p for p in rep["points"] if p["run"] == index and "mean" in p]
    steps = [p["step"] for p in pts]
    name = f"{index + 1}: {os.path.basename(os.path.normpath(root))}"
    ax.plot(steps, [p["mean"] for p in pts], marker=".", label=name)
    ax.fill_between(steps, [p["lo"] for p in pts], [p["hi"] for p in pts], alpha=0.25)
  ax.set_xlabel("step")
  ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  ax.set_ylabel(f"{rep['metric']} (95% interval)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return path


def main(argv):
  command, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
  if command == "run" and not rest:
    if not _ROOT.value or _CONFIG.value is None:
      raise errors.FlagError(f"run needs --config and --workdir_root; {USAGE}")
    seeds = parse_seeds(_SEEDS.value)
    if _LEARNER.value:
      cli.check_learner(_CONFIG.value, _LEARNER.value, f"--learner={_LEARNER.value}")
    if _PARALLEL.value != 1:  # 0 or less: refused there
      run_parallel(sys.argv, seeds, _ROOT.value, _PARALLEL.value)
    else:
      run_seeds(_CONFIG.value, seeds, _ROOT.value, _LEARNER.value or None)
  elif command == "report" and 1 <= len(rest) <= 2:
    png = png_path(_PNG.value, rest[0])
    rep = report(rest, _METRIC.value, _DRAWS.value)
    rep["png"] = plot(rep, png)
    print(json.dumps(rep, indent=1))
    print(markdown(rep))
  elif command == "keep" and len(rest) == 2:
    copied = keep(*rest)
    print(json.dumps({"kept": len(copied), "to": os.path.join(OUTCOMES_ROOT, rest[1])}))
  else:
    raise errors.FlagError(f"{' '.join(argv[1:]) or '(no command)'}: {USAGE}")


if __name__ == "__main__":
  cli.run(main)
