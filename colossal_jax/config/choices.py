"""The mesh axes and the valid values of every choice-valued setting (JAX-free constants)."""

from __future__ import annotations

AXES: tuple[str, ...] = ("data", "pipe", "tensor_row", "tensor_col", "tensor_depth", "seq")
"""The six mesh axes, in the order they are printed. Device order puts tensor axes innermost."""

MESH_ORDER: tuple[str, ...] = ("data", "pipe", "seq", "tensor_depth", "tensor_row", "tensor_col")
"""Axis order of the physical mesh: data outermost (crosses hosts), tensor innermost (NVLink)."""

TENSOR_MODES = ("none", "1d", "2d", "2.5d", "3d")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")
SEQ_MODES = ("none", "ring", "ulysses", "ring-self-attention")
PRECISIONS = ("fp32", "bf16", "fp16")
REMATS = ("none", "dots", "full", "selective", "offload")
OFFLOADS = ("none", "optimizer", "params")
PIPELINES = ("none", "gpipe", "1f1b", "interleaved")
OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")

TENSOR_AXES = ("tensor_row", "tensor_col", "tensor_depth")


COLLECTIVE_MATMUL_MODES = ("1d", "2d", "2.5d", "3d")


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
