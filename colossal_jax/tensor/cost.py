"""Closed-form communication volume of the tensor-parallel modes (docs/formulas.md).

Elements received per device, forward + backward, with autodiff keeping gathered operands as
residuals; multiply by the dtype size for bytes. ``M`` = tokens, ``N`` → ``K`` the linear's
input and output widths.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    """A tensor-parallel grid: ``q`` the side, ``d`` the depth (2.5D), ``p`` the device count."""

    mode: str
    p: int
    q: int = 1
    d: int = 1

    def describe(self) -> str:
        if self.mode == "1d":
            return f"p={self.p}"
        if self.mode == "2d":
            return f"q={self.q}"
        if self.mode == "2.5d":
            return f"q={self.q},d={self.d}"
        if self.mode == "3d":
            return f"q={self.q}"
        return "p=1"

    def mesh(self) -> dict[str, int]:
        """Tensor-axis sizes of this grid."""
        if self.mode == "1d":
            return {"tensor_row": self.p}
        if self.mode == "2d":
            return {"tensor_row": self.q, "tensor_col": self.q}
        if self.mode == "2.5d":
            return {"tensor_row": self.q, "tensor_col": self.q, "tensor_depth": self.d}
        if self.mode == "3d":
            return {"tensor_row": self.q, "tensor_col": self.q, "tensor_depth": self.q}
        return {}


def grids(n: int) -> list[Grid]:
    """Every mode that fits ``n`` devices exactly, with its grid (2.5D: the largest side q with
    a depth d = n/q² > 1)."""
    if n == 1:
        return [Grid("none", 1)]
    out = [Grid("1d", n)]
    q = round(n**0.5)
    if q * q == n:
        out.append(Grid("2d", n, q=q))
    for q in range(int(n**0.5), 1, -1):
        if n % (q * q) == 0 and n // (q * q) > 1:
            out.append(Grid("2.5d", n, q=q, d=n // (q * q)))
            break
    c = round(n ** (1 / 3))
    if c**3 == n:
        out.append(Grid("3d", n, q=c))
    return out


def linear_elements(grid: Grid, m: int, n: int, k: int, *, row_parallel: bool = False) -> float:
    """One linear ``[m, n] @ [n, k]``, forward + backward (docs/formulas.md §2.1). For 1D,
    ``row_parallel`` picks the row (all-reduce of the output) rather than the column form."""
    p, q, d = grid.p, grid.q, grid.d
    if grid.mode == "none":
        return 0.0
    if grid.mode == "1d":
        return 2 * m * (k if row_parallel else n) * (p - 1) / p
    if grid.mode == "2d":
        return 2 * (q - 1) / q**2 * (m * n + n * k)
    if grid.mode == "2.5d":
        return (
            2 * (q - 1) / (d * q**2) * m * n
            + 2 * (q - 1) / q**2 * n * k
            + 2 * (d - 1) / (d * q**2) * n * k
        )
    if grid.mode == "3d":
        return 2 * (q - 1) / q**3 * (m * n + n * k + m * k)
    raise ValueError(f"unknown tensor mode {grid.mode!r}")


def layer_norm_elements(grid: Grid, m: int) -> float:
    """One split LayerNorm, forward + backward: the statistics (Σx, Σx²) of the local rows are
    all-reduced over the axes splitting the hidden dimension, once forward and once backward."""
    if grid.mode in ("none", "1d"):
        return 0.0
    q = grid.q
    rows = m / (q * grid.d) if grid.mode in ("2d", "2.5d") else m / (q * q)
    return 2 * (2 * 2 * rows * (q - 1) / q)


def mlp_elements(grid: Grid, m: int, h: int, width: int) -> float:
    """The MLP block ``h → width → h`` (both linears; bias and GeLU excluded)."""
    return linear_elements(grid, m, h, width) + linear_elements(
        grid, m, width, h, row_parallel=True
    )


def layer_elements(grid: Grid, m: int, h: int, width: int) -> float:
    """One pre-LN transformer layer: Q, K, V and output projections, the MLP, two LayerNorms.
    Q, K and V read the same input in one kernel (``linears``): their input is gathered once and
    its gradient reduced once, so together they cost one linear ``h → 3h``. Attention itself is
    local to each device's heads in every tensor mode."""
    qkv = linear_elements(grid, m, h, 3 * h)
    out = linear_elements(grid, m, h, h, row_parallel=True)
    return qkv + out + mlp_elements(grid, m, h, width) + 2 * layer_norm_elements(grid, m)
