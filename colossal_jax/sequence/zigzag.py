"""Zigzag (load-balanced) sequence order for causal ring attention.

Algorithm: split a length-``s`` sequence into ``2p`` equal chunks; device ``i`` of the ``p``
sequence-parallel devices holds chunks ``i`` and ``2p - 1 - i`` (one early, one late chunk). Under
a causal mask device ``i``'s queries then see ``(i + 1) + (2p - i) = 2p + 1`` unmasked
(query-chunk, key-chunk) pairs over the whole ring, the same on every device. With the contiguous
split (device ``i`` holds chunks ``2i, 2i + 1``) device ``i`` sees ``4i + 3`` pairs, so the last
device does about ``p`` times (``(4p - 1) / 3``) the work of the first.

This is the causal load balancing used with ring attention (Liu et al. 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context", arXiv 2310.01889; zigzag variant as in
zhuzilin/ring-flash-attention and Megatron-LM context parallelism). The kernels mask by token
*positions* (``k_pos <= q_pos``), so permuting the sequence (and its positions) with
:func:`zigzag_permutation` before sharding is all that is needed.

Cost: the permutation is a host-side index array (``O(s)`` integers); applying it is one gather
of the tokens before the model, no communication inside attention.
"""

from __future__ import annotations

import numpy as np

from colossal_jax.config.parallel_rules import check_seq_split


def _check(seq_len: int, p: int) -> int:
    """The chunk size ``seq_len / (2p)``, after the rule of :func:`rules.check_seq_split`."""
    check_seq_split(seq_len, p, zigzag=True)
    return seq_len // (2 * p)


def zigzag_permutation(seq_len: int, p: int) -> np.ndarray:
    """Zigzag order: ``x[:, order]`` puts chunks ``i`` and ``2p-1-i`` (of ``2p``) on device ``i``.

    Device ``i`` holds contiguous block ``i`` (of size ``seq_len / p``) of the permuted sequence;
    that block is ``[chunk i, chunk 2p-1-i]`` of the original sequence, chunk size
    ``seq_len / (2p)``. The inverse permutation is ``np.argsort(order)``.

    Raises:
      ValueError: if ``seq_len`` is not a positive multiple of ``2p`` (names a valid length).
    """
    c = _check(seq_len, p)
    chunks = np.arange(seq_len, dtype=np.int64).reshape(2 * p, c)
    order = [np.concatenate([chunks[i], chunks[2 * p - 1 - i]]) for i in range(p)]
    return np.concatenate(order)


def _contiguous_permutation(seq_len: int, p: int) -> np.ndarray:
    _check(seq_len, p)
    return np.arange(seq_len, dtype=np.int64)


def block_schedule(seq_len: int, p: int, *, zigzag: bool = True) -> np.ndarray:
    """Unmasked causal work per (device, ring step), in score-chunk pairs, shape ``[p, p]``.

    Entry ``[i, t]`` counts the (query-chunk, key-chunk) pairs (chunk = ``seq_len / (2p)`` tokens,
    two chunks per device) of device ``i`` at ring step ``t``, when it holds the key block of
    device ``(i - t) mod p``, that are *not fully masked*: some query position is ``>=`` some key
    position. Computed from the actual token positions of the (zigzag or contiguous) order.
    """
    c = _check(seq_len, p)
    order = zigzag_permutation(seq_len, p) if zigzag else _contiguous_permutation(seq_len, p)
    chunk_pos = order.reshape(p, 2, c)  # [device, chunk, token] -> global position
    first = chunk_pos.min(axis=-1)  # [p, 2]
    last = chunk_pos.max(axis=-1)  # [p, 2]
    sched = np.zeros((p, p), dtype=np.int64)
    for i in range(p):
        for t in range(p):
            j = (i - t) % p
            # pair (qc, kc) is unmasked if max query position >= min key position
            sched[i, t] = int(np.sum(last[i][:, None] >= first[j][None, :]))
    return sched


def unmasked_blocks_per_device(seq_len: int, p: int, *, zigzag: bool = True) -> np.ndarray:
    """Total unmasked score-chunk pairs per device over the whole ring (row sums of
    :func:`block_schedule`), shape ``[p]``. Zigzag: all equal to ``2p + 1``; contiguous:
    ``4i + 3``."""
    return block_schedule(seq_len, p, zigzag=zigzag).sum(axis=1)
