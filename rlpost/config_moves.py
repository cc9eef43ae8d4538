"""RL config fields that moved, and the functions that read an old name at its new place.

An old name keeps working: a config file written against the old layout, a run's
config.json from before the move (resumed, compared) and a `--config.OLD=value` override
all reach the new field. The table is data: one line per moved field.

  train.batch_prompts -> train.batch_tasks   one batch field: tasks per step
  max_staleness       -> rollout.max_staleness   the agentic configs' top-level field
  data.*              -> env.*               a prompt dataset is an environment;
                                             data.source -> env.name
"""

import copy

import ml_collections

# The `data` block of a prompt dataset (the GRPO / PPO configs before the move).
PROMPT_FIELDS = (
  "data_dir",
  "template",
  "fewshot",
  "shuffle",
  "digit",
  "path",
  "rewards",
  "max_prompt_tokens",
  "on_too_long",
)
MOVED: dict[str, str] = {
  "train.batch_prompts": "train.batch_tasks",
  "max_staleness": "rollout.max_staleness",
  "data.source": "env.name",
  **{f"data.{name}": f"env.{name}" for name in PROMPT_FIELDS},
}


# Fields an RL config gained in the move, or since (an environment's field its block did
# not list, read at its default until then), with the value that gives what runs before
# did (as config.json writes it): a run from before is not "changed" by their arrival.
ADDED: dict[str, object] = {
  "rollout.template": None,
  "rollout.max_turn_tokens": None,
  "rollout.max_total_tokens": None,
  "rollout.max_prompt_tokens": None,
  "rollout.mask_truncated": False,
  "rollout.fixed_shapes": False,
  "rollout.stop_strings": [],
  "rollout.dynamic_sampling": False,
  "rollout.max_resample_rounds": 3,
  "rollout.overlong_buffer": None,
  "rollout.overlong_penalty": 1.0,
  "rollout.max_staleness": None,
  "env.checker": "exact",  # a prompt dataset's (reasoning_gym's block always had one)
  "env.tool_format": "library",  # gsm8k_calc
  "env.answer_format": "tags",  # reasoning_gym
  "env.random_map_size": 0,  # gymnasium
  "env.random_map_p": 0.8,
  "env.invalid_penalty": 0.1,
}


def has_field(tree, path: str) -> bool:
  """Whether the nested config `tree` holds the dotted `path` ("env.checker")."""
  node = tree
  for name in path.split("."):
    if not hasattr(node, "keys") or name not in node:
      return False
    node = node[name]
  return True


def moved_overrides(config, paths: list[str]) -> dict[str, str]:
  """{old path: new path} for each `--config.OLD` override path that this config has at
  its new place only (an SFT config's own `data.source` is left alone)."""
  return {
    p: MOVED[p]
    for p in paths
    if p in MOVED and not has_field(config, p) and has_field(config, MOVED[p])
  }


def moved_flat(old: dict, new: dict) -> dict:
  """`old` ({"a.b": value}, e.g. an earlier config.json flattened) with each moved field
  under its new name, where `new` (the same, of the current config) has it there only,
  and each field the move added (ADDED) at the value the old run ran with."""
  out = {
    (MOVED[k] if k in MOVED and k not in new and MOVED[k] in new else k): v for k, v in old.items()
  }
  block_of = lambda key: key.rsplit(".", 1)[0]
  blocks = {block_of(k) for k in out}
  for key, value in ADDED.items():  # only into a block the old run had
    if key in new and key not in out and block_of(key) in blocks:
      out[key] = value
  return out


def flat(tree, prefix: str = "") -> dict:
  """{"a.b": value} of a nested dict (a config as config.json holds it)."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for key, value in tree.items():
    out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
  return out


def differences(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[str]:
  """["a.b: old value -> new value", ...] (sorted) between two configs as config.json holds
  them (nested dicts), `old` read with its moved fields at their new names and the fields
  added since at the values it ran with (`moved_flat`); the dotted keys in `ignore` are
  left out. [] when they configure the same run."""
  new_flat = flat(new)
  old_flat, absent = moved_flat(flat(old), new_flat), "(absent)"
  return [
    f"{key}: {old_flat.get(key, absent)!r} -> {new_flat.get(key, absent)!r}"
    for key in sorted(set(old_flat) | set(new_flat))
    if key not in ignore and old_flat.get(key, absent) != new_flat.get(key, absent)
  ]


def migrate(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """An RL config with every old field at its new place (a copy; `cfg` itself when nothing
  moved). Raises ValueError when a field is set at both places."""
  old = [p for p in MOVED if has_field(cfg, p)]
  if not old:
    return cfg
  both = [p for p in old if has_field(cfg, MOVED[p])]
  if both:
    raise ValueError(
      f"config.{both[0]} and config.{MOVED[both[0]]} are both set: {both[0]} is the old name "
      f"of {MOVED[both[0]]}; keep only config.{MOVED[both[0]]}"
    )
  out = copy.deepcopy(cfg)
  with out.unlocked():
    for path in old:
      block, _, name = path.rpartition(".")
      source = out[block] if block else out
      value = source[name]
      new_block, _, new_name = MOVED[path].rpartition(".")
      if new_block and new_block not in out:
        out[new_block] = ml_collections.ConfigDict()
      target = out[new_block] if new_block else out
      with target.unlocked():
        target[new_name] = value
      with source.unlocked():
        del source[name]
    if "data" in out and not out.data.keys():
      del out["data"]
  return out
