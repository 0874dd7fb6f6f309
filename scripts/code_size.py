#!/usr/bin/env python
"""The largest modules and function bodies of the library, against docs/architecture.md's limits.

  python scripts/code_size.py                 # the five largest of each, and every one over a limit
  python scripts/code_size.py --top 10 --path colossal_jax/training

A module's size is its line count; a function's is its body's lines without its docstring (a
nested function counts in its parent too, as the parent's lines). Exits with status 1 when a
module is over ``--max-module`` lines or a function body over ``--max-function``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of ``node``'s body, its docstring excluded."""
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        if len(body) == 1:
            return 0
        first = body[1]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    return node.end_lineno - start + 1


def measure(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(lines, path)`` of every module and ``(body lines, path:qualified name)`` of every
    function under ``root``."""
    modules, functions = [], []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        modules.append((len(text.splitlines()), str(rel)))

        functions += [(n, f"{rel}:{name}") for n, name in _functions(ast.parse(text), "")]
    return sorted(modules, reverse=True), sorted(functions, reverse=True)


def _functions(node: ast.AST, prefix: str) -> list[tuple[int, str]]:
    """``(body lines, qualified name)`` of every function under ``node``."""
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            out.append((body_lines(child), name))
            out += _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            out += _functions(child, f"{prefix}{child.name}.")
        else:
            out += _functions(child, prefix)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--path", type=Path, default=ROOT / "colossal_jax")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--max-module", type=int, default=500)
    p.add_argument("--max-function", type=int, default=60)
    args = p.parse_args(argv)
    modules, functions = measure(args.path.resolve())
    print(f"largest modules (limit {args.max_module} lines):")
    for n, name in modules[: args.top]:
        print(f"  {n:5d}  {name}")
    print(f"largest function bodies, docstrings excluded (limit {args.max_function} lines):")
    for n, name in functions[: args.top]:
        print(f"  {n:5d}  {name}")
    over = [f"module {m} ({n})" for n, m in modules if n > args.max_module]
    over += [f"function {f} ({n})" for n, f in functions if n > args.max_function]
    for line in over:
        print(f"over the limit: {line}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
