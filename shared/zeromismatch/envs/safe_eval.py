"""A calculator for model-written expressions that never runs model text as Python.

The text is parsed with ``ast.parse(mode="eval")`` and the tree is walked by our own interpreter, which
accepts only: integer literals, parentheses (implicit in the tree), unary ``-``/``+`` and binary
``+ - * // % **``. Everything else -- names, attribute access, calls, subscripts, comprehensions,
lambdas, strings, floats, bools, comparisons, ``/`` -- raises ``UnsafeExpressionError`` naming the
construct. Sizes are bounded before any work is done: text length, tree depth, node count, exponent,
and the magnitude of every intermediate result (checked before a ``**`` is computed, so ``9**9**9``
is refused instantly rather than computed).
"""

from __future__ import annotations

import ast
import operator

__all__ = ["SafeEvalLimits", "UnsafeExpressionError", "safe_eval"]


class UnsafeExpressionError(ValueError):
    """The expression uses a construct or size the calculator does not allow."""


class SafeEvalLimits:
    max_chars = 200
    max_depth = 32
    max_nodes = 200
    max_exponent = 64
    max_abs = 10**18


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_REFUSED = {
    ast.Name: "names are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Call: "calls are not allowed",
    ast.Subscript: "subscripts are not allowed",
    ast.Lambda: "lambdas are not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "boolean operators are not allowed",
    ast.IfExp: "conditional expressions are not allowed",
}


def safe_eval(expression: str, limits: type[SafeEvalLimits] = SafeEvalLimits) -> int:
    """Evaluate an integer arithmetic expression; raise UnsafeExpressionError for anything else."""
    if not isinstance(expression, str):
        raise TypeError(f"expression must be str, got {type(expression).__name__}")
    if len(expression) > limits.max_chars:
        raise UnsafeExpressionError(
            f"expression has {len(expression)} characters; the limit is {limits.max_chars}"
        )
    if not expression.strip():
        raise UnsafeExpressionError("expression is empty")
    # Deep nesting could exhaust the parser's recursion before we see the tree.
    if expression.count("(") > limits.max_depth:
        raise UnsafeExpressionError(f"expression nests deeper than {limits.max_depth}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UnsafeExpressionError(f"expression is not valid arithmetic: {exc.__class__.__name__}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > limits.max_nodes:
        raise UnsafeExpressionError(f"expression has {nodes} nodes; the limit is {limits.max_nodes}")
    return _evaluate(tree.body, limits, depth=0)


def _bounded(value: int, limits: type[SafeEvalLimits]) -> int:
    if abs(value) > limits.max_abs:
        raise UnsafeExpressionError(f"intermediate result exceeds the magnitude limit {limits.max_abs}")
    return value


def _evaluate(node: ast.AST, limits: type[SafeEvalLimits], depth: int) -> int:
    if depth > limits.max_depth:
        raise UnsafeExpressionError(f"expression nests deeper than {limits.max_depth}")
    if isinstance(node, ast.Constant):
        # bool is a subclass of int; True/False are names in spirit, refuse them.
        if type(node.value) is not int:
            raise UnsafeExpressionError(f"only integer literals are allowed, got {type(node.value).__name__}")
        return _bounded(node.value, limits)
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise UnsafeExpressionError(f"unary operator {type(node.op).__name__} is not allowed")
        return _bounded(_UNARY[type(node.op)](_evaluate(node.operand, limits, depth + 1)), limits)
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise UnsafeExpressionError(f"binary operator {type(node.op).__name__} is not allowed")
        left = _evaluate(node.left, limits, depth + 1)
        right = _evaluate(node.right, limits, depth + 1)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right, limits)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise UnsafeExpressionError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right), limits)
    for kind, reason in _REFUSED.items():
        if isinstance(node, kind):
            raise UnsafeExpressionError(reason)
    raise UnsafeExpressionError(f"{type(node).__name__} is not allowed in a calculator expression")


def _check_power(base: int, exponent: int, limits: type[SafeEvalLimits]) -> None:
    if exponent < 0:
        raise UnsafeExpressionError("negative exponents are not allowed (integer arithmetic only)")
    if exponent > limits.max_exponent:
        raise UnsafeExpressionError(f"exponent {exponent} exceeds the limit {limits.max_exponent}")
    # |base|**exponent has about bit_length * exponent bits; refuse before computing a huge number.
    if abs(base) > 1 and (abs(base).bit_length() - 1) * exponent > limits.max_abs.bit_length():
        raise UnsafeExpressionError(f"{base}**{exponent} would exceed the magnitude limit {limits.max_abs}")
