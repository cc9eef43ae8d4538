"""Multi-process test launches compile each program once: the process holding a program's
first device compiles it and publishes its binary through jax.distributed's key-value
store; the other processes load that binary instead of compiling it again.

JAX's own `jax_share_binary_between_hosts` does this only under a persistent-cache key,
and on CPU those keys differ per process (and the launches keep that cache off), so each
process compiled every program itself: half the compile CPU of a 2-process launch. Here
the key is the program's own bytes (its StableHLO bytecode, the compile options' XLA
overrides and the device ids), equal on every process of an SPMD launch; a program that
spans one process only (a sampler on its local devices) compiles as before. Each process
also keeps what it compiled or loaded, so a later run of the launch with the same program
(the recipes re-jit per run, and the persistent cache is off) neither compiles nor waits.

Private JAX APIs (`compiler.compile_or_get_cached`, the serialization calls): without
them `share_compiled_programs` changes nothing and returns False.
"""

import hashlib
import threading

WAIT_MS = 900_000  # a binary the first process is still compiling (tiny programs: seconds)


def share_compiled_programs() -> bool:
  """Installs the sharing in this process (after `jax.distributed.initialize`)."""
  try:
    from jax._src import compilation_cache, compiler  # pylint: disable=g-import-not-at-top
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  if not hasattr(compiler, "compile_or_get_cached") or not hasattr(
    compiler, "backend_compile_and_load"
  ):
    return False
  compile_or_get_cached = compiler.compile_or_get_cached
  held, lock = {}, threading.Lock()

  def key_of(computation, devices, options) -> str:
    ids = ",".join(str(d.id) for d in devices.flat)
    overrides = repr(sorted(options.env_option_overrides))
    digest = hashlib.sha256(mlir.module_to_bytecode(computation))
    digest.update(f"{ids};{overrides}".encode())
    return "rlpost_test_program/" + digest.hexdigest()

  def compile_once(
    backend, computation, devices, options, host_callbacks, executable_devices, *rest, **kw
  ):
    first = min(devices.flat, key=lambda d: d.id).process_index
    if host_callbacks or len({d.process_index for d in devices.flat}) < 2:
      return compile_or_get_cached(
        backend, computation, devices, options, host_callbacks, executable_devices, *rest, **kw
      )
    key = key_of(computation, devices, options)
    client = jax_distributed.global_state.client
    with lock:
      if key in held:
        return held[key]
    if jax_distributed.global_state.process_id == first:
      executable = compiler.backend_compile_and_load(
        backend, computation, executable_devices, options, host_callbacks
      )
      blob = compilation_cache.compress_executable(backend.serialize_executable(executable))
      # two threads may compile one program at once: the second overwrites the same bytes
      client.key_value_set_bytes(key, blob, allow_overwrite=True)
    else:
      blob = client.blocking_key_value_get_bytes(key, WAIT_MS)
      executable = backend.deserialize_executable(
        compilation_cache.decompress_executable(blob), executable_devices, options
      )
    with lock:
      return held.setdefault(key, executable)

  compiler.compile_or_get_cached = compile_once
  return True
