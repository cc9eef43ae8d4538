"""The mutation list (tests/mutations) stays applicable: a refactor that moves a mutated
line must move its entry too, or the strength figure silently loses a mutation."""

import pathlib

from tests.mutations.mutations import MUTATIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_mutation_applies_once_and_names_existing_tests():
  problems = []
  for m in MUTATIONS:
    count = (ROOT / m["path"]).read_text().count(m["old"])
    if count != 1:
      problems.append(f"{m['name']}: its line occurs {count} times in {m['path']}")
    problems += [f"{m['name']}: no {t}" for t in m["tests"] if not (ROOT / t).exists()]
  assert not problems, "\n".join(problems)
  assert len({m["name"] for m in MUTATIONS}) == len(MUTATIONS), "duplicate mutation names"
