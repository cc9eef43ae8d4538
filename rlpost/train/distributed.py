"""Several processes on JAX's own multi-controller runtime (`jax.distributed`).

Every experiment main takes `--dist.*` flags (experiments/cli.py) and calls
`initialize` before anything touches a device:

  explicit   --dist.coordinator_address=HOST:PORT --dist.num_processes=N --dist.process_id=I
             (all three; a shell loop on one machine, or a Kubernetes manifest that
             fills them from the pod's index)
  SLURM      nothing: under `srun` with more than one task JAX reads the job's
             variables (SLURM_PROCID, SLURM_NTASKS, the node list)
  Kubernetes nothing, when the `kubernetes` package is installed in the image: JAX
             reads the JobSet / indexed Job pod's environment
  otherwise  one process; nothing is initialized

`heartbeat_timeout_s`: a process the coordinator has not heard from for this long
fails the job, so the others exit non-zero instead of hanging in a collective.
"""

import dataclasses
import os

import jax

from rlpost import errors


@dataclasses.dataclass(frozen=True)
class DistConfig:
  """The `--dist.*` flags (empty / 0 / -1: detect)."""

  coordinator_address: str = ""
  num_processes: int = 0
  process_id: int = -1
  heartbeat_timeout_s: int = 100
  initialization_timeout_s: int = 300


def cluster(environ=None) -> str | None:
  """ "slurm" or "kubernetes" when the environment runs several processes under one, else None."""
  env = os.environ if environ is None else environ
  if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1"))) > 1:
    return "slurm"
  if "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env:
    return "kubernetes"
  return None


def check(config: DistConfig) -> bool:
  """True when the settings are explicit (all three given); ValueError when only some are."""
  given = {
    "dist.coordinator_address": bool(config.coordinator_address),
    "dist.num_processes": config.num_processes > 0,
    "dist.process_id": config.process_id >= 0,
  }
  if any(given.values()) and not all(given.values()):
    missing = ", ".join(name for name, ok in given.items() if not ok)
    raise errors.FlagError(
      f"--dist settings are partial: {missing} missing. Give coordinator_address (HOST:PORT "
      "of process 0), num_processes and process_id together, or none of them to detect "
      "SLURM / Kubernetes / a single process"
    )
  if all(given.values()) and not 0 <= config.process_id < config.num_processes:
    raise errors.FlagError(
      f"--dist.process_id={config.process_id}: must be in [0, "
      f"dist.num_processes={config.num_processes})"
    )
  return all(given.values())


def initialize(config: DistConfig, environ=None) -> str:
  """Starts the multi-controller runtime when there are several processes.

  Returns how: "explicit", "slurm", "kubernetes" or "single" (nothing done).
  """
  timeouts = dict(
    initialization_timeout=config.initialization_timeout_s,
    heartbeat_timeout_seconds=config.heartbeat_timeout_s,
  )
  if check(config):
    if config.num_processes == 1:
      return "single"
    jax.distributed.initialize(
      config.coordinator_address, config.num_processes, config.process_id, **timeouts
    )
    return "explicit"
  how = cluster(environ)
  if how is None:
    return "single"
  jax.distributed.initialize(**timeouts)
  return how
