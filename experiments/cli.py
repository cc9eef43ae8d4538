"""What every experiment main shares: the --config flag and a flag parser whose errors help.

ml_collections rejects an override of a field that does not exist with a bare
`AttributeError: "'nosuch'"` and a traceback; `run` replaces that with the
field's full name and the valid fields of its block, and exits with status 2. Every
other flag error (a value of the wrong type, an unknown variant, a config file that
does not load, an unknown flag) is one line and status 2 as well, not a traceback, and
so is a `rlpost.errors.UsageError` the run raises (a config value its checks refuse, an
unusable or busy --workdir, a checkpoint of another config) or a FileNotFoundError (a
data or model path that does not exist): its traceback is logged at debug level
(`--verbosity=1`).
"""

import dataclasses
import importlib.util
import logging as std_logging
import os
import sys

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_dict
from ml_collections import config_flags

from rlpost import config_moves
from rlpost import errors
from rlpost.recipes import learners
from rlpost.train import distributed
from rlpost.train import runtime


_DIST = config_flags.DEFINE_config_dict(
  "dist",
  ml_collections.ConfigDict(dataclasses.asdict(distributed.DistConfig())),
  "Several processes (rlpost.train.distributed): --dist.coordinator_address=HOST:PORT "
  "--dist.num_processes=N --dist.process_id=I, or none of them to detect SLURM / "
  "Kubernetes / one process.",
)


_CACHE_DIR = flags.DEFINE_string(
  "compilation_cache_dir",
  "~/.cache/rlpost/jax",
  "JAX's persistent compilation cache (a resumed run skips recompiling), in a "
  "subdirectory per JAX version and CPU; '' turns it off.",
)
_CACHE_GB = flags.DEFINE_float("compilation_cache_max_gb", 4.0, "Cache size cap (GB, LRU).")
_CHECKPOINT_LOGS = flags.DEFINE_bool(
  "checkpoint_info_logs", False, "Show the checkpoint library's INFO lines (off: quiet)."
)


def define_config(default: str, help_text: str):
  """The `--config=path.py[:variant]` flag (overrides: `--config.block.field=value`)."""
  return config_flags.DEFINE_config_file("config", default, help_text)


def check_learner(config, learner: str, source: str) -> None:
  """FlagError when `learner`, what `source` asks for (a flag, an entry point), is no
  learner, or the config's own `config.learner` names another: that one would win
  silently (`learners.name_of`)."""
  if learner not in learners.LEARNERS:
    raise errors.FlagError(f"{source}: use one of {tuple(learners.LEARNERS)}")
  if "learner" in config and config.learner != learner:
    raise errors.FlagError(
      f"{source}: the config names config.learner={config.learner!r}, which would win; "
      f"choose the config's {learner} variant (or --config.learner={learner})"
    )


def define_output(name: str, default: str, help_text: str):
  """A string flag naming a file the main writes: a path whose folder does not exist is
  refused when the flags are parsed (one FATAL line), not after the work it would hold."""
  holder = flags.DEFINE_string(name, default, help_text)
  flags.register_validator(
    name,
    lambda path: not path or os.path.isdir(os.path.dirname(os.path.abspath(path))),
    message="its folder does not exist; create it first",
  )
  return holder


