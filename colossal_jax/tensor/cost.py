"""Closed-form communication volume of the tensor-parallel modes (docs/formulas.md), composed
from each registered mode's formulas (:mod:`colossal_jax.config.tensor_modes`).

Elements received per device, forward + backward, with autodiff keeping gathered operands as
residuals; multiply by the dtype size for bytes. ``M`` = tokens, ``N`` → ``K`` the linear's
input and output widths.
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_jax.config import tensor_modes
from colossal_jax.config.tensor_modes import tensor_mode


@dataclass(frozen=True)
class Grid:
    """A tensor-parallel grid of the registered mode ``mode``: ``q`` the side, ``d`` the depth
    (2.5D), ``p`` the device count."""

    mode: str
    p: int
    q: int = 1
    d: int = 1

    def describe(self) -> str:
        return tensor_mode(self.mode).describe_grid(self)

    def mesh(self) -> dict[str, int]:
        """Tensor-axis sizes of this grid."""
        return tensor_mode(self.mode).grid_axes(self)


def grids(n: int) -> list[Grid]:
    """Every registered mode that fits ``n`` devices exactly, with its grid
    (:meth:`~colossal_jax.config.tensor_modes.TensorMode.fit`; 2.5D: the largest side q with a
    depth d = n/q² > 1)."""
    out = []
    for mode in tensor_modes.TABLE:
        fit = mode.fit(n)
        if fit is not None:
            out.append(Grid(mode.name, n, q=fit[0], d=fit[1]))
    return out


def linear_elements(grid: Grid, m: int, n: int, k: int, *, row_parallel: bool = False) -> float:
    """One linear ``[m, n] @ [n, k]``, forward + backward (docs/formulas.md §2.1), by the mode's
    formula (:meth:`~colossal_jax.config.tensor_modes.TensorMode.linear_elements`). For 1D,
    ``row_parallel`` picks the row (all-reduce of the output) rather than the column form."""
    return tensor_mode(grid.mode).linear_elements(grid, m, n, k, row_parallel=row_parallel)


def layer_norm_elements(grid: Grid, m: int) -> float:
    """One split LayerNorm, forward + backward: the statistics (Σx, Σx²) of the local rows are
    all-reduced over the axes splitting the hidden dimension, once forward and once backward."""
    return tensor_mode(grid.mode).layer_norm_elements(grid, m)


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
