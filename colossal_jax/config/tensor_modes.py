"""The tensor-parallel modes, one registered :class:`TensorMode` each: its name and help, the
layout that runs it, its grid shape (the rule and the ``tensor=N`` factoring), what it splits
(:class:`TensorSplit`) and its communication formula (docs/formulas.md).

The built-in modes — ``none``, ``1d`` (Megatron-LM), ``2d`` (SUMMA/Optimus), ``2.5d``
(Tesseract), ``3d`` — are registered at the bottom of this module. A new mode is its layout
module (a :class:`~colossal_jax.tensor.layout.TensorLayout` subclass) and one :func:`register`
call of a :class:`TensorMode` (or a subclass for a new grid shape), from here or from anywhere
else. Nothing here imports JAX: the layout is a ``"package.module:Name"`` reference imported
when a run builds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.registry import Reference, Registry, resolve


@dataclass(frozen=True)
class TensorSplit:
    """What a tensor mode on a given grid splits.

    Attributes:
      what: the split as messages name it (``2d on a 2×2 grid``).
      divisors: ``(dimension, divisor)`` pairs the model dimensions must divide by, dimensions
        named ``hidden size``, ``heads``, ``mlp width`` and ``vocab size``; one that is absent
        is not split. ``heads`` is also the head split of attention and ``vocab size`` the
        split of the embedding tables' first dimension (learned positions too).
      batch: pieces the mode itself splits the batch into (times the ``data`` axis).
    """

    what: str
    divisors: tuple[tuple[str, int], ...]
    batch: int

    def divisor(self, name: str) -> int:
        return dict(self.divisors).get(name, 1)


class GridShape(Protocol):
    """A tensor grid as the cost formulas read it (:class:`colossal_jax.tensor.cost.Grid`):
    ``p`` devices, side ``q``, depth ``d``."""

    @property
    def p(self) -> int: ...

    @property
    def q(self) -> int: ...

    @property
    def d(self) -> int: ...


@dataclass(frozen=True)
class TensorMode:
    """A tensor mode; this base class is the mode that splits nothing (``none``), and each grid
    shape refines the methods below.

    Attributes:
      name: the ``--tensor-mode`` value.
      help: one line saying what it is.
      layout: the :class:`~colossal_jax.tensor.layout.TensorLayout` subclass that runs it, a
        ``"package.module:Name"`` reference or the class itself.
      plain_jax_baseline: ``benchmarks/plain_jax_gpt.py`` mirrors it (``--baseline plain-jax``).
    """

    name: str
    help: str
    layout: Reference
    plain_jax_baseline: bool = False

    splits_tensor: ClassVar[bool] = False
    """It splits the model over the tensor axes: it needs them, and its linears have the
    collectives ``--collective-matmul`` decomposes."""
    takes_depth: ClassVar[bool] = False
    """``--tensor-depth`` chooses the depth of its grid."""

    def layout_class(self) -> type:
        """The layout class (imports JAX)."""
        return resolve(self.layout)

    def check_grid(self, r: int, c: int, d: int) -> None:
        """The grid shape it needs of tensor_row × tensor_col × tensor_depth = ``r × c × d``."""

    def factor(self, total: int, depth: int | None) -> dict[str, int]:
        """The tensor axes of the shorthand ``--mesh tensor=total`` (``depth``:
        ``--tensor-depth``), or :class:`ConfigError` naming a total that factors."""
        if total > 1:
            splitting = splitting_modes()
            raise ConfigError(
                f"--mesh tensor={total} needs --tensor-mode {'|'.join(splitting)} to say how to "
                f"split it; e.g. --mesh tensor={total} --tensor-mode {splitting[0]}"
            )
        return {"tensor_row": total}

    def split(self, r: int, c: int, d: int) -> TensorSplit:
        """What it splits on the grid ``r × c × d``."""
        return TensorSplit("no tensor split", (), 1)

    def sizes_for_head_split(self, splits: list[int], depth: int) -> str:
        """Its tensor-group sizes whose attention head split is one of ``splits``."""
        return f"tensor_mode {self.name}"

    def fit(self, n: int) -> tuple[int, int] | None:
        """The grid ``(q, d)`` it takes on exactly ``n`` devices, or None."""
        return (1, 1) if n == 1 else None

    def describe_grid(self, grid: GridShape) -> str:
        return "p=1"

    def grid_axes(self, grid: GridShape) -> dict[str, int]:
        """Tensor-axis sizes of ``grid``."""
        return {}

    def linear_elements(
        self, grid: GridShape, m: int, n: int, k: int, *, row_parallel: bool = False
    ) -> float:
        """Elements received per device by one linear ``[m, n] @ [n, k]``, forward + backward
        (docs/formulas.md §2.1); ``row_parallel``: the ``"out"`` linear of a pair."""
        return 0.0

    def layer_norm_elements(self, grid: GridShape, m: int) -> float:
        """One split LayerNorm of ``m`` tokens, forward + backward."""
        return 0.0


def _split_norm_elements(rows: float, q: int) -> float:
    """The statistics (Σx, Σx²) of ``rows`` local rows all-reduced over the ``q`` devices that
    split the hidden dimension, once forward and once backward."""
    return 2 * (2 * 2 * rows * (q - 1) / q)


@dataclass(frozen=True)
class OneD(TensorMode):
    """Megatron-LM's column/row split over the flattened tensor group of ``p`` devices."""

    splits_tensor: ClassVar[bool] = True

    def factor(self, total: int, depth: int | None) -> dict[str, int]:
        return {"tensor_row": total}

    def split(self, r: int, c: int, d: int) -> TensorSplit:
        p = r * c * d
        return TensorSplit(
            f"{self.name} tensor parallelism over {p} devices",
            (("heads", p), ("mlp width", p), ("vocab size", p)),
            1,
        )

    def sizes_for_head_split(self, splits: list[int], depth: int) -> str:
        return "tensor ∈ {" + ", ".join(map(str, splits)) + "}"

    def fit(self, n: int) -> tuple[int, int] | None:
        return (1, 1) if n > 1 else None

    def describe_grid(self, grid: GridShape) -> str:
        return f"p={grid.p}"

    def grid_axes(self, grid: GridShape) -> dict[str, int]:
        return {"tensor_row": grid.p}

    def linear_elements(
        self, grid: GridShape, m: int, n: int, k: int, *, row_parallel: bool = False
    ) -> float:
        p = grid.p
        return 2 * m * (k if row_parallel else n) * (p - 1) / p


