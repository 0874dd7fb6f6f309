"""What each tensor mode splits: the model dimensions it divides, its head split and the batch
pieces it adds (:class:`TensorSplit`, each mode's own
:meth:`~colossal_jax.config.tensor_modes.TensorMode.split`), with the rules that check a model
against them.

The layouts (which own the specs) and these numbers are kept in step by
``tests/test_tensor_kernels.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.tensor_modes import TensorSplit, tensor_mode

if TYPE_CHECKING:
    from colossal_jax.config.schema import ParallelConfig


def _near(x: int, candidates: list[int]) -> list[int]:
    below = [c for c in candidates if c < x]
    above = [c for c in candidates if c > x]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


# ---- tensor split: what each mode divides -------------------------------------------------------


def tensor_split(mode: str, r: int = 1, c: int = 1, d: int = 1) -> TensorSplit:
    """The :class:`TensorSplit` of ``mode`` on tensor_row × tensor_col × tensor_depth =
    ``r × c × d`` (:meth:`~colossal_jax.config.tensor_modes.TensorMode.split`). The layouts (which
    own the specs) and these numbers are kept in step by ``tests/test_tensor_kernels.py``."""
    return tensor_mode(mode).split(r, c, d)


def split_of(par: ParallelConfig) -> TensorSplit:
    """The :class:`TensorSplit` of a ParallelConfig's tensor mode and grid."""
    return tensor_split(par.tensor_mode, par.tensor_row, par.tensor_col, par.tensor_depth)


def param_split(par: ParallelConfig) -> int:
    """How many pieces the tensor mode cuts the parameters into: its whole group, except a
    mode with a depth (2.5D), whose depth layers each hold the same ``q × q`` blocks."""
    if tensor_mode(par.tensor_mode).takes_depth:
        return par.tensor_size // par.tensor_depth
    return par.tensor_size


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
            f"{tensor_mode(mode).sizes_for_head_split(ok, depth)}, or n_kv_head divisible by "
            f"{head_split}"
        )
