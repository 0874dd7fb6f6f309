"""Optimizers as optax chains: AdamW, LAMB, LARS, SGD; warm-up + cosine schedule; clipping.

Weight decay (and the LAMB/LARS trust ratio) applies to matrices only: biases and layer-norm
parameters are excluded, as in You et al. (2017, 2019). Under ``jit`` with sharded parameters,
every norm below is of the whole tensor (XLA inserts the cross-device reductions).

LARS follows the paper (You, Gitman, Ginsburg 2017, arXiv 1708.03888): the local rate is
``η_l = trust · ‖w‖ / (‖g‖ + λ‖w‖)`` and momentum accumulates ``η_l · (g + λw)``. (optax.lars
divides by ``‖g + λw‖`` instead; we implement the paper's denominator, see ``scale_by_lars``.)
LAMB (You et al. 2019, arXiv 1904.00962): Adam moments with bias correction,
``r = m̂/(√v̂+ε) + λw``, update ``−η · ‖w‖/‖r‖ · r`` (ratio 1 when a norm is 0, or for excluded
parameters).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from colossal_jax.config import OptimConfig


def schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warm-up to ``cfg.lr``, then cosine decay to ``cfg.min_lr_ratio · cfg.lr``."""
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=cfg.lr * cfg.min_lr_ratio,
    )


def matrix_mask(params):
    """True for parameters that take weight decay and trust ratios (rank ≥ 2)."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


class LarsState(NamedTuple):
    pass


def scale_by_lars(
    weight_decay: float, trust: float, eps: float = 0.0
) -> optax.GradientTransformation:
    """Per tensor: ``g ← trust · ‖w‖ / (‖g‖ + λ‖w‖) · (g + λw)`` (the LARS paper's local rate).

    The ratio is 1 (``g ← g + λw``) where ``‖w‖`` or ``‖g‖`` is 0. Apply under ``optax.masked``
    to exclude biases and norms.
    """

    def init_fn(params):
        del params
        return LarsState()

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_by_lars needs the parameters")

        def one(g, w):
            w_norm = jnp.linalg.norm(w)
            g_norm = jnp.linalg.norm(g)
            ratio = trust * w_norm / (g_norm + weight_decay * w_norm + eps)
            ratio = jnp.where((w_norm > 0) & (g_norm > 0), ratio, 1.0)
            return (ratio * (g + weight_decay * w)).astype(g.dtype)

        return jax.tree.map(one, updates, params), state

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    """The optax chain for ``cfg``: clipping, then the optimizer with its schedule."""
    lr = schedule(cfg, total_steps)
    parts: list[optax.GradientTransformation] = []
    if cfg.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    if cfg.name == "adamw":
        parts.append(
            optax.adamw(
                lr,
                b1=cfg.b1,
                b2=cfg.b2,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
                mask=matrix_mask,
            )
        )
    elif cfg.name == "lamb":
        parts += [
            optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
            optax.add_decayed_weights(cfg.weight_decay, mask=matrix_mask),
            optax.masked(optax.scale_by_trust_ratio(), matrix_mask),
            optax.scale_by_learning_rate(lr),
        ]
    elif cfg.name == "lars":
        parts += [
            optax.masked(scale_by_lars(cfg.weight_decay, cfg.lars_trust), matrix_mask),
            optax.trace(decay=cfg.b1),
            optax.scale_by_learning_rate(lr),
        ]
    elif cfg.name == "sgd":
        parts += [
            optax.add_decayed_weights(cfg.weight_decay, mask=matrix_mask),
            optax.sgd(lr, momentum=cfg.b1 or None),
        ]
    else:
        raise ValueError(f"optimizer {cfg.name!r} is not one of adamw, lamb, lars, sgd")
    return optax.chain(*parts)
