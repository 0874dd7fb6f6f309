"""The sequence-parallel modes, one registered :class:`SeqMode` each: its name and help, the
per-device attention kernel that runs it, and the properties the rules read.

The built-in modes — ``none``, ``ring`` (ring attention), ``ulysses`` (DeepSpeed-Ulysses) and
``ring-self-attention`` (Li et al. 2021) — are registered at the bottom of this module. A new
mode is its kernel module (a :data:`~colossal_jax.tensor.layout.LocalAttention`) and one
:func:`register` call. Nothing here imports JAX: the kernel is a ``"package.module:Name"``
reference imported when a run builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_jax.config.registry import Reference, Registry, resolve


@dataclass(frozen=True)
class SeqMode:
    """A sequence mode.

    Attributes:
      name: the ``--seq-mode`` value.
      help: one line saying what it is.
      kernel: the per-device attention (:data:`~colossal_jax.tensor.layout.LocalAttention`), a
        ``"package.module:Name"`` reference or the function itself. A mode that splits the
        sequence gets ``axis_name="seq"``; one in ``position_order`` gets ``implementation=``
        (``auto | xla | cudnn | blockwise``).
      splits_sequence: it splits the sequence over the ``seq`` axis (every mode but ``none``).
      position_order: the blocks its kernel attends are in position order, so the block kernel
        may be cuDNN flash attention (:mod:`colossal_jax.sequence.fused`); a ring masks its
        blocks by position and combines them by log-sum-exp instead.
      zigzag: for a causal model the sequence is reordered in zigzag chunks before the model
        (:mod:`colossal_jax.sequence.zigzag`), balancing the causal mask's work over the ring.
      splits_heads: it re-splits each tensor shard's heads over ``seq`` (Ulysses' all-to-all),
        so the heads must divide (:func:`~colossal_jax.config.parallel_rules.
        check_ulysses_heads`).
    """

    name: str
    help: str
    kernel: Reference
    splits_sequence: bool = True
    position_order: bool = False
    zigzag: bool = False
    splits_heads: bool = False

    def kernel_function(self):
        """The attention kernel (imports JAX)."""
        return resolve(self.kernel)


TABLE: Registry[SeqMode] = Registry("sequence mode", "--seq-mode")
"""Every sequence mode, by name, in registration order."""
register = TABLE.register
unregister = TABLE.unregister


def seq_mode(name: str) -> SeqMode:
    """The registered mode ``name``; :class:`ConfigError` names the registered ones."""
    return TABLE.get(name)


def splitting_modes() -> tuple[str, ...]:
    """The names of the modes that split the sequence (all but ``none``)."""
    return tuple(TABLE.names(lambda mode: mode.splits_sequence))


LOCAL = register(
    SeqMode(
        "none",
        "no sequence split: each device attends its whole sequences",
        "colossal_jax.sequence.fused:fused_attention",
        splits_sequence=False,
        position_order=True,
    )
)
"""The mode without a sequence split; a run whose ``seq`` axis is 1 runs its kernel whatever
its ``--seq-mode``."""
register(
    SeqMode(
        "ring",
        "ring attention: K/V blocks circulate around the seq axis (zigzag order when causal)",
        "colossal_jax.sequence.ring:ring_attention",
        zigzag=True,
    )
)
register(
    SeqMode(
        "ulysses",
        "DeepSpeed-Ulysses: all-to-all from a sequence split to a head split and back",
        "colossal_jax.sequence.ulysses:ulysses_attention",
        position_order=True,
        splits_heads=True,
    )
)
register(
    SeqMode(
        "ring-self-attention",
        "ring self-attention (Li et al. 2021): scores then values around the seq axis",
        "colossal_jax.sequence.ring_self_attention:ring_self_attention",
    )
)
