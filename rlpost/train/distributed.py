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

Explicit settings are checked before `jax.distributed` starts, so a wrong one is one
FATAL line within seconds instead of a C++ abort after `initialization_timeout_s`: the
address must be HOST:PORT with a host that resolves; process 0 must be able to listen on
the port; every other process waits at most `connect_timeout_s` for something to accept
a connection there.
"""

import dataclasses
import os
import socket
import time

import jax

from rlpost import errors


@dataclasses.dataclass(frozen=True)
class DistConfig:
  """The `--dist.*` flags (empty / -1: detect)."""

  coordinator_address: str = ""
  num_processes: int = -1
  process_id: int = -1
  heartbeat_timeout_s: int = 100
  initialization_timeout_s: int = 300
  connect_timeout_s: int = 20


def cluster(environ=None) -> str | None:
  """ "slurm" or "kubernetes" when the environment runs several processes under one, else None."""
  env = os.environ if environ is None else environ
  if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1"))) > 1:
    return "slurm"
  if "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env:
    return "kubernetes"
  return None


def check(config: DistConfig) -> bool:
  """True when the settings are explicit (all three given); FlagError when only some are,
  or one is out of range, or the address is not HOST:PORT."""
  if config.num_processes != -1 and config.num_processes < 1:
    raise errors.FlagError(
      f"--dist.num_processes={config.num_processes}: must be >= 1 (the job's process "
      "count), or -1 (unset) to detect SLURM / Kubernetes / a single process"
    )
  for name in ("heartbeat_timeout_s", "initialization_timeout_s", "connect_timeout_s"):
    if getattr(config, name) < 1:
      raise errors.FlagError(f"--dist.{name}={getattr(config, name)}: must be >= 1 second")
  given = {
    "dist.coordinator_address": bool(config.coordinator_address),
    "dist.num_processes": config.num_processes != -1,
    "dist.process_id": config.process_id != -1,
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
  if all(given.values()):
    parse_address(config.coordinator_address)
  return all(given.values())


def parse_address(address: str) -> tuple[str, int]:
  """(host, port) of `--dist.coordinator_address` HOST:PORT ("[v6 address]:PORT" too)."""
  host, colon, port = address.rpartition(":")
  where = f"--dist.coordinator_address={address!r}"
  if not colon or not host:
    raise errors.FlagError(
      f"{where}: give HOST:PORT of process 0 (e.g. localhost:12355 or 10.0.0.2:12355)"
    )
  if not (port.isdigit() and 0 < int(port) < 65536):
    raise errors.FlagError(f"{where}: the port {port!r} must be a number in 1..65535")
  return host.removeprefix("[").removesuffix("]"), int(port)


def _check_reachable(config: DistConfig) -> None:
  """Before `jax.distributed` starts: the coordinator's host resolves; process 0 can
  listen on its port; another process reaches it within `connect_timeout_s`."""
  address = config.coordinator_address
  host, port = parse_address(address)
  where = f"--dist.coordinator_address={address!r}"
  try:
    socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
  except socket.gaierror as e:
    raise errors.FlagError(
      f"{where}: the host {host!r} does not resolve ({e.strerror}); give process 0's host "
      "name or IP address as every process's machine sees it"
    ) from None
  if config.process_id == 0:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        probe.bind(("", port))
      except OSError as e:
        raise errors.FlagError(
          f"{where}: process 0 cannot listen on port {port} ({e.strerror}); choose a free port"
        ) from None
    return
  deadline = time.monotonic() + config.connect_timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=min(2.0, config.connect_timeout_s)):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise errors.FlagError(
          f"{where}: nothing accepted a connection there within {config.connect_timeout_s} s "
          f"(--dist.connect_timeout_s; last: {e.strerror or e}); check that process 0 runs "
          "with this address, and that this machine reaches that host and port"
        ) from None
    time.sleep(0.25)


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
    _check_reachable(config)
    jax.distributed.initialize(
      config.coordinator_address, config.num_processes, config.process_id, **timeouts
    )
    return "explicit"
  how = cluster(environ)
  if how is None:
    return "single"
  jax.distributed.initialize(**timeouts)
  return how
