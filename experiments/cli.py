"""What every experiment main shares: the --config flag and a flag parser whose errors help.

ml_collections rejects an override of a field that does not exist with a bare
`AttributeError: "'nosuch'"` and a traceback; `run` replaces that with the
field's full name and the valid fields of its block, and exits with status 2.
"""

import dataclasses
import importlib.util
import sys

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

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


def run(main) -> None:
  """`app.run(main)`, naming the unknown field when a --config.* override has none,
  starting `jax.distributed` from --dist.* before main touches a device, then the
  compilation cache and quiet checkpoint logs (`rlpost.train.runtime`)."""

  def with_processes(argv):
    distributed.initialize(distributed.DistConfig(**_DIST.value))
    if not _CHECKPOINT_LOGS.value:
      runtime.quiet_checkpoint_logs()
    path = runtime.enable_compilation_cache(_CACHE_DIR.value, _CACHE_GB.value)
    logging.info("compilation cache: %s", path or "off")
    return main(argv)

  app.run(with_processes, flags_parser=_parse_flags)


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    message = unknown_override(argv) or f"config override failed: {e!r}"
    print(f"FATAL flags parsing error: {message}", file=sys.stderr)
    sys.exit(2)


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
    names = arg[len("--config.") : arg.index("=")].split(".")
    node = config
    for depth, name in enumerate(names):
      if not hasattr(node, "keys") or name not in node:
        block = ".".join(["config", *names[:depth]])
        valid = sorted(node.keys()) if hasattr(node, "keys") else []
        return (
          f"{'.'.join(['config', *names[: depth + 1]])}: no such field; valid fields of "
          f"{block}: {valid}"
        )
      node = node[name]
  return None
