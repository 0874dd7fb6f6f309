"""The mesh axes and the valid values of every choice-valued setting (JAX-free constants).

:data:`TENSOR_MODES`, :data:`SEQ_MODES`, :data:`PIPELINES` and :data:`OPTIMIZERS` are live views
of the names in their registries (:mod:`~colossal_jax.config.tensor_modes`,
:mod:`~colossal_jax.config.seq_modes`, :mod:`~colossal_jax.config.pipelines`,
:mod:`~colossal_jax.config.optimizers`), in registration order: a mode registered later is in
them.
"""

from __future__ import annotations

from colossal_jax.config import optimizers, pipelines, seq_modes, tensor_modes
from colossal_jax.config.registry import Names

AXES: tuple[str, ...] = ("data", "pipe", "tensor_row", "tensor_col", "tensor_depth", "seq")
"""The six mesh axes, in the order they are printed. Device order puts tensor axes innermost."""

MESH_ORDER: tuple[str, ...] = ("data", "pipe", "seq", "tensor_depth", "tensor_row", "tensor_col")
"""Axis order of the physical mesh: data outermost (crosses hosts), tensor innermost (NVLink)."""

TENSOR_MODES: Names = tensor_modes.TABLE.names()
"""``--tensor-mode``: the registered tensor modes."""
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "blockwise")
SEQ_MODES: Names = seq_modes.TABLE.names()
"""``--seq-mode``: the registered sequence modes."""
PRECISIONS = ("fp32", "bf16", "fp16")
REMATS = ("none", "dots", "full", "selective", "offload")
OFFLOADS = ("none", "optimizer", "params")
PIPELINES: Names = pipelines.TABLE.names()
"""``--pipeline``: the registered pipeline schedules."""
OPTIMIZERS: Names = optimizers.TABLE.names()
"""``--optimizer``: the registered optimizers."""

TENSOR_AXES = ("tensor_row", "tensor_col", "tensor_depth")


MAX_PEER_TIMEOUT = 3600
"""The longest ``--peer-timeout`` accepted (an hour: beyond it a lost peer looks like a hang)."""


HOST_OVERLAP = ("auto", "on", "off")
"""``TrainConfig.host_overlap``: the training loop's order (:func:`host_overlap`)."""


# ---- model --------------------------------------------------------------------------------------

MAY_BE_ZERO = ("type_vocab_size",)
"""Integer model fields where 0 turns a part off (BERT's token-type embedding)."""


# ---- the data task -------------------------------------------------------------------------------

IMAGE_DATA = ("digits", "shapes")
"""``--data`` of image classification: scikit-learn's 8×8 handwritten digits (generated images
where scikit-learn is not installed), or generated images at the model's size."""
DIGITS_SHAPE = (8, 1, 10)
"""Image side, channels and classes of the digits."""
MASKED_LM_MIN_SEQ = 5
"""``[CLS] A [SEP] B [SEP]`` with one token in each segment."""


# ---- benchmarks (scripts/bench_throughput.py) ----------------------------------------------------

BASELINES = ("plain-jax", "torch", "none")
