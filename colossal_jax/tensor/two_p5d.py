"""Mode ``2.5d``: Tesseract (Wang et al. 2021, arXiv 2105.14500) — ``d`` stacked 2D grids.

Axes ``r = tensor_row``, ``c = tensor_col``, ``d = tensor_depth``; p = q²·d. The batch is split
over ``(d, r)`` (each depth layer owns a slice of the tokens), the hidden dimension over ``c``;
weights are ``W[N/q, K/q]`` over ``(r, c)`` and *replicated over depth*, so each depth layer runs
the 2D SUMMA linear of :mod:`colossal_jax.tensor.two_d` on its own tokens and the weight gradients
are summed over ``d``. The weight block is marked varying over ``d`` before it is gathered, so that
all-reduce runs on the ``[N/q, K/q]`` block rather than on the q-times larger gathered one.

Communication per device, one linear forward + backward:
``2·(q−1)/(d·q²)·M·N + 2·(q−1)/q²·N·K + 2·(d−1)/(d·q²)·N·K`` elements. Memory per device:
weights ``d·N·K/p``, activations ``M·N/p``.
"""

from __future__ import annotations

from colossal_jax.tensor.two_d import TwoDLayout


class TwoP5DLayout(TwoDLayout):
    mode = "2.5d"
    depth = ("tensor_depth",)