@dataclass(frozen=True)
class TwoD(TensorMode):
    """A ``q × q`` grid (tensor_row × tensor_col): SUMMA linears, the batch split over rows."""

    splits_tensor: ClassVar[bool] = True

    def check_grid(self, r: int, c: int, d: int) -> None:
        if r != c or d != 1:
            raise ConfigError(
                f"{self.name} needs a square grid tensor_row == tensor_col and tensor_depth=1, "
                f"got tensor_row={r}, tensor_col={c}, tensor_depth={d}; e.g. "
                "tensor_row=2,tensor_col=2"
            )

    def factor(self, total: int, depth: int | None) -> dict[str, int]:
        q = math.isqrt(total)
        if q * q != total:
            raise ConfigError(
                f"tensor={total} is not a square, as {self.name} needs (q×q); {_squares(total)}"
            )
        return {"tensor_row": q, "tensor_col": q}

    def batch_pieces(self, r: int, d: int) -> int:
        """Pieces the mode splits the batch into on a grid of side ``r`` and depth ``d``."""
        return r

    def split(self, r: int, c: int, d: int) -> TensorSplit:
        return TensorSplit(
            f"{self.name} on a {r}×{r} grid",
            (("hidden size", r), ("heads", r), ("mlp width", r), ("vocab size", r)),
            self.batch_pieces(r, d),
        )

    def sizes_for_head_split(self, splits: list[int], depth: int) -> str:
        return "tensor (q×q) ∈ {" + ", ".join(str(n * n) for n in splits) + "}"

    def fit(self, n: int) -> tuple[int, int] | None:
        q = round(n**0.5)
        return (q, 1) if n > 1 and q * q == n else None

    def describe_grid(self, grid: GridShape) -> str:
        return f"q={grid.q}"

    def grid_axes(self, grid: GridShape) -> dict[str, int]:
        return {"tensor_row": grid.q, "tensor_col": grid.q}

    def linear_elements(
        self, grid: GridShape, m: int, n: int, k: int, *, row_parallel: bool = False
    ) -> float:
        q = grid.q
        return 2 * (q - 1) / q**2 * (m * n + n * k)

    def layer_norm_elements(self, grid: GridShape, m: int) -> float:
        return _split_norm_elements(m / (grid.q * grid.d), grid.q)


