"""Optimizers as optax chains: AdamW, LAMB, LARS, SGD; warm-up + cosine or polynomial decay;
clipping. The variants other systems use (LAMB without bias correction, a bounded trust ratio)
are options of :class:`~colossal_jax.config.OptimConfig`; docs/large_batch.md compares them.

Weight decay (and the LAMB/LARS trust ratio) applies to matrices only: biases and layer-norm
parameters are excluded, as in You et al. (2017, 2019). Under ``jit`` with sharded parameters,
every norm below is of a whole layer's tensor (XLA inserts the cross-device reductions): a
parameter stacked over layers (:mod:`colossal_jax.layers.stack`) gets one norm, one trust ratio
and the decay rule of its rank per layer.

LARS follows the paper (You, Gitman, Ginsburg 2017, arXiv 1708.03888): the local rate is
``η_l = trust · ‖w‖ / (‖g‖ + λ‖w‖)`` and momentum accumulates ``γ_t · η_l · (g + λw)`` (the
global rate ``γ_t`` inside the momentum, as the paper's Algorithm 1). (optax.lars
divides by ``‖g + λw‖`` instead; we implement the paper's denominator, see ``scale_by_lars``.)
LAMB (You et al. 2019, arXiv 1904.00962): Adam moments with bias correction,
``r = m̂/(√v̂+ε) + λw``, update ``−η · ‖w‖/‖r‖ · r`` (ratio 1 when a norm is 0, or for excluded
parameters).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from colossal_jax.config import OptimConfig
from colossal_jax.config.optimizers import optimizer
from colossal_jax.layers.stack import is_stacked


def schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warm-up to ``cfg.lr``, then decay to ``cfg.min_lr_ratio · cfg.lr`` at
    ``total_steps``: cosine, or (``lr_schedule="poly"``) polynomial of power
    ``cfg.poly_power``, the LARS and LAMB papers' schedule."""
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.lr_schedule == "poly":
        return optax.join_schedules(
            [
                optax.linear_schedule(0.0, cfg.lr, warmup),
                optax.polynomial_schedule(
                    cfg.lr, end, cfg.poly_power, max(total_steps - warmup, 1)
                ),
            ],
            [warmup],
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=end,
    )


def schedule_values(cfg: OptimConfig, total_steps: int, start: int, stop: int) -> np.ndarray:
    """The learning rate of :func:`schedule` at steps ``[start, stop)`` as host floats, from one
    jitted call: evaluated step by step in the loop, the schedule's first call compiled its
    operations one by one (0.36 s on the CPU here, inside the second step of a run). It runs on
    the host's CPU backend: on a GPU the call queued behind the training steps in flight and
    waited for them, a stall in the overlapped loop (docs/performance.md, GPU figures)."""
    lr = schedule(cfg, total_steps)
    steps = np.arange(start, max(stop, start), dtype=np.int32)
    with jax.default_device(_host_device()):
        return np.asarray(jax.jit(jax.vmap(lr))(steps), dtype=np.float64)


def _host_device() -> jax.Device:
    """This process's first CPU device; the default device where no CPU backend is up
    (``JAX_PLATFORMS`` without ``cpu``)."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return jax.local_devices()[0]


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _layer_stacked(x: Any) -> bool:
    """Whether ``x`` (an ``nnx`` Variable of a model's state, or a plain array) stacks one tensor
    per layer on its leading dimension (:mod:`colossal_jax.layers.stack`)."""
    return _is_variable(x) and is_stacked(x)


def _array(x: Any) -> jax.Array:
    return jax.tree.leaves(x)[0] if _is_variable(x) else x


def matrix_mask(params):
    """True for parameters that take weight decay and trust ratios: matrices, rank ≥ 2 per
    layer (a layer-stacked bias ``[L, k]`` is a stack of vectors, not a matrix)."""

    def is_matrix(x):
        return jnp.ndim(_array(x)) - _layer_stacked(x) >= 2

    return jax.tree.map(is_matrix, params, is_leaf=_is_variable)


def _per_tensor(fn, updates, params):
    """``fn(g, w, norm)`` for each parameter, with ``norm(x)`` the L2 norm of each layer's tensor
    (broadcastable to ``x``): the whole tensor, or per layer for a layer-stacked parameter, so
    trust ratios are the papers' per-layer ones however the layers are stored."""

    def one(u, p):
        stacked = _layer_stacked(u) or _layer_stacked(p)

        def norm(x):
            axes = tuple(range(1, x.ndim)) if stacked else None
            return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes, keepdims=True))

        new = fn(_array(u), _array(p), norm)
        return jax.tree.map(lambda _: new, u) if _is_variable(u) else new

    return jax.tree.map(one, updates, params, is_leaf=_is_variable)


