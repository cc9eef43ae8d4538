"""A calculator tool: arithmetic through an AST whitelist, never `eval`.

`calculator(expression)` parses the text with `ast.parse(..., mode="eval")` and walks the
tree itself, accepting only int/float literals, `+ - * / **`, unary `+ -` and parentheses.
Everything is bounded before any work is done: the input length, the node count and nesting
depth of the tree, every exponent (|e| <= MAX_EXPONENT, checked on its evaluated value) and
every intermediate result (|x| <= MAX_MAGNITUDE). It never raises: a failure is a string
"error: <reason>" a model can read; a success is the value in the one result format
(`format_number`, re-exported as `tools.format_number`).
"""

import ast
import math
import operator
import re

MAX_CHARS = 200
MAX_NODES = 400
MAX_DEPTH = 100
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e15

_BINARY = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
  ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_OPERATOR_SYMBOLS = {
  ast.FloorDiv: "//",
  ast.Mod: "%",
  ast.MatMult: "@",
  ast.LShift: "<<",
  ast.RShift: ">>",
  ast.BitOr: "|",
  ast.BitXor: "^",
  ast.BitAnd: "&",
  ast.Invert: "~",
  ast.Not: "not",
}
_FORBIDDEN = {
  ast.Call: "calls are not allowed",
  ast.Attribute: "attribute access is not allowed",
  ast.Subscript: "subscripts are not allowed",
  ast.Compare: "comparisons are not allowed",
  ast.BoolOp: "boolean operators are not allowed",
  ast.IfExp: "conditional expressions are not allowed",
  ast.Lambda: "lambdas are not allowed",
  ast.JoinedStr: "f-strings are not allowed",
  ast.NamedExpr: "assignments are not allowed",
}
# Thousands separators: a digit run not after a digit or a point, then groups of ",ddd".
_THOUSANDS = re.compile(r"(?<![\d.])\d+(?:,\d{3})+(?!\d)")


class CalculatorError(ValueError):
  """A reason the expression cannot be evaluated (becomes "error: <reason>")."""


def _normalize(expression: str) -> str:
  """Maps × ÷ to * / and removes thousands separators; any other comma is an error."""
  text = expression.replace("×", "*").replace("÷", "/").strip()
  text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
  if "," in text:
    raise CalculatorError("commas are only allowed as thousands separators (like 1,000)")
  return text


def _check_size(tree: ast.AST) -> None:
  """Rejects trees over MAX_NODES nodes or MAX_DEPTH levels (iteratively, no recursion)."""
  stack, count = [(tree, 1)], 0
  while stack:
    node, depth = stack.pop()
    count += 1
    if count > MAX_NODES:
      raise CalculatorError("expression too long")
    if depth > MAX_DEPTH:
      raise CalculatorError("expression nested too deeply")
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _checked(value):
  """Returns `value` if it is a finite real number within MAX_MAGNITUDE."""
  if isinstance(value, complex):
    raise CalculatorError("result is not a real number")
  if isinstance(value, float) and not math.isfinite(value):
    raise CalculatorError("result is not finite")
  if abs(value) > MAX_MAGNITUDE:
    raise CalculatorError("result too large")
  return value


def _constant(value):
  """A literal: int or float only (no bool, complex, string, None, ...)."""
  if type(value) in (int, float):
    return _checked(value)
  if isinstance(value, (str, bytes)):
    raise CalculatorError("strings are not allowed")
  raise CalculatorError(f"only numbers are allowed, got {type(value).__name__}")


def _operator(op: ast.AST):
  """The function for a whitelisted binary or unary operator."""
  fn = _BINARY.get(type(op)) or _UNARY.get(type(op))
  if fn is None:
    symbol = _OPERATOR_SYMBOLS.get(type(op), type(op).__name__)
    raise CalculatorError(f"operator not allowed: {symbol}")
  return fn


def _apply(op: ast.AST, left, right):
  """left <op> right, with the exponent cap and arithmetic failures as CalculatorError."""
  fn = _operator(op)
  if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
    raise CalculatorError(f"exponent too large (at most {MAX_EXPONENT})")
  try:
    return _checked(fn(left, right))
  except ZeroDivisionError:
    raise CalculatorError("division by zero") from None
  except OverflowError:
    raise CalculatorError("result too large") from None


def _evaluate(node: ast.AST):
  """The value of a whitelisted node; anything else raises CalculatorError."""
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant):
    return _constant(node.value)
  if isinstance(node, ast.BinOp):
    left, right = _evaluate(node.left), _evaluate(node.right)
    return _apply(node.op, left, right)
  if isinstance(node, ast.UnaryOp):
    return _checked(_operator(node.op)(_evaluate(node.operand)))
  if isinstance(node, ast.Name):
    raise CalculatorError(f"names are not allowed: {node.id[:20]}")
  reason = _FORBIDDEN.get(type(node))
  raise CalculatorError(reason or f"unsupported syntax: {type(node).__name__}")


def _parse(text: str) -> ast.Expression:
  """`ast.parse` in eval mode; a syntax error becomes CalculatorError."""
  if not text:
    raise CalculatorError("empty expression")
  try:
    return ast.parse(text, mode="eval")
  except SyntaxError as e:
    detail = "" if e.msg == "invalid syntax" else f" ({e.msg})"
    raise CalculatorError(f"invalid syntax{detail}") from None
  except (ValueError, RecursionError, MemoryError):
    raise CalculatorError("invalid syntax") from None


def format_number(x: float | int) -> str:
  """THE result format for numbers: integral values without a point ("24", "-3"), others
  as f"{x:.6f}" with trailing zeros and point stripped ("0.5", "0.333333"); "-0" is "0"."""
  if isinstance(x, int) or (isinstance(x, float) and x.is_integer()):
    return str(int(x))
  text = f"{x:.6f}"
  if "." in text:
    text = text.rstrip("0").rstrip(".")
  return "0" if text == "-0" else text


def calculator(expression: str) -> str:
  """Evaluates an arithmetic expression: numbers, + - * / ** and parentheses.

  Args:
    expression: The arithmetic expression to evaluate, e.g. "48/2" or "(3 + 4) * 2**3".

  Returns:
    The value (e.g. "24", "0.5"), or "error: <reason>" (it never raises).
  """

  if not isinstance(expression, str):
    return f"error: expected a string, got {type(expression).__name__}"
  if len(expression) > MAX_CHARS:
    return f"error: expression too long (at most {MAX_CHARS} characters)"
  try:
    tree = _parse(_normalize(expression))
    _check_size(tree)
    return format_number(_evaluate(tree))
  except CalculatorError as e:
    return f"error: {e}"
  except Exception as e:  # a safety net: the whitelist should leave nothing to get here
    return f"error: could not evaluate ({type(e).__name__})"
