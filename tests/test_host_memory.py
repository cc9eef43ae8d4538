"""host_memory.release_freed_memory really returns freed heap pages (Linux/glibc)."""

import ctypes
import sys

import pytest

from rlpost.train import host_memory


def _rss_kib() -> int:
  with open("/proc/self/status", encoding="utf-8") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_release_freed_memory_lowers_the_resident_set():
  libc = ctypes.CDLL(None)
  libc.malloc.restype = ctypes.c_void_p
  libc.free.argtypes = [ctypes.c_void_p]
  size = 64 * 1024  # below glibc's mmap threshold: heap
  blocks = [libc.malloc(size) for _ in range(4096)]  # 256 MiB
  for block in blocks:
    ctypes.memset(block, 1, size)
  for block in blocks[:-1]:  # the last one pins the heap top
    libc.free(block)
  before = _rss_kib()
  assert host_memory.release_freed_memory()
  assert before - _rss_kib() > 128 * 1024, (before, _rss_kib())
  libc.free(blocks[-1])