def _bounded(ratio: jax.Array, max_ratio: float) -> jax.Array:
    return jnp.minimum(ratio, max_ratio) if max_ratio > 0 else ratio


def scale_by_layer_trust_ratio(max_ratio: float = 0.0) -> optax.GradientTransformation:
    """LAMB's trust ratio ``‖w‖/‖u‖`` per layer (``optax.scale_by_trust_ratio`` takes one
    ratio per array, which for a layer-stacked parameter would be one ratio for all layers);
    1 where either norm is 0; at most ``max_ratio`` where that is above 0."""

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_by_layer_trust_ratio needs the parameters")

        def one(u, w, norm):
            w_norm, u_norm = norm(w), norm(u)
            ratio = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
            return (u * _bounded(ratio, max_ratio)).astype(u.dtype)

        return _per_tensor(one, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def scale_by_uncorrected_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """``m/(√v+ε)`` from Adam's moments without bias correction (Colossal-AI's ``Lamb``
    default); the state is ``optax.scale_by_adam``'s, so checkpoints carry over."""

    def init_fn(params):
        return optax.scale_by_adam(b1, b2, eps).init(params)

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        count = optax.safe_increment(state.count)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


class LarsState(NamedTuple):
    pass


def scale_by_lars(
    weight_decay: float, trust: float, eps: float = 0.0, max_ratio: float = 0.0
) -> optax.GradientTransformation:
    """Per tensor: ``g ← trust · ‖w‖ / (‖g‖ + λ‖w‖) · (g + λw)`` (the LARS paper's local rate).

    The ratio is 1 (``g ← g + λw``) where ``‖w‖`` or ``‖g‖`` is 0, and at most ``max_ratio``
    where that is above 0. Apply under ``optax.masked`` to exclude biases and norms.
    """

    def init_fn(params):
        del params
        return LarsState()

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_by_lars needs the parameters")

        def one(g, w, norm):
            w_norm, g_norm = norm(w), norm(g)
            ratio = trust * w_norm / (g_norm + weight_decay * w_norm + eps)
            ratio = jnp.where((w_norm > 0) & (g_norm > 0), _bounded(ratio, max_ratio), 1.0)
            return (ratio * (g + weight_decay * w)).astype(g.dtype)

        return _per_tensor(one, updates, params), state

    return optax.GradientTransformation(init_fn, update_fn)


# ---- the registered optimizers' transforms (colossal_jax.config.optimizers) ---------------------


def adamw(cfg: OptimConfig, lr: optax.Schedule) -> list[optax.GradientTransformation]:
    """AdamW, decaying matrices only."""
    return [
        optax.adamw(
            lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=matrix_mask
        )
    ]


def lamb(cfg: OptimConfig, lr: optax.Schedule) -> list[optax.GradientTransformation]:
    """LAMB: Adam moments (bias-corrected unless ``cfg.bias_correction`` is off), decay, the
    per-layer trust ratio (matrices only; bounded by ``cfg.trust_ratio_max`` where set)."""
    if cfg.bias_correction:
        moments = optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    else:
        moments = scale_by_uncorrected_adam(cfg.b1, cfg.b2, cfg.eps)
    return [
        moments,
        optax.add_decayed_weights(cfg.weight_decay, mask=matrix_mask),
        optax.masked(scale_by_layer_trust_ratio(cfg.trust_ratio_max), matrix_mask),
        optax.scale_by_learning_rate(lr),
    ]


def lars(cfg: OptimConfig, lr: optax.Schedule) -> list[optax.GradientTransformation]:
    """LARS (the paper's Algorithm 1): the local rate (matrices only; bounded by
    ``cfg.trust_ratio_max`` where set) times the global rate, then momentum ``b1`` on that
    scaled update: ``v ← b1·v + γ_t·η_l·(g + λw)``, ``w ← w − v``."""
    local_rate = scale_by_lars(cfg.weight_decay, cfg.lars_trust, max_ratio=cfg.trust_ratio_max)
    return [
        optax.masked(local_rate, matrix_mask),
        optax.scale_by_learning_rate(lr),
        optax.trace(decay=cfg.b1),
    ]


def sgd(cfg: OptimConfig, lr: optax.Schedule) -> list[optax.GradientTransformation]:
    """SGD with decay on matrices, and momentum ``b1`` when it is above 0."""
    return [
        optax.add_decayed_weights(cfg.weight_decay, mask=matrix_mask),
        optax.sgd(lr, momentum=cfg.b1 or None),
    ]


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """The optax chain for ``cfg``: clipping, then the registered optimizer ``cfg.name``'s
    transforms (:mod:`colossal_jax.config.optimizers`) with the schedule."""
    transform = optimizer(cfg.name).transform_function()
    parts: list[optax.GradientTransformation] = []
    if cfg.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts += transform(cfg, schedule(cfg, total_steps))
    return optax.chain(*parts)