def run(main) -> None:
  """`app.run(main)`, naming the unknown field when a --config.* override has none,
  applying `--config.a.b=None` overrides (after the others: absl cannot parse None for a
  typed field), starting `jax.distributed` from --dist.* before main touches a device,
  then the compilation cache and quiet checkpoint logs (`rlpost.train.runtime`); a
  UsageError or FileNotFoundError from main is one FATAL line and status 2."""
  nones = []

  def parse(argv):
    kept, found = split_none_overrides(argv)
    nones.extend(found)
    rest = _parse_flags(kept, argv)
    _check_config_file(argv)
    return rest

  def with_processes(argv):
    if nones:
      message = apply_none_overrides(flags.FLAGS["config"].value, nones)
      if message:
        print(f"FATAL flags parsing error: {message}", file=sys.stderr)
        sys.exit(2)
    # JAX's probe for a TPU logs a line at INFO on every machine without one: not news.
    std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.WARNING)
    # matplotlib says at INFO that it built its font cache (the curves' first PNG).
    std_logging.getLogger("matplotlib").setLevel(std_logging.WARNING)
    try:
      distributed.initialize(distributed.DistConfig(**_DIST.value))
      if not _CHECKPOINT_LOGS.value:
        runtime.quiet_checkpoint_logs()
      path = runtime.enable_compilation_cache(_CACHE_DIR.value, _CACHE_GB.value)
      logging.debug("compilation cache: %s", path or "off")
      return main(argv)
    # A refused config value, workdir or checkpoint; a missing data or model file (the
    # loaders name the path and its setting).
    except (errors.UsageError, FileNotFoundError) as e:
      logging.debug("traceback of the refusal below", exc_info=True)
      print(f"FATAL {type(e).__name__}: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(with_processes, flags_parser=parse)


_NONE = ("None", "none", "null")


def split_none_overrides(argv) -> tuple[list[str], list[str]]:
  """(argv without its `--config.a.b=None` overrides, their field paths "a.b")."""
  kept, nones = [], []
  for arg in argv:
    name, eq, value = arg.partition("=")
    if name.startswith("--config.") and eq and value in _NONE:
      nones.append(name[len("--config.") :])
    else:
      kept.append(arg)
  return kept, nones


def apply_none_overrides(config, paths) -> str | None:
  """Sets each field path of `config` to None; the first problem as a message (an
  unknown field, or one that cannot be None), else None."""
  for path in paths:
    node, message = _parent(config, path)
    if message:
      return message + _renamed_hint(config, path)
    last = path.split(".")[-1]
    # None only where the config allows it: a placeholder (a typed FieldReference) or a
    # field that is None already. ConfigDict itself would take None anywhere.
    declared = node._fields[last]  # pylint: disable=protected-access
    if not (isinstance(declared, config_dict.FieldReference) or node[last] is None):
      return (
        f"config.{path}=None: this field cannot be None (it holds "
        f"{type(node[last]).__name__} {node[last]!r}); give it a value"
      )
    setattr(node, last, None)
  return None


def _parse_flags(argv, full_argv):
  """flags.FLAGS(argv); a failed override is named from `full_argv` (argv with the None
  overrides, which ml_collections also reads from sys.argv). Any flag error (a value of
  the wrong type, an unknown variant or flag) is one line and exit status 2, as absl's
  own parser does; a custom `flags_parser` gets no such handling from `app.run`."""
  try:
    try:
      return flags.FLAGS(argv)
    except (AttributeError, KeyError, flags.Error):
      moved = _moved_fields(argv)
      if not moved:
        raise
      return flags.FLAGS(moved)
  except (AttributeError, KeyError) as e:
    message = unknown_override(full_argv) or f"config override failed: {e!r}"
  except flags.Error as e:
    message = flag_error_message(e)
  except OSError as e:  # an override of a config whose file did not load
    message = _config_file_message(e, full_argv)
  print(f"FATAL flags parsing error: {message}", file=sys.stderr)
  sys.exit(2)


def _moved_fields(argv) -> list[str] | None:
  """argv with each `--config.OLD=value` of a field that moved (`rlpost.config_moves`)
  written at its new place in the loaded config, or None when none moved. sys.argv too:
  ml_collections reads overrides from it as well."""
  given = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  try:  # the parse that failed never set the flag's value: load the file again
    path, _, variant = given[-1].partition(":")
    spec = importlib.util.spec_from_file_location("_moved_fields_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant) if variant else module.get_config()
  except Exception:  # the config itself did not load: its own error speaks
    return None
  paths = [
    a[len("--config.") : a.index("=")] for a in argv if a.startswith("--config.") and "=" in a
  ]
  moved = config_moves.moved_overrides(config, paths)
  if not moved:
    return None
  rewrite = lambda a: (
    f"--config.{moved[a[len('--config.') : a.index('=')]]}{a[a.index('=') :]}"
    if a.startswith("--config.") and "=" in a and a[len("--config.") : a.index("=")] in moved
    else a
  )
  sys.argv = [rewrite(a) for a in sys.argv]
  return [rewrite(a) for a in argv]


def _check_config_file(argv) -> None:
  """Exits with status 2 naming the file when --config's file could not be loaded
  (ml_collections defers that error to the config's first use, deep inside main)."""
  if "config" not in flags.FLAGS or flags.FLAGS["config"].value is None:
    return
  try:
    flags.FLAGS["config"].value.keys()
  except OSError as e:
    print(f"FATAL flags parsing error: {_config_file_message(e, argv)}", file=sys.stderr)
    sys.exit(2)


def _config_file_message(error: OSError, argv) -> str:
  """'--config=PATH: Failed loading config file ...' (the paths tried, no traceback)."""
  specs = [a for a in argv if a.startswith("--config=")]
  return f"{specs[-1] if specs else '--config'}: {error.__cause__ or error}"


def flag_error_message(error: Exception) -> str:
  """absl's message for a flag error; when the config file's `get_config` raised a
  TypeError or ValueError (an unknown variant), that error's own text instead of the traceback
  ml_collections embeds in the message."""
  cause = error
  while cause.__cause__ or cause.__context__:
    cause = cause.__cause__ or cause.__context__
  text = str(error)
  if isinstance(cause, (TypeError, ValueError)) and "Error whilst parsing config file" in text:
    flag = text.split(": Error whilst parsing config file", 1)[0]
    return f"{flag}: {cause}"
  return text


def _load_config(argv):
  """The ConfigDict named by the last --config= in argv (or the flag's default)."""
  specs = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  spec = specs[-1] if specs else config_flags.get_config_filename(flags.FLAGS["config"])
  path, _, variant = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_experiment_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def unknown_override(argv) -> str | None:
  """'config.a.b: no such field; valid fields of config.a: [...]' for the first unknown
  --config.a.b=... override in argv, or None when every override names a field."""
  try:
    config = _load_config(argv)
  except Exception:  # the config itself is broken: let the original error speak
    return None
  for arg in argv:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    path = arg[len("--config.") : arg.index("=")]
    _, message = _parent(config, path)
    if message:
      return message + _renamed_hint(config, path)
  return None


def _renamed_hint(config, path: str) -> str:
  """'; it was renamed: use config.NEW ...' when `path` is an old field name
  (`learners.RENAMED`) whose new place exists in this config, else ''."""
  new = learners.RENAMED.get(path)
  if new is None or _parent(config, new.split(" ")[0])[1]:
    return ""
  return f"; config.{path} was renamed: use config.{new}"


def _parent(config, path: str):
  """(the block holding field `path` "a.b", None), or (None, a message naming the first
  unknown name and the valid fields of its block)."""
  names = path.split(".")
  node = config
  for depth, name in enumerate(names):
    if not hasattr(node, "keys") or name not in node:
      block = ".".join(["config", *names[:depth]])
      valid = sorted(node.keys()) if hasattr(node, "keys") else []
      return None, (
        f"{'.'.join(['config', *names[: depth + 1]])}: no such field; valid fields of "
        f"{block}: {valid}"
      )
    if depth < len(names) - 1:
      node = node[name]
  return node, None
