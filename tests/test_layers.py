"""The library's imports run one way, from the bottom floor up (docs/architecture.md).

Every ``import`` and ``from … import`` of a module counts, wherever it stands (inside a function
too), except those under ``if TYPE_CHECKING:``, which never run. A module may import its own floor
and the floors below; the kernels (tensor, sequence) import only the configuration; the library
imports neither the model zoo nor the benchmarks; and no chain of imports comes back to where it
started. ``python tests/test_layers.py`` prints every violation.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "colossal_jax"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("config",),  # JAX-free: choices, schemas, mesh specs, the family registry, the rules
    ("data",),  # corpora, tasks, batches
    ("tensor",),  # tensor-parallel layouts and shard_map kernels
    ("sequence",),  # ring, zigzag, Ulysses, ring self-attention
    ("layers",),  # the layers models are written with
    ("parallel",),  # mesh, sharding, ZeRO, remat, the unpipelined step
    ("pipeline",),  # schedules and their executor
    ("hf",),  # the Hugging Face bridge
    ("checks",),  # rules that need files, a checkpoint or the bridge; resolve → Plan
    ("runtime",),  # signals, watchdog, divergence guard, profiler, metrics writers, devices
    ("training",),  # build(plan), steps, the loop and its hooks, optimizers, checkpoints
    ("analysis",),  # reading compiled programs: collectives, bytes per mesh axis
    ("auto",),  # the planner: search space, hardware and cost models, measured figures
    ("cli", "generate", "hf_export", "__init__"),  # entry points
)
"""The floors of ``colossal_jax``, bottom first: a top-level module or sub-package per name."""

KERNELS = ("tensor", "sequence")
"""Floors that may import only ``config`` below them (and themselves)."""

FORBIDDEN = ("colossal_jax_models", "colossal_jax_benchmarks", "models", "benchmarks")
"""Packages the library never imports: the zoo registers itself; benchmarks sit on top."""


def floor_of(module: str) -> int | None:
    """The floor of a dotted ``colossal_jax`` module name (None outside the library)."""
    parts = module.split(".")
    if parts[0] != "colossal_jax":
        return None
    head = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(FLOORS):
        if head in names:
            return i
    raise AssertionError(f"{module}: colossal_jax.{head} is on no floor; add it to FLOORS")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import that runs (``from a import b`` gives ``a.b`` when
    ``a.b`` is a module of the library, else ``a``)."""
    tree = ast.parse(path.read_text())
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub) else node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def library_graph() -> dict[str, list[tuple[int, str]]]:
    """Every module of ``colossal_jax`` -> the imports it runs."""
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def violations() -> list[str]:
    found: list[str] = []
    graph = library_graph()
    for mod, imports in graph.items():
        here = floor_of(mod)
        assert here is not None
        for line, target in imports:
            where = f"{mod.replace('.', '/')}.py:{line}"
            if target.split(".")[0] in FORBIDDEN:
                found.append(f"{where} imports {target}: the library never imports it")
                continue
            there = floor_of(target)
            if there is None:
                continue
            if there > here:
                found.append(
                    f"{where} imports {target}, floor {FLOORS[there][0]} above {FLOORS[here][0]}"
                )
            elif FLOORS[here][0] in KERNELS and FLOORS[there][0] not in ("config", *KERNELS):
                found.append(f"{where} imports {target}: kernels import only config")
            elif FLOORS[here][0] == "tensor" and FLOORS[there][0] == "sequence":
                found.append(f"{where} imports {target}, floor sequence above tensor")
    found += [f"import circle among {len(c)} modules: {', '.join(c)}" for c in circles(graph)]
    return found


def circles(graph: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm), sorted: the
    modules that import one another in a circle."""
    edges = {
        m: sorted({_owner(t, graph) for _, t in imps} - {None, m}) for m, imps in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


def _owner(target: str, graph: dict) -> str | None:
    """The library module an import names (its longest prefix that is one)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        if name in graph:
            return name
    return None


def test_imports_run_one_way():
    found = violations()
    assert not found, "\n".join(found)


def test_every_package_is_installed():
    """pyproject.toml lists the library's packages by hand (for the package-dir mapping of the
    zoo, the presets and the benchmarks); a new sub-package must be added there."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    packages = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert packages <= listed, sorted(packages - listed)


def test_a_back_up_import_is_caught(tmp_path, monkeypatch):
    """The check is not vacuous: one import from a kernel up to the training floor fails it."""
    kernel = PACKAGE / "tensor" / "kernels.py"
    source = kernel.read_text() + "\n\ndef _late():\n    from colossal_jax.training import train\n"
    original = imports_of

    def patched(path: Path):
        if path == kernel:
            copy = tmp_path / "kernels.py"
            copy.write_text(source)
            return original(copy)
        return original(path)

    monkeypatch.setattr(sys.modules[__name__], "imports_of", patched)
    found = violations()
    caught = [v for v in found if "tensor/kernels.py" in v and "colossal_jax.training" in v]
    assert caught, found


if __name__ == "__main__":
    problems = violations()
    print("\n".join(problems) or "imports run one way: no violations, no circles")
    sys.exit(1 if problems else 0)