@dataclass(frozen=True)
class TwoP5D(TwoD):
    """``d`` stacked ``q × q`` grids (tensor_row × tensor_col × tensor_depth): the batch split
    over depth and rows, the weights replicated over depth."""

    takes_depth: ClassVar[bool] = True

    def check_grid(self, r: int, c: int, d: int) -> None:
        if r != c:
            raise ConfigError(
                f"{self.name} needs tensor_row == tensor_col (a q×q grid stacked tensor_depth "
                f"times), got tensor_row={r}, tensor_col={c}"
            )

    def factor(self, total: int, depth: int | None) -> dict[str, int]:
        d = depth or 1
        if total % d:
            raise ConfigError(f"tensor={total} is not divisible by --tensor-depth {d}")
        q = math.isqrt(total // d)
        if q * q * d != total:
            sides = [q for q in range(2, math.isqrt(total) + 1) if total % (q * q) == 0]
            fix = (
                f"--tensor-depth {total // (sides[-1] ** 2)} makes tensor={total} a "
                f"{sides[-1]}×{sides[-1]}×{total // (sides[-1] ** 2)} grid"
                if sides
                else f"use --tensor-mode 1d for tensor={total}"
            )
            raise ConfigError(
                f"tensor={total} is not q×q×{d} for any q; {self.name} needs tensor = q²·depth; "
                f"{fix}"
            )
        return {"tensor_row": q, "tensor_col": q, "tensor_depth": d}

    def batch_pieces(self, r: int, d: int) -> int:
        return r * d

    def sizes_for_head_split(self, splits: list[int], depth: int) -> str:
        sizes = ", ".join(str(n * n * depth) for n in splits)
        return f"tensor (q×q×depth, depth={depth}) ∈ {{{sizes}}}"

    def fit(self, n: int) -> tuple[int, int] | None:
        """The largest side ``q`` with a depth ``n/q² > 1``."""
        for q in range(int(n**0.5), 1, -1):
            if n % (q * q) == 0 and n // (q * q) > 1:
                return (q, n // (q * q))
        return None

    def describe_grid(self, grid: GridShape) -> str:
        return f"q={grid.q},d={grid.d}"

    def grid_axes(self, grid: GridShape) -> dict[str, int]:
        return {"tensor_row": grid.q, "tensor_col": grid.q, "tensor_depth": grid.d}

    def linear_elements(
        self, grid: GridShape, m: int, n: int, k: int, *, row_parallel: bool = False
    ) -> float:
        q, d = grid.q, grid.d
        return (
            2 * (q - 1) / (d * q**2) * m * n
            + 2 * (q - 1) / q**2 * n * k
            + 2 * (d - 1) / (d * q**2) * n * k
        )


@dataclass(frozen=True)
class ThreeD(TensorMode):
    """A ``q × q × q`` cube: the hidden dimension split ``q²`` ways, the batch ``q²`` ways."""

    splits_tensor: ClassVar[bool] = True

    def check_grid(self, r: int, c: int, d: int) -> None:
        if not (r == c == d):
            raise ConfigError(
                f"{self.name} needs a cube tensor_row == tensor_col == tensor_depth, got "
                f"{r}×{c}×{d}; e.g. tensor=8 gives 2×2×2"
            )

    def factor(self, total: int, depth: int | None) -> dict[str, int]:
        q = round(total ** (1 / 3))
        if q**3 != total:
            sides = [c for c in range(2, q + 2) if c**3 <= total and total % c**3 == 0]
            fix = (
                f"use tensor={sides[-1] ** 3} ({sides[-1]}×{sides[-1]}×{sides[-1]}), which "
                f"divides {total}"
                if sides
                else "the smallest cube is tensor=8 (2×2×2); use --tensor-mode 1d or 2d for "
                f"tensor={total}"
            )
            raise ConfigError(f"tensor={total} is not a cube, as {self.name} needs (q×q×q); {fix}")
        return {"tensor_row": q, "tensor_col": q, "tensor_depth": q}

    def split(self, r: int, c: int, d: int) -> TensorSplit:
        return TensorSplit(
            f"{self.name} on a {r}×{r}×{r} cube",
            (("hidden size", r * r), ("mlp width", r * r), ("heads", r), ("vocab size", r)),
            r * r,
        )

    def sizes_for_head_split(self, splits: list[int], depth: int) -> str:
        return "tensor (q×q×q) ∈ {" + ", ".join(str(n**3) for n in splits) + "}"

    def fit(self, n: int) -> tuple[int, int] | None:
        c = round(n ** (1 / 3))
        return (c, 1) if n > 1 and c**3 == n else None

    def describe_grid(self, grid: GridShape) -> str:
        return f"q={grid.q}"

    def grid_axes(self, grid: GridShape) -> dict[str, int]:
        return {"tensor_row": grid.q, "tensor_col": grid.q, "tensor_depth": grid.q}

    def linear_elements(
        self, grid: GridShape, m: int, n: int, k: int, *, row_parallel: bool = False
    ) -> float:
        q = grid.q
        return 2 * (q - 1) / q**3 * (m * n + n * k + m * k)

    def layer_norm_elements(self, grid: GridShape, m: int) -> float:
        return _split_norm_elements(m / (grid.q * grid.q), grid.q)


TABLE: Registry[TensorMode] = Registry("tensor mode", "--tensor-mode")
"""Every tensor mode, by name, in registration order."""
register = TABLE.register
unregister = TABLE.unregister


def tensor_mode(name: str) -> TensorMode:
    """The registered mode ``name``; :class:`ConfigError` names the registered ones."""
    return TABLE.get(name)


def splitting_modes() -> tuple[str, ...]:
    """The names of the modes that split the model (all but ``none``)."""
    return tuple(TABLE.names(lambda mode: mode.splits_tensor))


def takes_depth(name: str) -> bool:
    """Whether ``--tensor-depth`` applies to the mode ``name`` (False for an unknown name)."""
    mode = TABLE.find(name)
    return mode is not None and mode.takes_depth


register(
    TensorMode(
        "none",
        "no tensor parallelism: every device holds the whole model",
        "colossal_jax.tensor.replicated:ReplicatedLayout",
        plain_jax_baseline=True,
    )
)
register(
    OneD(
        "1d",
        "Megatron-LM: column/row-split linears over the flattened tensor group",
        "colossal_jax.tensor.one_d:OneDLayout",
        plain_jax_baseline=True,
    )
)
register(
    TwoD(
        "2d",
        "SUMMA/Optimus on a q×q grid: weights, activations and the batch split",
        "colossal_jax.tensor.two_d:TwoDLayout",
        plain_jax_baseline=True,
    )
)
register(
    TwoP5D(
        "2.5d",
        "Tesseract: depth stacked q×q grids sharing the weights",
        "colossal_jax.tensor.two_p5d:TwoP5DLayout",
    )
)
register(
    ThreeD(
        "3d",
        "a q×q×q cube: the hidden dimension split q² ways",
        "colossal_jax.tensor.three_d:ThreeDLayout",
    )
)


def _squares(total: int) -> str:
    """What to use instead of ``tensor=total`` for a q×q grid: the largest square that divides
    it (it fits the devices ``total`` was meant to), or 2.5d / 1d."""
    sides = [q for q in range(2, math.isqrt(total) + 1) if total % (q * q) == 0]
    if not sides:
        return f"use --tensor-mode 1d for tensor={total}"
    q = sides[-1]
    depth = total // (q * q)
    also = f", or --tensor-mode 2.5d --tensor-depth {depth} ({q}×{q}×{depth})" if depth > 1 else ""
    return f"use tensor={q * q} ({q}×{q}), which divides {total}{also}"
