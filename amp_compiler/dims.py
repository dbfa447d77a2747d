"""Sizes of symbolic dims: plain names (``batch``) and the arithmetic of them that shape
inference writes (``4*batch``, ``seq + 1``, ``floor(seq/2)``).

The cost model sizes a symbolic dim from ``--dim`` values (or a torch example), else from
``default_dim``. An expression is sized from its names when each is a dim the graph's inputs
declare or one given a size, so ``batch*seq`` grows with ``--dim seq=2048``; an expression
naming anything else (a symbol inference made up) is sized as an unknown dim.
docs/architecture.md, "Input handling".
"""

from __future__ import annotations

import ast
import math
from typing import Iterable

#: the functions sympy's printer writes into ONNX Runtime's symbolic dims
_FUNCTIONS = {"floor": math.floor, "ceiling": math.ceil, "ceil": math.ceil, "Max": max, "Min": min,
              "max": max, "min": min, "Abs": abs, "Mod": lambda a, b: a % b}
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b}
_parsed: dict[str, ast.expr | None] = {}


def _expression(dim: str) -> ast.expr | None:
    """The parsed arithmetic of ``dim``, or None for a plain name or text that is not arithmetic."""
    if dim not in _parsed:
        try:
            node = ast.parse(dim, mode="eval").body
        except (SyntaxError, ValueError):
            node = None
        _parsed[dim] = None if node is None or isinstance(node, ast.Name) or not _arithmetic(node) else node
    return _parsed[dim]


def _arithmetic(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp):
        return type(node.op) in _BINARY and _arithmetic(node.left) and _arithmetic(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _arithmetic(node.operand)
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords
                and all(_arithmetic(a) for a in node.args))
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    return isinstance(node, ast.Name)


def names_in(dim: str) -> set[str]:
    """The symbols ``dim`` is made of: itself for a plain name, else its expression's names."""
    node = _expression(dim)
    if node is None:
        return {dim}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not _is_function(node, n)}


def _is_function(root: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(c, ast.Call) and c.func is name for c in ast.walk(root))


def _value(node: ast.expr, sizes: dict[str, int]) -> float:
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_value(node.left, sizes), _value(node.right, sizes))
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand, sizes)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call):
        return _FUNCTIONS[node.func.id](*(_value(a, sizes) for a in node.args))
    if isinstance(node, ast.Constant):
        return node.value
    return sizes[node.id]


class DimSizes(dict):
    """The sizes given by name (``--dim``, a torch example); ``get`` also sizes an expression of
    declared or sized dims, which are looked up by their text (memoised)."""

    def __init__(self, values: dict[str, int] | None, default: int, declared: Iterable[str] = ()) -> None:
        super().__init__(values or {})
        self.default = int(default)
        self.declared = frozenset(declared)
        self._expressions: dict[str, int] = {}

    def get(self, dim, fallback=None):
        if dim in self:
            return self[dim]
        if not isinstance(dim, str):
            return fallback
        found = self._expressions.get(dim)
        if found is None:
            found = self._expressions[dim] = self._size(dim, fallback)
        return found

    def _size(self, dim: str, fallback) -> int:
        node = _expression(dim)
        names = names_in(dim)
        if node is None or not names <= (self.declared | self.keys()):
            return self.default if fallback is None else fallback
        try:
            value = _value(node, {n: dict.get(self, n, self.default) for n in names})
        except (ArithmeticError, ValueError, TypeError):
            return self.default if fallback is None else fallback
        return max(int(value), 0)

    def unsized(self, dim: str) -> set[str]:
        """The names a ``--dim`` would have to size for ``dim`` to stop being a default."""
        names = names_in(dim)
        if _expression(dim) is not None and not names <= (self.declared | self.keys()):
            return {dim}  # made of a symbol no input declares: sized as unknown whatever --dim says
        return {n for n in names if n not in self}


def check_sizes(dim_values, default_dim) -> None:
    """A ``TypeError`` or ``ValueError`` saying what is wrong with sizes a caller passed (a
    ``{"batch": "4"}`` failed deep in the cost model with "unsupported operand type(s)")."""
    if isinstance(default_dim, bool) or not isinstance(default_dim, int) or default_dim < 1:
        raise ValueError(f"default_dim must be a positive int, got {default_dim!r}")
    if dim_values is None:
        return
    if not isinstance(dim_values, dict):
        raise TypeError(f"dim_values must be a dict of dim name -> size, got {type(dim_values).__name__}")
    for name, size in dim_values.items():
        if not isinstance(name, str):
            raise TypeError(f"dim_values: a dim name must be a str, got {name!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"dim_values[{name!r}] must be a positive int, got {size!r}")


__all__ = ["DimSizes", "check_sizes", "names_in"]
