"""Line-numbered JSONL reading with errors that name the file and line."""

import json
import os
from typing import Any, Iterator

from rlpost import errors


def _undecodable_line(path: str) -> str:
  """`path:line` and the bytes of the first line that is not UTF-8 (the error's where)."""
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        raw.decode("utf-8")
      except UnicodeDecodeError as e:
        return (
          f"{path}:{lineno}: byte {raw[e.start : e.start + 1]!r} (byte {e.start + 1} of the line)"
        )
  return path


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
  """Yields (`"{path}:{line}"`, object) for every non-blank line of a JSONL file.

  The file is UTF-8 (a leading byte-order mark is skipped); blank (whitespace-only)
  lines are skipped. A line that is not UTF-8 or not valid JSON, or whose value is
  not a JSON object, raises ValueError naming `path:line`.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"{path}: no such JSONL file; check the path (or the data_dir setting that points to it)"
    )
  with open(path, encoding="utf-8-sig") as f:
    lines = enumerate(f, start=1)
    while True:
      try:
        lineno, line = next(lines)
      except StopIteration:
        return
      except UnicodeDecodeError as e:
        raise errors.DataError(
          f"{_undecodable_line(path)} is not UTF-8 text ({e.reason}); save the file as "
          "UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from None
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise errors.DataError(
          f"{where}: invalid JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
        ) from e
      if not isinstance(obj, dict):
        raise errors.DataError(
          f"{where}: expected a JSON object, got {type(obj).__name__} {line.strip()[:60]!r}"
        )
      yield where, obj


def require_str(obj: dict[str, Any], field: str, where: str) -> str:
  """obj[field] when it is a string, else ValueError naming `where`, the field and the fix."""
  if field not in obj:
    raise errors.DataError(f"{where}: missing field {field!r} (fields present: {sorted(obj)})")
  value = obj[field]
  if not isinstance(value, str):
    raise errors.DataError(
      f"{where}: field {field!r} must be a string, got {type(value).__name__} {str(value)[:60]!r}"
    )
  return value


def where_of(path: str | os.PathLike, index: int) -> str:
  """`"{path}:{line}"` of the `index`-th object `read_jsonl(path)` yields (blank lines
  skipped), to name a record found wrong after loading."""
  for i, (where, _) in enumerate(read_jsonl(path)):
    if i == index:
      return where
  return f"{os.fspath(path)}: record {index}"
