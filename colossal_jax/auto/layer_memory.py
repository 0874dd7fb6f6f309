"""What one layer of a model family holds per token in the backward pass, read off the family's
own code: by tracing one layer (what each remat policy keeps) and by compiling the stack on one
CPU device (the working set of one layer's backward). The memory model
(:mod:`colossal_jax.auto.memory`) splits these over a plan's devices.

- **Kept** (:func:`kept`): the residuals ``jax.vjp`` saves for one layer of the scanned stack
  under the policy (``jax._src.ad_checkpoint.saved_residuals`` of ``model.blocks`` on one
  sequence of :data:`TRACE_LEN` tokens; no compile, nothing allocated; kept on disk), as
  elements per token:
  those with one token dimension, and attention score blocks (two) in units of ``a·s``. On the
  4-layer, 256-wide GPT and the 4-layer llama-tiny this equals what XLA stores per layer in the
  compiled stack (9,748 against 9,749 and 4,260 against 4,132 non-score elements per token; 2
  score rows of every head, scores and probabilities, in both).
- **Working** (:func:`working`): what one layer's backward holds beyond that, the transients
  XLA's buffer assignment gives it (softmax and its gradient, the MLP's gradient, one layer's
  weight gradient before it is stacked). No trace shows it, so the stack of :data:`STACK`
  layers is compiled under ``remat=none`` for three shapes (``2S``, ``S`` and ``2S`` tokens at
  sequence ``S``, ``S``, ``S/2``) and its temporaries, less what the layers keep, are solved for
  ``T·(other + scores·a·s) + fixed``. Three compiles of 1–2 s each per model and sequence
  length, kept on disk (:class:`colossal_jax.auto.cache.Cache`, kind ``layer``).
- **A remat policy's recomputed intermediates** beyond ``none``'s working set:
  :mod:`colossal_jax.auto.policy_memory`, from compiles of the stack and its head.
- **Ring blocks** (:func:`ring_blocks`): the score blocks ring attention's forward and backward
  hold at once (:mod:`colossal_jax.sequence.ring`: a block's scores, probabilities and their
  gradients, with grouped-query attention their regrouped copies) inside the layer stack's
  backward, where XLA shares the kernel's buffers with the layer's other transients: from two
  compiles of the :data:`STACK`-layer stack under ring attention, per device inside a
  ``shard_map`` as a training step runs it, over a sequence axis of 2 devices for a 2-way split
  and of 4 for any wider one (a 2-hop ring's loop compiles to more live blocks than a longer
  one's; 4 and 8 devices give the same count): 2.06 / 1.05 blocks for the GPT, 6.03 / 5.02 for
  llama-tiny (whose 16 query heads share 8 key/value heads). Until 2026-11-29 the kernel was
  compiled alone (4.0 / 2.52 and 7.0 / 5.0), which put llama-tiny's ``seq=2`` plans up to 11.5%
  over their compiled memory. Kept on disk beside the working set.
- **Ring self-attention's rows** (:func:`rsa_rows`): the score rows ring self-attention holds
  beyond XLA's reference attention, from compiles of the two kernels alone at the plan's
  sequence length and ring (up to 8 devices), kept on disk beside the working set.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from colossal_jax.analysis.compile_only import ANALYSIS_ONLY, compile_for_layer_figures

TRACE_LEN = 13
"""Tokens of the traced sequence: a length no model width equals, so a residual's token
dimension (and the two of a score block) can be told from its widths."""

STACK = 4
"""Layers of the compiled stack: enough that XLA keeps the scan a loop (at one to three layers
it unrolls it and the buffers differ)."""


@dataclasses.dataclass(frozen=True)
class Kept:
    """Elements one layer keeps per token: ``other`` (values with one token dimension) and
    ``scores`` (``[heads, s, s]`` blocks, in units of ``a·s``: one score row of every head);
    ``whole``, the part of ``other`` that 1D tensor parallelism leaves whole on every device:
    the ``h``-wide values and per-token statistics (``[s, h]``, ``[s, 1]``), less the one
    ``[s, h]`` value the heads split (the attention's merged output, the output projection's
    input)."""

    other: float
    scores: float
    whole: float = 0.0


@dataclasses.dataclass(frozen=True)
class Working:
    """One layer's backward transients: ``other + scores·a·s`` elements per token plus
    ``fixed`` elements per layer (its weight gradient and the like)."""

    other: float
    scores: float
    fixed: float


def _family(model: Any) -> Any:
    from colossal_jax.config.families import FAMILIES

    for family in FAMILIES.values():
        if isinstance(model, family.config_class):
            return family
    raise KeyError(f"no registered model family has the config class {type(model).__name__}")


@functools.lru_cache(maxsize=16)
def abstract_stack(model: Any, layers: int) -> tuple[Any, Any]:
    """``(graphdef, abstract parameters)`` of ``model`` cut to ``layers`` layers (kept: every
    trace and compile of a model's stack shares them)."""
    from flax import nnx

    m = dataclasses.replace(model, n_layer=layers)
    family = _family(m)
    abstract = nnx.eval_shape(lambda: family.build(m, rngs=nnx.Rngs(0), unroll=False))
    return nnx.split(abstract)


def on_cpu() -> Any:
    """The single-device parallelism on the host's CPU, whatever the default backend: the
    figures are read off CPU compiles (on a GPU host too, where the layers would otherwise
    route to a mesh of the GPU while their arguments sit on the CPU)."""
    from colossal_jax.layers.context import single_device, use_parallelism

    one = single_device("cpu")
    return use_parallelism(one.layout, one.local_attention)


def stack_fn(model: Any, layers: int, remat: str) -> tuple[Any, Any]:
    """``(f, params)``: ``f(params, x, positions)``, the sum of the outputs of ``layers`` layers of
    ``model``'s stack under ``remat`` (its gradient is a training step's backward), with the
    stack's abstract parameters."""
    import jax.numpy as jnp
    from flax import nnx

    from colossal_jax.layers.stack import StackOptions, use_stack_options
    from colossal_jax.parallel.remat import RematPolicy

    graphdef, params = abstract_stack(model, layers)
    policy = RematPolicy(remat).policy()

    def f(params, x, positions):
        with use_stack_options(StackOptions(remat=policy)):
            y = nnx.merge(graphdef, params).blocks(x, positions)
        return jnp.sum(y)

    return f, params


@functools.lru_cache(maxsize=256)
def kept(model: Any, remat: str) -> Kept:
    """:class:`Kept` of one layer of ``model`` (a family's resolved config) under ``remat``;
    read from the disk cache when it holds it."""
    from colossal_jax.auto.cache import Cache

    key = figure_key(model, TRACE_LEN, f"kept/{remat}")
    cache = Cache("layer")
    hit = cache.get(key)
    if hit is not None:
        return Kept(**hit)
    result = _traced_kept(model, remat)
    cache.put(key, dataclasses.asdict(result), {"model": repr(model), "remat": remat})
    return result


def trace_inputs(model: Any) -> tuple[Any, Any]:
    """The abstract layer input ``[1, TRACE_LEN, n_embd]`` and positions ``[1, TRACE_LEN]`` one
    layer of the stack is traced at (nothing allocated)."""
    import jax
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((1, TRACE_LEN, model.n_embd), jnp.float32)
    return x, jax.ShapeDtypeStruct((1, TRACE_LEN), jnp.int32)


def layer_residuals(
    residuals: list[tuple[Any, str]],
) -> Iterator[tuple[tuple[int, ...], float, int]]:
    """Of ``saved_residuals``' output for the scanned stack, the values each layer keeps (the
    scan's outputs; parameters and loop-invariant values left out): each one's shape less the
    scan's layer dimension, its elements, and how many of its dimensions are the trace's
    :data:`TRACE_LEN` tokens."""
    for aval, where in residuals:
        if "output of scan" not in where:
            continue
        shape = tuple(aval.shape[1:])
        yield shape, float(math.prod(shape)), sum(1 for d in shape if d == TRACE_LEN)


def _traced_kept(model: Any, remat: str) -> Kept:
    from jax._src.ad_checkpoint import saved_residuals

    f, params = stack_fn(model, 1, remat)
    s = TRACE_LEN
    other = scores = whole = 0.0
    with on_cpu():
        residuals = saved_residuals(f, params, *trace_inputs(model))
    for shape, size, tokens in layer_residuals(residuals):
        if tokens >= 2:
            scores += size / (s * s) / model.n_head
        elif tokens == 1:
            other += size / s
            widths = [d for d in shape if d not in (1, s)]
            if widths in ([], [model.n_embd]):
                whole += size / s
    if scores > 0:  # attention: its merged heads are [s, h] here, split by 1D
        whole = max(0.0, whole - model.n_embd)
    return Kept(other, scores, whole)


@functools.lru_cache(maxsize=64)
def working(model: Any, seq_len: int) -> Working:
    """:class:`Working` of one layer of ``model`` at sequences of ``seq_len`` tokens, under
    ``remat=none`` (fp32 elements), from three compiles of the stack (module docstring); read
    from the disk cache when it holds them."""
    from colossal_jax.auto.cache import Cache

    key = figure_key(model, seq_len)
    cache = Cache("layer")
    hit = cache.get(key)
    if hit is not None:
        return Working(**hit)
    s, half = seq_len, max(1, seq_len // 2)
    k_full = kept(model, "none")
    a = model.n_head

    def transient(batch: int, seq: int) -> float:
        """Temporaries beyond what the layers keep, in elements."""
        keep = k_full.other + k_full.scores * a * seq
        return _temp_elements(model, batch, seq) - STACK * batch * seq * keep

    w_full = transient(2, s)  # 2S tokens
    w_one = transient(1, s)  # S tokens
    per_token = (w_full - w_one) / s  # other + scores·a·S
    fixed = max(0.0, w_one - per_token * s)
    scores = 0.0
    if half < s:
        w_half = transient(2 * s // half, half)  # 2S tokens at S/2
        per_token_half = (w_half - fixed) / (2 * s)
        scores = max(0.0, (per_token - per_token_half) / (a * (s - half)))
    other = max(0.0, per_token - scores * a * s)
    result = Working(other, scores, fixed)
    cache.put(key, dataclasses.asdict(result), {"model": repr(model), "seq_len": seq_len})
    return result


def _temp_elements(model: Any, batch: int, seq: int) -> float:
    """fp32 elements of the compiled temporaries of the stack's gradient at ``batch × seq``,
    compiled for one CPU device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    f, params = stack_fn(model, STACK, "none")
    on = SingleDeviceSharding(jax.devices("cpu")[0])
    x = jax.ShapeDtypeStruct((batch, seq, model.n_embd), jnp.float32, sharding=on)
    positions = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=on)
    params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on), params)
    with on_cpu():
        lowered = jax.jit(jax.grad(f, argnums=(0, 1))).lower(params, x, positions)
    compiled = compile_for_layer_figures(lowered)
    return compiled.memory_analysis().temp_size_in_bytes / 4


@functools.cache
def _method_digest() -> str:
    """SHA-256 of this module's source: how the figures are read is part of their key."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def figure_key(model: Any, seq_len: int, what: str = "working") -> str:
    """The disk-cache key of a layer figure (``what``) of ``model`` at ``seq_len``: the model,
    jax, the package's and the family's source and this module's method."""
    import jax

    from colossal_jax.auto.cache import _plain, module_digest, source_digest

    parts = {
        "kind": "layer" if what == "working" else f"layer/{what}",
        "model": _plain(model),
        "model_class": type(model).__name__,
        "seq_len": seq_len,
        "jax": jax.__version__,
        "source": source_digest(),
        "family_source": module_digest(_family(model).module.partition(":")[0]),
        "method": _method_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


RING_SHAPES = ((4, 128), (8, 64))
"""``(batch, tokens per device)`` of the two compiles of :func:`ring_blocks`: the same tokens, so
the per-token buffers and the fixed ones (weights, their gradients) cancel, and score blocks
differing twofold."""


RING_HOPS = (2, 4)
"""Sequence-axis sizes :func:`ring_blocks` compiles the kernel on: 2, and 4 standing for every
wider ring (whose loop XLA compiles alike: 4 and 8 devices hold the same blocks)."""


def ring_hops(seq: int) -> int:
    """The :data:`RING_HOPS` entry that stands for a ``seq``-way ring."""
    return RING_HOPS[0] if seq <= RING_HOPS[0] else RING_HOPS[1]


@functools.lru_cache(maxsize=64)
def ring_blocks(model: Any, seq: int) -> float | None:
    """Score blocks (``[b, heads, s_q, s_k]`` of one hop, fp32) that ring attention holds at its
    peak inside ``model``'s layer stack on a ``seq``-way ring, solved from two compiles of the
    stack's gradient on a sequence axis of :func:`ring_hops` devices (:func:`_stack_blocks`);
    None when this process has fewer CPU devices than that (one device is a single hop, which
    XLA simplifies). Read from the disk cache when it holds it."""
    hops = ring_hops(seq)
    meta = {"model": repr(model), "kind": "ring", "hops": hops}
    return cached_trace(
        figure_key(model, hops, "ring"), "blocks", hops, meta, lambda: _stack_blocks(model, hops)
    )


def cached_trace(
    key: str, field: str, devices: int, meta: dict[str, Any], compute: Callable[[], float]
) -> float | None:
    """A layer figure traced or compiled on ``devices`` CPU devices: read from the disk cache
    (kind ``layer``) under ``key`` when it holds it, else ``compute()``d and kept there as
    ``field``; None when this process has fewer CPU devices than that."""
    import jax

    from colossal_jax.auto.cache import Cache

    cache = Cache("layer")
    hit = cache.get(key)
    if hit is not None:
        return float(hit[field])
    if len(jax.devices("cpu")) < devices:
        return None
    value = compute()
    cache.put(key, {field: value}, meta)
    return value


RSA_MAX_HOPS = 8
"""The longest ring :func:`rsa_rows` compiles ring self-attention on; a longer one (or one
longer than this process has CPU devices) is scaled from it (the kernel holds a score block
per hop)."""


@functools.lru_cache(maxsize=64)
def rsa_rows(model: Any, seq_len: int, seq: int) -> float | None:
    """Score rows (units of ``a·s`` per token on a device, fp32) that ring self-attention
    (:mod:`colossal_jax.sequence.ring_self_attention`) holds at its peak beyond XLA's reference
    attention, for ``model``'s heads at sequences of ``seq_len`` tokens on a ``seq``-way ring.
    The kernel computes its ``seq`` score blocks ``[s/p, s/p]`` apart, concatenates them into
    the rows, slices the probabilities again for RingAV, and autodiff keeps the pieces and the
    received key and value blocks; how many XLA holds at once depends on the block size (the
    4-layer GPT's heads, solved at 16–32 tokens a device: 10.0 rows on 8 devices; at 64–128:
    4.0), so the kernel is compiled at the plan's sequence length. Per sequence: the compiled
    temporaries of its gradient at batch 2 less batch 1 on a ring of ``hops`` devices, the
    least of ``seq``, :data:`RSA_MAX_HOPS` and this process's CPU devices (a longer ring scaled
    by ``seq / hops``), less the reference attention's over the whole sequence on one device,
    shared by the ring; None with a single CPU device. Read from the disk cache when it holds
    it."""
    import jax

    from colossal_jax.auto.cache import Cache

    hops = min(seq, RSA_MAX_HOPS, len(jax.devices("cpu")))
    if hops < 2 or seq_len // hops < 1:
        return None
    key = figure_key(model, seq_len, f"rsa/{hops}")
    cache = Cache("layer")
    hit = cache.get(key)
    if hit is None:
        a = model.n_head
        heads = (a, getattr(model, "n_kv_head", None) or a, model.n_embd // a)

        def per_sequence(kernel: str, ring: int, tokens: int) -> float:
            two, one = (_kernel_temp(kernel, b, tokens, heads, ring) for b in (2, 1))
            return two - one

        rsa = per_sequence("rsa", hops, seq_len // hops)
        ref = per_sequence("reference", 1, seq_len) / hops
        rows = (rsa - ref) / (4.0 * (seq_len / hops) * a * seq_len)
        hit = {"rows": rows}
        cache.put(key, hit, {"model": repr(model), "kind": "rsa", "hops": hops})
    return max(0.0, hit["rows"]) * seq / hops


def _stack_blocks(model: Any, hops: int) -> float:
    """Score blocks ``[b, heads, t, t]`` (fp32) that ring attention holds at the peak of the
    :data:`STACK`-layer stack's gradient, ``t`` tokens on each of ``hops`` devices: the compiled
    temporaries at the two :data:`RING_SHAPES` (the same tokens) differ by the blocks alone,
    ``blocks·4·a·(b₁t₁² − b₂t₂²)``."""
    (b1, t1), (b2, t2) = RING_SHAPES
    temps = [_ring_stack_temp(model, b, t, hops) for b, t in RING_SHAPES]
    return (temps[0] - temps[1]) / (4.0 * model.n_head * (b1 * t1 * t1 - b2 * t2 * t2))


def _ring_stack_temp(model: Any, b: int, t: int, hops: int) -> float:
    """Compiled temporary bytes per device of the gradient of :data:`STACK` layers of
    ``model``'s stack (``remat=none``) under ring attention, ``b`` sequences of ``t`` tokens on
    each of ``hops`` CPU devices, run per device inside a ``shard_map`` over the sequence axis
    as a training step runs its layers (outside one, GSPMD gathers the layers' activations to
    the whole sequence)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from colossal_jax.config import ParallelConfig
    from colossal_jax.layers.context import use_parallelism
    from colossal_jax.parallel.mesh import build_mesh
    from colossal_jax.parallel.sharding import make_layout, make_local_attention

    cfg = ParallelConfig(seq=hops, seq_mode="ring")
    mesh = build_mesh(cfg, jax.devices("cpu")[:hops])
    layout, attention = make_layout(cfg, mesh), make_local_attention(cfg)
    f, params = stack_fn(model, STACK, "none")

    def per_device(p, x, positions):
        with use_parallelism(layout, attention):
            return jax.lax.psum(f(p, x, positions), "seq")

    def loss(p, x, positions):
        specs = (P(), P(None, "seq"), P(None, "seq"))
        return jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=P())(p, x, positions)

    x = jax.ShapeDtypeStruct((b, hops * t, model.n_embd), jnp.float32)
    positions = jax.ShapeDtypeStruct((b, hops * t), jnp.int32)
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x, positions)
    compiled = lowered.compile(compiler_options=ANALYSIS_ONLY)
    return float(compiled.memory_analysis().temp_size_in_bytes)


def _kernel_temp(kernel: str, b: int, t: int, heads: tuple[int, int, int], hops: int) -> float:
    """Compiled temporary bytes of an attention kernel's gradient alone (``rsa``: ring
    self-attention; ``reference``: XLA's reference attention), ``t`` tokens on
    each of ``hops`` CPU devices; ``heads``: query heads, key/value heads, head size."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from colossal_jax.sequence.local import dot_product_attention
    from colossal_jax.sequence.ring_self_attention import ring_self_attention

    a, kv, d = heads
    mesh = Mesh(np.array(jax.devices("cpu")[:hops]), ("seq",))

    def body(q, k, v, pos):
        if kernel == "reference":
            out = dot_product_attention(q, k, v, pos, pos)
        else:
            out = ring_self_attention(q, k, v, pos, pos, axis_name="seq")
        return jax.lax.psum(jnp.sum(out * out), "seq")

    def loss(q, k, v, pos):
        spec = P(None, "seq")
        return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 4, out_specs=P())(q, k, v, pos)

    q = jax.ShapeDtypeStruct((b, hops * t, a, d), jnp.float32)
    k = jax.ShapeDtypeStruct((b, hops * t, kv, d), jnp.float32)
    pos = jax.ShapeDtypeStruct((b, hops * t), jnp.int32)
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, pos)
    compiled = lowered.compile(compiler_options=ANALYSIS_ONLY)
    return float(compiled.memory_analysis().temp_size_in_bytes)
