"""The library's floors: a module imports its own floor and the floors below, never above.

  recipes                   read ConfigDicts, compose everything below
  train                     devices, processes, the train step and the run loop
  envs                      environments and rollouts (over data, rewards, the sampler)
  rl, supervised            losses, advantages, batches
  data, rewards             datasets, prompts, reward functions
  serve                     the OpenAI-compatible endpoint (over the sampler and the text floor)
  sampling, continuation    the sampler
  models                    architectures, weights, quantization
  ops                       logprobs, masks
  text                      tokenizer, chat template, scaffold, tool-call syntax
  errors, config_moves, references   what the user fixes; user code named MODULE:FUNCTION

`text` is the floor below `data` and `envs`: neither reaches into the other for how text
is encoded, and nothing below the recipes imports `train`. Within `recipes`, no module
imports a recipe (RECIPES): what recipes share lives in helper modules.
"""

import ast
import pathlib

FLOORS = (
  ("errors", "config_moves", "references"),
  ("text",),
  ("ops",),
  ("models",),
  ("sampling", "continuation"),
  ("serve",),
  ("data", "rewards"),
  ("rl", "supervised"),
  ("envs",),
  ("train",),
  ("recipes",),
)
RECIPES = ("rl", "sft", "dpo", "eval")  # the rest of rlpost/recipes/ are their helpers
_FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}
_ROOT = pathlib.Path(__file__).resolve().parents[1] / "rlpost"


def _imported(tree: ast.AST) -> set[str]:
  """The rlpost modules and packages a module imports (top-level or inside functions)."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlpost"):
      if node.module == "rlpost":
        names |= {f"rlpost.{a.name}" for a in node.names}
      else:
        names.add(node.module)
    elif isinstance(node, ast.Import):
      names |= {a.name for a in node.names if a.name.startswith("rlpost")}
  return names


def _floor_name(module: str) -> str:
  """rlpost.envs.multiturn -> envs; rlpost.sampling -> sampling."""
  return module.split(".")[1]


def upward_imports(root: pathlib.Path = _ROOT) -> list[str]:
  """Every import from a lower floor to a higher one, as 'file -> module' lines; also any
  module whose floor the table does not name (a new package must be placed)."""
  bad = []
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root.parent)
    if rel.name == "__init__.py" and len(rel.parts) == 2:
      continue  # the package map
    source = ".".join(rel.with_suffix("").parts)
    here = _FLOOR.get(_floor_name(source))
    if here is None:
      bad.append(f"{rel}: not in FLOORS; place its package in the table")
      continue
    for target in sorted(_imported(ast.parse(path.read_text(), str(rel)))):
      there = _FLOOR.get(_floor_name(target))
      if there is None or there > here:
        bad.append(f"{rel} -> {target}")
  return bad


def test_no_module_imports_a_floor_above_its_own():
  bad = upward_imports()
  assert not bad, "imports against the floors (tests/test_layering.py):\n" + "\n".join(bad)


def test_an_upward_import_is_caught(tmp_path):
  """Mutation the check must catch: a data module importing from envs (and one inside a
  function), and a package missing from the table."""
  pkg = tmp_path / "rlpost"
  (pkg / "data").mkdir(parents=True)
  (pkg / "envs").mkdir()
  (pkg / "data" / "prompts.py").write_text("from rlpost.envs import scaffold\n")
  (pkg / "data" / "chat.py").write_text("def f():\n  import rlpost.train.shares\n")
  (pkg / "envs" / "ok.py").write_text("from rlpost.data import prompts\nfrom rlpost import text\n")
  (pkg / "newpkg").mkdir()
  (pkg / "newpkg" / "m.py").write_text("")
  assert upward_imports(pkg) == [
    "rlpost/data/chat.py -> rlpost.train.shares",
    "rlpost/data/prompts.py -> rlpost.envs",
    "rlpost/newpkg/m.py: not in FLOORS; place its package in the table",
  ]


def recipe_imports(root: pathlib.Path = _ROOT) -> list[str]:
  """Every import of a recipe module (RECIPES) by a library module, as 'file -> recipe'."""
  bad = []
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root.parent)
    for node in ast.walk(ast.parse(path.read_text(), str(rel))):
      names = []
      if isinstance(node, ast.ImportFrom) and node.module == "rlpost.recipes":
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlpost.recipes."):
        names = [node.module.split(".")[2]]
      elif isinstance(node, ast.Import):
        names = [a.name.split(".")[2] for a in node.names if a.name.startswith("rlpost.recipes.")]
      bad += [f"{rel} -> {name}" for name in names if name in RECIPES]
  return bad


def test_no_recipe_imports_another_recipe():
  bad = recipe_imports()
  assert not bad, "recipe imports (share a helper module instead):\n" + "\n".join(bad)


def test_a_recipe_import_is_caught(tmp_path):
  """Mutation the check must catch: the DPO recipe importing SFT's (as before the one RL
  recipe), in each import form; a helper module import passes."""
  pkg = tmp_path / "rlpost" / "recipes"
  pkg.mkdir(parents=True)
  (pkg / "dpo.py").write_text(
    "from rlpost.recipes import sft as s, common\nimport rlpost.recipes.rl\n"
    "def f():\n  from rlpost.recipes.eval import evaluate\n"
  )
  (pkg / "sft.py").write_text("from rlpost.recipes import supervised_run\n")
  assert recipe_imports(tmp_path / "rlpost") == [
    "rlpost/recipes/dpo.py -> sft",
    "rlpost/recipes/dpo.py -> rl",
    "rlpost/recipes/dpo.py -> eval",
  ]


MAX_FUNCTION_LINES = 80  # issue 35: a function a reader follows in one screen or two


def long_functions(root: pathlib.Path) -> list[str]:
  """`path:name (lines)` of every function under `root` longer than MAX_FUNCTION_LINES
  (decorators excluded, docstring included)."""
  found = []
  for path in sorted(root.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines})")
  return found


def test_no_library_function_is_longer_than_80_lines(tmp_path):
  """Mutation caught: an 81-line function (the check run on a file holding one)."""
  assert not long_functions(_ROOT), "split these:\n" + "\n".join(long_functions(_ROOT))
  (tmp_path / "m.py").write_text("def f():\n" + "  x = 1\n" * 80)
  assert long_functions(tmp_path) == [f"{tmp_path.name}/m.py:f (81)"]
