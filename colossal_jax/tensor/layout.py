"""The contract every tensor-parallel mode implements.

A *layout* owns how the transformer's arrays are split over the tensor axes of the mesh and the
kernels that compute on them. The library's layers (``colossal_jax/layers``) only ever call the
methods below, so a model is written once and every mode (``none``, ``1d``, ``2d``, ``2.5d``,
``3d``) plugs in underneath.

Arrays are *global* (jit-level) arrays; a layout method wraps its own ``jax.shard_map`` with the
in/out specs of its mode, so callers never see per-device blocks.

Shapes (global):
- residual stream ``x``: ``[b, s, h]`` in :meth:`TensorLayout.residual_spec`.
- output of an ``"in"`` linear (QKV, MLP up, LM head): ``[b, s, k]`` in
  :meth:`TensorLayout.wide_spec`; the input of an ``"out"`` linear is in the same spec.
- weights ``[n, k]`` in :meth:`TensorLayout.weight_spec` (``kind`` ``"in"``: ``n = h``;
  ``"out"``: ``k = h``), biases ``[k]`` in :meth:`TensorLayout.bias_spec`.
- layer-norm and RMSNorm scale/bias ``[h]`` in :meth:`TensorLayout.norm_spec`; embedding table
  ``[V, h]`` in :meth:`TensorLayout.embedding_spec` (its spec is the lookup's; a tied LM head
  reads the same table through :meth:`TensorLayout.tied_logits`).
- tokens, targets, positions, loss weights: ``[b, s]`` in :meth:`TensorLayout.token_spec`
  (batch split like the residual stream's batch, replicated over the hidden-splitting axes).

Attention masks are chosen by the model and need no extra array:

- ``causal`` (a Python bool of :meth:`TensorLayout.attention`, passed to every attention kernel)
  masks keys at later positions (``k_pos > q_pos``);
- **padding** is a *negative position*: every kernel masks keys with ``k_pos < 0`` for every
  query, causal or not. Positions already travel with K/V (around the ring, through the Ulysses
  all-gather, into pipeline stages), so the mask does too. Consumers of positions other than the
  mask clamp them to ``>= 0`` (RoPE rotates padding as position 0; a learned position table
  looks up row 0). A padding query attends to no key under the causal mask and outputs zeros;
  padding tokens should carry loss weight 0.

Kernel modules import nothing from the rest of the package but :mod:`colossal_jax.config`, whose
functions they call where a kernel needs a configuration rule.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from colossal_jax.config.choices import TENSOR_AXES
from colossal_jax.config.tensor_split import (
    TensorSplit,
    check_head_split,
    check_kv_heads,
    check_split,
    tensor_split,
)

LinearKind = Literal["in", "out"]
"""``"in"``: hidden -> wide (QKV projections, MLP up-projection, LM head; Megatron *column*).
``"out"``: wide -> hidden (attention output, MLP down-projection; Megatron *row*)."""

AxisNames = tuple[str, ...]

LocalAttention = Callable[..., jax.Array]
"""``f(q, k, v, q_pos, k_pos, *, causal: bool) -> out``, run *inside* a ``shard_map``: per-device
blocks ``q: [b, s_local, heads_local, head_dim]``, ``k, v: [b, s_local, kv_heads_local,
head_dim]`` (``kv_heads_local`` dividing ``heads_local``: grouped-query attention, query head
``i`` reads key/value head ``i // (heads_local / kv_heads_local)``) and integer positions
``[b, s_local]`` (negative: padding, masked as a key for every query); returns
``[b, s_local, heads_local, head_dim]``. ``causal`` masks keys with ``k_pos > q_pos``. It may use
collectives over the sequence axis (ring attention, Ulysses), so the layout's ``shard_map`` must
include that axis."""


@dataclass(frozen=True)
class ActivationAxes:
    """Mesh axes that split activations independently of the tensor mode.

    Attributes:
      batch: axes that split the batch dimension outside the tensor group (usually ``("data",)``);
        the tensor mode may add its own axes after these.
      seq: the axis that splits the sequence dimension (``None`` for no sequence split).
    """

    batch: AxisNames = ("data",)
    seq: str | None = "seq"


_PER_STAGE_BRANCHES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "colossal_jax_per_stage_branches", default=False
)


@contextlib.contextmanager
def per_stage_branches() -> Iterator[None]:
    """Mark code traced inside as running in per-stage branches (the pipeline executor's
    ``lax.switch``): different devices of the program run different branches there."""
    token = _PER_STAGE_BRANCHES.set(True)
    try:
        yield
    finally:
        _PER_STAGE_BRANCHES.reset(token)


def in_per_stage_branches() -> bool:
    return _PER_STAGE_BRANCHES.get()


def in_manual_region() -> bool:
    """True inside a ``shard_map`` that made every mesh axis manual (the pipeline's per-device
    program), where arrays are already each device's blocks."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return False
    return all(t == jax.sharding.AxisType.Manual for t in mesh.axis_types)


def sharded(body: Callable, mesh: Mesh, in_specs, out_specs) -> Callable:
    """``jax.shard_map(body, ...)`` for global arrays; ``body`` itself inside a region where every
    mesh axis is already manual (:func:`in_manual_region`), whose arrays are the per-device blocks
    of these very specs — every kernel consumes the layout its predecessor produced, so the
    blocks chain unchanged and the kernels run as they are inside the pipeline."""
    if in_manual_region():
        return body
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def spec_axes(*names: str | None) -> str | AxisNames | None:
    """A PartitionSpec entry for a dimension split over ``names`` (``None`` entries dropped)."""
    kept = tuple(n for n in names if n is not None)
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else kept


def vocab_parallel_cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, vocab_axes: AxisNames
) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy over a vocabulary split across ``vocab_axes`` (Megatron-LM, Shoeybi 2019).

    Runs inside a ``shard_map``. ``logits: [..., V_local]`` holds this device's contiguous slice
    of the vocabulary (slice index = linear index over ``vocab_axes``); ``targets`` hold *global*
    token ids. Three reductions over ``vocab_axes``: max, target logit, sum of exp — each of
    ``[...]`` elements, so communication is 3 all-reduces of the token count, never the logits.

    Returns ``(sum of weighted losses, sum of weights)`` over the local tokens (not reduced over
    the batch axes).
    """
    logits = logits.astype(jnp.float32)
    v_local = logits.shape[-1]
    if vocab_axes:
        shard = jax.lax.axis_index(vocab_axes)
        # the max is only a numerical shift: no gradient needs to flow through it.
        m = jax.lax.pmax(jnp.max(jax.lax.stop_gradient(logits), axis=-1), vocab_axes)
    else:
        shard = 0
        m = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    local_t = targets - shard * v_local
    in_range = (local_t >= 0) & (local_t < v_local)
    picked = jnp.take_along_axis(logits, jnp.clip(local_t, 0, v_local - 1)[..., None], axis=-1)
    target_logit = jnp.where(in_range, picked[..., 0], 0.0)
    sum_exp = jnp.sum(jnp.exp(logits - m[..., None]), axis=-1)
    if vocab_axes:
        target_logit = jax.lax.psum(target_logit, vocab_axes)
        sum_exp = jax.lax.psum(sum_exp, vocab_axes)
    loss = jnp.log(sum_exp) + m - target_logit
    w = weights.astype(jnp.float32)
    return jnp.sum(loss * w), jnp.sum(w)


class TensorLayout(abc.ABC):
    """How one tensor-parallel mode splits and computes a transformer.

    Subclasses set :attr:`mode` and implement the abstract methods. Constructors validate nothing
    expensive; :meth:`validate` checks model dimensions against the grid with the rule of
    :mod:`colossal_jax.config` and raises its ``ConfigError`` (a ``ValueError``) naming the bad
    value and what would divide.
    """

    mode: str = ""

    def __init__(self, mesh: Mesh, activation_axes: ActivationAxes = ActivationAxes()):
        self.mesh = mesh
        self.act = activation_axes
        for name in (*activation_axes.batch, activation_axes.seq):
            if name is not None and name not in mesh.shape:
                raise ValueError(f"axis {name!r} is not in the mesh axes {tuple(mesh.shape)}")

    # ---- sizes -------------------------------------------------------------------------------
    def axis_size(self, names: str | AxisNames | None) -> int:
        if names is None:
            return 1
        if isinstance(names, str):
            names = (names,)
        size = 1
        for n in names:
            size *= self.mesh.shape[n]
        return size

    @property
    def seq_axis(self) -> str | None:
        return self.act.seq

    @abc.abstractmethod
    def batch_divisor(self) -> int:
        """How many pieces the batch dimension is split into (data axes times the mode's own)."""

    def tensor_split(self) -> TensorSplit:
        """What this mode divides on this mesh
        (:func:`colossal_jax.config.tensor_split.tensor_split`)."""
        sizes = (self.mesh.shape.get(a, 1) for a in TENSOR_AXES)
        return tensor_split(self.mode, *sizes)

    def validate(
        self, *, hidden: int, mlp: int, heads: int, vocab: int, kv_heads: int | None = None
    ) -> None:
        """Raise ``ValueError`` if the model dimensions do not fit this layout's grid."""
        split = self.tensor_split()
        check_split(split, hidden=hidden, mlp=mlp, heads=heads, vocab=vocab)
        if kv_heads is not None:
            depth = self.mesh.shape.get("tensor_depth", 1)
            check_kv_heads(self.mode, heads, kv_heads, split.divisor("heads"), depth)

    # ---- specs -------------------------------------------------------------------------------
    @abc.abstractmethod
    def residual_spec(self) -> P: ...

    @abc.abstractmethod
    def wide_spec(self) -> P: ...

    @abc.abstractmethod
    def token_spec(self) -> P: ...

    @abc.abstractmethod
    def weight_spec(self, kind: LinearKind) -> P: ...

    @abc.abstractmethod
    def bias_spec(self, kind: LinearKind) -> P: ...

    @abc.abstractmethod
    def norm_spec(self) -> P: ...

    @abc.abstractmethod
    def embedding_spec(self) -> P: ...

    # ---- kernels ------------------------------------------------------------------------------
    @abc.abstractmethod
    def linear(
        self, x: jax.Array, w: jax.Array, b: jax.Array | None, kind: LinearKind
    ) -> jax.Array:
        """``x @ w + b``: residual -> wide for ``"in"``, wide -> residual for ``"out"``."""

    def linears(
        self,
        x: jax.Array,
        ws: list[jax.Array],
        bs: list[jax.Array] | None,
        kind: LinearKind,
    ) -> list[jax.Array]:
        """Several linears reading the same ``x`` (Q, K, V). Layouts that move data override
        this to gather ``x`` once and reduce its gradient once."""
        if bs is None:
            return [self.linear(x, w, None, kind) for w in ws]
        return [self.linear(x, w, b, kind) for w, b in zip(ws, bs, strict=True)]

    def residual_to_wide(self, x: jax.Array) -> jax.Array:
        """The residual-layout ``x: [b, s, h]`` re-cut to the wide layout (its hidden dimension
        split as an ``"out"`` linear's input), so a hidden-to-hidden linear
        (:class:`colossal_jax.layers.HiddenDense`: the ``"out"`` kernel on it) maps the
        residual stream to itself. Where the two layouts are one (no tensor split, 2D, 2.5D)
        this is ``x`` itself: no communication, no copy; 1D and 3D override it."""
        if self.residual_spec() != self.wide_spec():
            raise NotImplementedError(
                f"tensor mode {self.mode!r} splits the residual ({self.residual_spec()}) and the "
                f"wide activations ({self.wide_spec()}) differently but has no residual_to_wide"
            )
        return x

    @abc.abstractmethod
    def layer_norm(self, x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
        """LayerNorm over the (possibly split) hidden dimension of a residual-layout ``x``."""

    @abc.abstractmethod
    def rms_norm(self, x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
        """RMSNorm over the (possibly split) hidden dimension of a residual-layout ``x``; ``scale``
        in :meth:`norm_spec`."""

    @abc.abstractmethod
    def embed(self, tokens: jax.Array, table: jax.Array) -> jax.Array:
        """``table[tokens]``: token ids ``[b, s]`` -> residual-layout ``[b, s, h]``."""

    @abc.abstractmethod
    def tied_logits(self, x: jax.Array, table: jax.Array) -> jax.Array:
        """``x @ table.T``: the LM head that reuses the token-embedding ``table`` (``[V, h]`` in
        :meth:`embedding_spec`) on a residual-layout ``x``; returns wide-layout logits
        ``[b, s, V]`` (vocabulary split as an ``"in"`` linear's output, ready for
        :meth:`cross_entropy`). The table's gradient from this use adds to the lookup's, as
        both read the one parameter."""

    def attention(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        positions: jax.Array,
        *,
        heads: int,
        local_attention: LocalAttention,
        causal: bool = True,
        kv_heads: int | None = None,
    ) -> jax.Array:
        """Multi-head attention on wide-layout ``q: [b, s, heads*head_dim]`` and
        ``k, v: [b, s, kv_heads*head_dim]`` (``kv_heads`` dividing ``heads``: grouped-query
        attention; ``None``: ``heads``).

        Splits the last dimensions into heads *locally* (each device's wide slice holds whole
        query and whole key/value heads, :func:`colossal_jax.config.tensor_split.check_kv_heads`),
        calls
        ``local_attention(..., causal=causal)`` inside one ``shard_map`` that also covers the
        sequence axis, and returns the wide-layout ``[b, s, heads*head_dim]`` result. Keys at
        negative positions (padding) are masked for every query.

        The wide spec splits the hidden dimension ``head_split`` ways (the product of the axes of
        its last entry), so each device holds ``heads // head_split`` whole query heads and
        ``kv_heads // head_split`` whole key/value heads.
        """
        wide = self.wide_spec()
        tokens = self.token_spec()
        head_split = self.axis_size(wide[2])
        check_head_split(self.mode, heads, head_split)
        kv_heads = heads if kv_heads is None else kv_heads
        depth = self.mesh.shape.get("tensor_depth", 1)
        check_kv_heads(self.mode, heads, kv_heads, head_split, depth)
        local_heads, local_kv = heads // head_split, kv_heads // head_split

        def body(q, k, v, pos):
            b, s, hd = q.shape
            d = hd // local_heads
            kv_shape = (b, s, local_kv, d)
            out = local_attention(
                q.reshape(b, s, local_heads, d),
                k.reshape(kv_shape),
                v.reshape(kv_shape),
                pos,
                pos,
                causal=causal,
            )
            return out.reshape(b, s, hd)

        return sharded(body, self.mesh, (wide, wide, wide, tokens), wide)(q, k, v, positions)

    @abc.abstractmethod
    def cross_entropy(
        self, logits: jax.Array, targets: jax.Array, weights: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Global ``(sum of weighted token losses, sum of weights)`` for wide-layout logits
        ``[b, s, V]`` (vocabulary split as the wide dimension). Both results are replicated."""
