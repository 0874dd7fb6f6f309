"""Closed-form communication volume of the sequence-parallel attention kernels (docs/formulas.md).

Elements received per device for attention over ``b·s`` tokens of width ``h = heads·head_dim``
split over ``p`` devices on the sequence axis; multiply by the dtype size for bytes. Under
grouped-query attention the keys and values are ``kv`` wide (``g`` of the ``a`` heads:
``kv = g·head_dim``), and only those travel: pass ``kv`` as the width of the K/V-only kernels
(ring attention, ring self-attention) and to :func:`ulysses_forward_elements`.
"""

from __future__ import annotations

import math


def ring_forward_elements(b: int, s: int, h: int, p: int) -> float:
    """Ring attention forward: K and V blocks ``[b, s/p, h]`` travel p−1 hops."""
    return 2 * (p - 1) / p * b * s * h


def ring_backward_elements(b: int, s: int, h: int, p: int) -> float:
    """Ring attention backward as docs/formulas.md counts it: K, V and their gradients, p−1 hops
    each. (Our kernel sends dK, dV one more hop home: ``(4p−2)/p·b·s·h``, 7% more at p = 8.)"""
    return 4 * (p - 1) / p * b * s * h


def ring_kernel_backward_elements(b: int, s: int, h: int, p: int) -> float:
    """Ring attention backward as :mod:`colossal_jax.sequence.ring` sends it: K and V ``p − 1``
    hops, their gradients ``p`` hops (the last one home), ``(4p − 2)/p·b·s·h``."""
    return (4 * p - 2) / p * b * s * h


def ulysses_forward_elements(b: int, s: int, h: int, p: int, kv: float | None = None) -> float:
    """Ulysses forward: all-to-alls of Q, K, V and the output, each ``(p−1)/p`` of its
    ``b·s·width/p`` (Q and the output ``h`` wide, K and V ``kv``, default ``h``)."""
    kv = h if kv is None else kv
    return 2 * (p - 1) / p * b * s * (h + kv) / p


def ring_self_attention_forward_elements(b: int, s: int, h: int, p: int) -> float:
    """Ring self-attention forward (Li et al. 2021): RingQK rotates K, RingAV rotates V."""
    return 2 * (p - 1) / p * b * s * h


def ulysses_kv_repeat(kv_heads: int, p: int) -> int:
    """How many times Ulysses repeats each of a device's ``kv_heads`` key/value heads before its
    all-to-all: ``p / gcd(g, p)`` where ``p`` does not divide ``g`` (so the ``lcm(g, p)`` heads
    split ``p`` ways), else 1."""
    return p // math.gcd(kv_heads, p) if kv_heads % p else 1


def pipelined_hop_blocks(p: int) -> int:
    """Blocks of a ring hop's size a device receives per hop inside a pipeline stage: there
    :func:`colossal_jax.tensor.kernels.ring_shift` sends a hop as an all-to-all whose one
    non-empty block goes to the next device (XLA's CPU runtime makes a collective-permute in a
    per-stage branch wait for every device), so ``p − 1`` blocks, 1 at ``p = 2``; multiply the
    ring's and ring self-attention's elements by it (compiled, ``pipe=2,seq=4`` ring GPipe M4:
    7.50 MiB of hops against the formulas' 2.50)."""
    return max(1, p - 1)
