"""Runs the mutation list (`mutations.py`) against a tree's tests and prints what each kills.

  python -m tests.mutations.run                      # this tree, every mutation
  python -m tests.mutations.run --tree=../old --out=before.json
  python -m tests.mutations.run --only=gae_drops_lambda,tis_cap_ignored

The tree (rlpost/, experiments/, tests/, pyproject.toml) is copied once into a temporary
directory; for each mutation the one line is replaced there (the text must occur exactly
once), the mutation's test files run with `pytest -x`, and the file is restored. The
copy's `rlpost` is the one imported (the runner checks): the working tree is never
touched. A mutation is "killed" when pytest fails or runs past --timeout (a hang is a
failure CI would see), "survived" when it passes, "missing" when its line is not in
the tree (a stale entry: fix the list), "error" when pytest itself could not run. Prints one JSON object per mutation and a
summary line; --out writes them all as one JSON file.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from tests.mutations.mutations import MUTATIONS

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
COPIED = ("rlpost", "experiments", "tests", "pyproject.toml", "README.md", "BUILD.md")


def _copy_tree(source: pathlib.Path, target: pathlib.Path) -> None:
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
  for name in COPIED:
    path = source / name
    if path.is_dir():
      shutil.copytree(path, target / name, ignore=ignore)
    else:
      shutil.copy2(path, target / name)


def _check_imports_copy(tree: pathlib.Path, env: dict) -> None:
  out = subprocess.run(
    [sys.executable, "-c", "import rlpost; print(rlpost.__file__)"],
    cwd=tree,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  if not out.stdout.strip().startswith(str(tree)):
    raise SystemExit(f"the copy's tests would import {out.stdout.strip()}, not the copy in {tree}")


def run_one(tree: pathlib.Path, mutation: dict, env: dict, timeout: float, workers: int) -> dict:
  """Applies `mutation` in `tree`, runs its tests, restores the file; returns the record."""
  path = tree / mutation["path"]
  tests = [t for t in mutation["tests"] if (tree / t).exists()]
  record = {"name": mutation["name"], "path": mutation["path"], "tests": tests}
  original = path.read_text()
  count = original.count(mutation["old"])
  if count != 1 or not tests:
    return {
      **record,
      "result": "missing",
      "why": f"line found {count} times, {len(tests)} test files",
    }
  path.write_text(original.replace(mutation["old"], mutation["new"]))
  start = time.time()
  try:
    out = subprocess.run(
      [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", str(workers)]
      + tests,
      cwd=tree,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
    )
    # 1: a test failed; 2: interrupted by -x after a failure (or a collection error the
    # mutation caused); 3, 4, 5: pytest's own error, a usage error, no tests: the runner's fault.
    result = {0: "survived", 1: "killed", 2: "killed"}.get(out.returncode, "error")
    tail = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED")][:3]
    record.update(returncode=out.returncode, summary=tail, failed=failed)
  except subprocess.TimeoutExpired:
    result = "killed"
    record.update(returncode=None, summary=[f"timed out after {timeout:.0f} s"], failed=[])
  finally:
    path.write_text(original)
  return {**record, "result": result, "seconds": round(time.time() - start, 1)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tree", default=str(REPO_ROOT), help="repository whose code and tests run")
  parser.add_argument("--only", default="", help="comma-separated mutation names")
  parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutation")
  parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
  parser.add_argument("--out", default="", help="write the records here as JSON")
  args = parser.parse_args(argv)
  chosen = [m for m in MUTATIONS if not args.only or m["name"] in args.only.split(",")]
  records = []
  with tempfile.TemporaryDirectory(prefix="rlpost_mutants_") as tmp:
    tree = pathlib.Path(tmp)
    _copy_tree(pathlib.Path(args.tree).resolve(), tree)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.setdefault(
      "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rlpost_mutants_jax_cache")
    )
    _check_imports_copy(tree, env)
    for mutation in chosen:
      record = run_one(tree, mutation, env, args.timeout, args.workers)
      records.append(record)
      print(json.dumps(record), flush=True)
  killed = sum(r["result"] == "killed" for r in records)
  missing = sum(r["result"] == "missing" for r in records)
  print(
    json.dumps({"tree": args.tree, "mutations": len(records), "killed": killed, "missing": missing})
  )
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
