"""What each tensor mode splits: the model dimensions it divides, its head split and the batch
pieces it adds (:class:`TensorSplit`), with the rules that check a model against them.

The layouts (which own the specs) and these numbers are kept in step by
``tests/test_tensor_kernels.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from colossal_jax.config.errors import ConfigError

if TYPE_CHECKING:
    from colossal_jax.config.schema import ParallelConfig


def _near(x: int, candidates: list[int]) -> list[int]:
    below = [c for c in candidates if c < x]
    above = [c for c in candidates if c > x]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


# ---- tensor split: what each mode divides -------------------------------------------------------


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


def tensor_split(mode: str, r: int = 1, c: int = 1, d: int = 1) -> TensorSplit:
    """The :class:`TensorSplit` of ``mode`` on tensor_row × tensor_col × tensor_depth =
    ``r × c × d``. The layouts (which own the specs) and these numbers are kept in step by
    ``tests/test_tensor_kernels.py``."""
    if mode == "1d":
        p = r * c * d
        return TensorSplit(
            f"1d tensor parallelism over {p} devices",
            (("heads", p), ("mlp width", p), ("vocab size", p)),
            1,
        )
    if mode in ("2d", "2.5d"):
        return TensorSplit(
            f"{mode} on a {r}×{r} grid",
            (("hidden size", r), ("heads", r), ("mlp width", r), ("vocab size", r)),
            r * (d if mode == "2.5d" else 1),
        )
    if mode == "3d":
        return TensorSplit(
            f"3d on a {r}×{r}×{r} cube",
            (("hidden size", r * r), ("mlp width", r * r), ("heads", r), ("vocab size", r)),
            r * r,
        )
    return TensorSplit("no tensor split", (), 1)


def split_of(par: ParallelConfig) -> TensorSplit:
    """The :class:`TensorSplit` of a ParallelConfig's tensor mode and grid."""
    return tensor_split(par.tensor_mode, par.tensor_row, par.tensor_col, par.tensor_depth)


def batch_shards(par: ParallelConfig) -> int:
    """How many pieces the batch dimension is split into: ``data`` times the tensor mode's own
    (equal to the layout's ``batch_divisor()``)."""
    return par.data * split_of(par).batch


def model_divisors(par: ParallelConfig) -> tuple[tuple[str, int], ...]:
    """``(dimension, divisor)`` pairs the model must satisfy under ``par``'s tensor mode."""
    return split_of(par).divisors


def check_split(split: TensorSplit, *, hidden: int, mlp: int, heads: int, vocab: int) -> None:
    """The model dimensions divide as ``split`` needs; the message names the first that does
    not, the split that needs it and a valid alternative."""
    if hidden % heads:
        raise ConfigError(f"hidden size {hidden} is not divisible by heads={heads}")
    values = {"hidden size": hidden, "heads": heads, "mlp width": mlp, "vocab size": vocab}
    for name, div in split.divisors:
        value = values[name]
        if value % div == 0:
            continue
        up = -(-value // div) * div
        hint = {
            "heads": f"--set model.n_head={up}",
            "vocab size": f"--set model.vocab_size={up}",
            "hidden size": f"--set model.n_embd={up} (a multiple of heads={heads} too)",
            "mlp width": f"a model.n_embd whose mlp width (mlp_ratio·n_embd) divides by {div}",
        }[name]
        raise ConfigError(
            f"{split.what} needs {name} divisible by {div}, got {value}; use {hint} or a smaller "
            "tensor split"
        )


def check_head_split(mode: str, heads: int, head_split: int) -> None:
    """Each device of a ``head_split``-way split of the attention heads holds whole heads."""
    if heads % head_split:
        raise ConfigError(
            f"{mode} splits attention heads {head_split} ways; heads={heads} is not "
            f"divisible by {head_split}"
        )


def kv_heads_of(model: Any) -> int:
    """The model's key/value heads: ``n_kv_head`` (grouped-query attention) or ``n_head``."""
    kv = getattr(model, "n_kv_head", None)
    return model.n_head if kv is None else kv


def _sizes_for_head_split(mode: str, splits: list[int], depth: int = 1) -> str:
    """Tensor-group sizes of ``mode`` whose attention head split is one of ``splits``."""
    if mode == "1d":
        return "tensor ∈ {" + ", ".join(map(str, splits)) + "}"
    if mode == "2d":
        return "tensor (q×q) ∈ {" + ", ".join(str(n * n) for n in splits) + "}"
    if mode == "2.5d":
        sizes = ", ".join(str(n * n * depth) for n in splits)
        return f"tensor (q×q×depth, depth={depth}) ∈ {{{sizes}}}"
    if mode == "3d":
        return "tensor (q×q×q) ∈ {" + ", ".join(str(n**3) for n in splits) + "}"
    return "tensor_mode none"


def check_kv_heads(mode: str, heads: int, kv_heads: int, head_split: int, depth: int = 1) -> None:
    """Grouped-query attention (Ainslie et al. 2023): ``kv_heads`` divides ``heads``, and every
    device of the ``head_split``-way head split holds whole K/V heads (``kv_heads`` divisible by
    ``head_split``; no K/V head is replicated across the tensor group). The message names the
    tensor sizes of ``mode`` that would work."""
    if kv_heads < 1 or heads % kv_heads:
        fits = [d for d in range(1, heads + 1) if heads % d == 0]
        near = _near(kv_heads, fits) if kv_heads >= 1 else [1]
        raise ConfigError(
            f"kv_heads={kv_heads} must divide heads={heads} (grouped-query attention); use "
            f"n_kv_head={' or '.join(map(str, near))}"
        )
    if kv_heads % head_split:
        ok = [n for n in range(1, kv_heads + 1) if kv_heads % n == 0]
        raise ConfigError(
            f"{mode} splits attention heads {head_split} ways, but kv_heads={kv_heads} is not "
            f"divisible by {head_split} (each device must hold whole key/value heads); use "
            f"{_sizes_for_head_split(mode, ok, depth)}, or n_kv_head divisible by {head_split}"
        )
