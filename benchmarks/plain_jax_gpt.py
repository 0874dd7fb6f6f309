"""The GPT of ``models/gpt.py`` in plain JAX: ``jnp`` functions over a parameter pytree, jitted
with GSPMD ``NamedSharding`` annotations only (no library layer, no ``shard_map``).

It is the baseline of ``scripts/bench_throughput.py``: the same parameter shapes, init
distributions and math (learned positions, pre-LN, GeLU tanh, untied LM head, the mean token
cross-entropy over weighted tokens) and the same optimizer
(``colossal_jax.training.optim.make_optimizer``
with the run's ``OptimConfig``), so a step of it does the same work as a step of the library.
``tests/test_bench_throughput.py`` holds it to the library's loss at equal parameters
(:func:`from_library` maps the library's stacked ``nnx`` state into this pytree).

Layers are a Python list run by a Python loop (as nanoGPT-style JAX trainers do), each layer a
dict of its own arrays. Shardings, on a mesh ``("data", "row", "col")``:

- ``data``: parameters replicated, batch split over ``data``; GSPMD inserts the gradient
  all-reduce.
- ``1d`` (Megatron-LM, Shoeybi et al. 2019): column linears (Q, K, V, MLP up, LM head) split
  their output dimension over ``("row", "col")``, row linears (attention out, MLP down) their
  input dimension; the token embedding is split by vocabulary; GSPMD inserts the all-reduces.
- ``2d`` (GSPMD's 2D weight sharding, Xu et al. 2021, arXiv 2105.04663): every weight matrix
  ``[N, K]`` rows over ``row`` and columns over ``col``; the residual stream ``[b, s, h]`` is
  constrained to batch over ``data`` and hidden over ``col``; GSPMD chooses the collectives of
  every matmul. (Splitting the batch over ``(data, row)`` as well, as the library's SUMMA
  layout does, makes XLA 0.10.2's CPU partitioner return wrong weight gradients:
  ``benchmarks/gspmd_2d_grad_repro.py``.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax_models.gpt_config import GPTConfig

Params = dict[str, Any]
MODES = ("data", "1d", "2d")

LAYER_WEIGHTS = {  # plain name -> (library path under blocks.layers, kind of linear)
    "wq": ("attn.query.kernel", "in"),
    "wk": ("attn.key.kernel", "in"),
    "wv": ("attn.value.kernel", "in"),
    "wo": ("attn.out.kernel", "out"),
    "w_up": ("mlp.up.kernel", "in"),
    "w_down": ("mlp.down.kernel", "out"),
}
LAYER_VECTORS = {  # plain name -> (library path under blocks.layers, what splits it)
    "bq": ("attn.query.bias", "in"),
    "bk": ("attn.key.bias", "in"),
    "bv": ("attn.value.bias", "in"),
    "bo": ("attn.out.bias", "out"),
    "b_up": ("mlp.up.bias", "in"),
    "b_down": ("mlp.down.bias", "out"),
    "ln1_scale": ("ln1.scale", "norm"),
    "ln1_bias": ("ln1.bias", "norm"),
    "ln2_scale": ("ln2.scale", "norm"),
    "ln2_bias": ("ln2.bias", "norm"),
}


# ---- parameters ---------------------------------------------------------------------------------
def init_params(cfg: GPTConfig, key: jax.Array) -> Params:
    """GPT-2 init as the library's layers do it: weights N(0, 0.02), the residual projections
    (attention out, MLP down) N(0, 0.02/sqrt(2L)), biases 0, layer-norm scales 1."""
    h, w, v = cfg.n_embd, cfg.mlp_width, cfg.vocab_size
    out_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    keys = iter(jax.random.split(key, 3 + 6 * cfg.n_layer))

    def normal(shape, std=0.02):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    layers = []
    for _ in range(cfg.n_layer):
        layers.append(
            {
                "wq": normal((h, h)),
                "wk": normal((h, h)),
                "wv": normal((h, h)),
                "wo": normal((h, h), out_std),
                "w_up": normal((h, w)),
                "w_down": normal((w, h), out_std),
                "bq": jnp.zeros((h,)),
                "bk": jnp.zeros((h,)),
                "bv": jnp.zeros((h,)),
                "bo": jnp.zeros((h,)),
                "b_up": jnp.zeros((w,)),
                "b_down": jnp.zeros((h,)),
                "ln1_scale": jnp.ones((h,)),
                "ln1_bias": jnp.zeros((h,)),
                "ln2_scale": jnp.ones((h,)),
                "ln2_bias": jnp.zeros((h,)),
            }
        )
    return {
        "wte": normal((v, h)),
        "wpe": normal((cfg.block_size, h)),
        "layers": layers,
        "lnf_scale": jnp.ones((h,)),
        "lnf_bias": jnp.zeros((h,)),
        "head": normal((h, v)),
    }


def from_library(state: Any) -> Params:
    """The library's GPT parameters (an ``nnx.State`` of ``colossal_jax_models.gpt.GPT``, layers
    stacked on a
    leading dimension) as this module's pytree (one dict per layer)."""
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state

    def at(tree, path: str):
        for part in path.split("."):
            tree = tree[part]
        return jnp.asarray(tree)

    stacked = pure["blocks"]["layers"]
    n = at(stacked, "ln1.scale").shape[0]
    names = {**LAYER_WEIGHTS, **LAYER_VECTORS}
    layers = [{k: at(stacked, path)[i] for k, (path, _) in names.items()} for i in range(n)]
    if pure.get("wpe") is None:
        raise ValueError("the plain-JAX GPT has learned positions only (model.position=learned)")
    return {
        "wte": at(pure, "wte.table"),
        "wpe": at(pure, "wpe.table"),
        "layers": layers,
        "lnf_scale": at(pure, "ln_f.scale"),
        "lnf_bias": at(pure, "ln_f.bias"),
        "head": at(pure, "lm_head.kernel"),
    }


# ---- the model ----------------------------------------------------------------------------------
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, heads: int) -> jax.Array:
    """Causal softmax attention of ``[b, s, h]`` projections, scores in float32."""
    b, s, h = q.shape
    shape = (b, s, heads, h // heads)
    q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
    scores = jnp.einsum("bqad,bkad->baqk", q, k, preferred_element_type=jnp.float32)
    scores = scores * (h // heads) ** -0.5
    causal = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    out = jnp.einsum("baqk,bkad->bqad", probs.astype(v.dtype), v)
    return out.reshape(b, s, h)


def block(p: Params, x: jax.Array, cfg: GPTConfig, constrain: Callable) -> jax.Array:
    """One pre-LN layer: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""
    y = layer_norm(x, p["ln1_scale"], p["ln1_bias"], cfg.eps)
    q, k, v = (y @ p[w] + p[b] for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
    x = constrain(x + attention(q, k, v, cfg.n_head) @ p["wo"] + p["bo"])
    y = layer_norm(x, p["ln2_scale"], p["ln2_bias"], cfg.eps)
    up = jax.nn.gelu(y @ p["w_up"] + p["b_up"], approximate=True)
    return constrain(x + up @ p["w_down"] + p["b_down"])


def loss_fn(
    params: Params,
    batch: dict[str, jax.Array],
    cfg: GPTConfig,
    *,
    compute_dtype: Any = jnp.float32,
    constrain: Callable = lambda x: x,
) -> jax.Array:
    """Mean next-token cross-entropy over the tokens with nonzero ``weights``."""
    if compute_dtype != jnp.float32:
        params = jax.tree.map(lambda a: a.astype(compute_dtype), params)
    x = constrain(params["wte"][batch["tokens"]] + params["wpe"][batch["positions"]])
    for layer in params["layers"]:
        x = block(layer, x, cfg, constrain)
    x = layer_norm(x, params["lnf_scale"], params["lnf_bias"], cfg.eps)
    logits = (x @ params["head"]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    w = batch["weights"].astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)


# ---- shardings ----------------------------------------------------------------------------------
def make_mesh(mode: str, data: int, row: int, col: int, devices=None) -> Mesh:
    """The mesh ``("data", "row", "col")`` (``1d`` splits over ``row × col`` flattened)."""
    if mode not in MODES:
        raise ValueError(f"plain-JAX sharding {mode!r} is not one of {', '.join(MODES)}")
    n = data * row * col
    devices = np.asarray(jax.devices()[:n] if devices is None else devices)
    return Mesh(devices.reshape(data, row, col), ("data", "row", "col"))


@dataclass(frozen=True)
class Shardings:
    """Every ``PartitionSpec`` of one sharding mode."""

    mode: str

    @property
    def tensor(self) -> tuple[str, ...]:
        return ("row", "col")

    def batch(self) -> P:
        return P("data", None)

    def residual(self) -> P | None:
        """The constraint on the residual stream ``[b, s, h]`` (None: left to GSPMD)."""
        if self.mode == "2d":
            return P("data", None, "col")
        if self.mode == "1d":
            return P("data", None, None)
        return None

    def weight(self, kind: str) -> P:
        if self.mode == "1d":
            return P(None, self.tensor) if kind == "in" else P(self.tensor, None)
        if self.mode == "2d":
            return P("row", "col")
        return P(None, None)

    def vector(self, kind: str) -> P:
        if self.mode == "1d" and kind == "in":
            return P(self.tensor)
        if self.mode == "2d":
            return P("col")
        return P(None)

    def params(self, n_layer: int) -> Params:
        layer = {k: self.weight(kind) for k, (_, kind) in LAYER_WEIGHTS.items()}
        layer |= {k: self.vector(kind) for k, (_, kind) in LAYER_VECTORS.items()}
        embedding = {"1d": P(self.tensor, None), "2d": P("row", "col")}.get(self.mode, P())
        return {
            "wte": embedding,
            "wpe": P(None, "col") if self.mode == "2d" else P(),
            "layers": [dict(layer) for _ in range(n_layer)],
            "lnf_scale": self.vector("norm"),
            "lnf_bias": self.vector("norm"),
            "head": self.weight("in"),
        }


def _named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def _opt_shardings(tx: optax.GradientTransformation, params: Any, param_sh: Any, mesh: Mesh):
    """Optimizer-state shardings: a leaf whose path ends with a parameter's path (optax keeps
    the parameter tree inside its states: Adam's moments) and has its shape takes that
    parameter's sharding; every other leaf (step counts) is replicated."""
    by_path = {
        tuple(path): (leaf.shape, sh)
        for (path, leaf), sh in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree.leaves(param_sh),
            strict=True,
        )
    }

    def one(path, leaf):
        for start in range(len(path)):
            hit = by_path.get(tuple(path[start:]))
            if hit is not None and hit[0] == leaf.shape:
                return hit[1]
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(one, jax.eval_shape(tx.init, params))


# ---- the training step --------------------------------------------------------------------------
@dataclass
class PlainRun:
    """A jitted plain-JAX training step and its state's shardings."""

    cfg: GPTConfig
    mesh: Mesh
    mode: str
    step: Callable
    param_shardings: Any
    opt_shardings: Any
    batch_sharding: NamedSharding
    tx: optax.GradientTransformation
    compute_dtype: Any

    def init(self, seed: int = 0) -> tuple[Params, Any]:
        """Parameters and optimizer state created directly in their shardings."""

        def init():
            params = init_params(self.cfg, jax.random.key(seed))
            return params, self.tx.init(params)

        out = (self.param_shardings, self.opt_shardings)
        return jax.jit(init, out_shardings=out)()

    def place(self, params: Params) -> tuple[Params, Any]:
        """A copy of ``params`` (e.g. :func:`from_library`) and a fresh optimizer state, placed
        (a copy: the step donates its inputs, and the library's arrays must survive it)."""
        params = jax.device_put(params, self.param_shardings, may_alias=False)
        return params, jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return {k: jax.device_put(v, self.batch_sharding) for k, v in batch.items()}

    def _loss(self) -> Callable:
        constrain = _constrainer(self.mesh, Shardings(self.mode).residual())

        def f(p, b):
            return loss_fn(p, b, self.cfg, compute_dtype=self.compute_dtype, constrain=constrain)

        return f

    def loss(self, params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        """The jitted loss of ``params`` on ``batch``, in the step's shardings."""
        return jax.jit(self._loss())(params, batch)

    def value_and_grad(self, params: Params, batch: dict[str, jax.Array]):
        """The jitted ``(loss, gradients)`` of ``params`` on ``batch``, in the step's shardings."""
        return jax.jit(jax.value_and_grad(self._loss()))(params, batch)


def _constrainer(mesh: Mesh, spec: P | None) -> Callable:
    if spec is None:
        return lambda x: x
    sharding = NamedSharding(mesh, spec)
    return lambda x: jax.lax.with_sharding_constraint(x, sharding)


def build(
    cfg: GPTConfig,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    mode: str,
    *,
    compute_dtype: Any = jnp.float32,
) -> PlainRun:
    """The jitted step ``(params, opt_state, batch) -> (params, opt_state, metrics)`` of ``mode``
    on ``mesh``, parameters and optimizer state donated (as the library's step)."""
    if cfg.position != "learned":
        raise ValueError("the plain-JAX GPT has learned positions only (model.position=learned)")
    sh = Shardings(mode)
    param_sh = _named(mesh, sh.params(cfg.n_layer))
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    opt_sh = _opt_shardings(tx, abstract, param_sh, mesh)
    batch_sh = NamedSharding(mesh, sh.batch())
    constrain = _constrainer(mesh, sh.residual())

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(
            params, batch, cfg, compute_dtype=compute_dtype, constrain=constrain
        )
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (
            optax.apply_updates(params, updates),
            opt_state,
            {"loss": loss, "grad_norm": grad_norm},
        )

    batch_shardings = {k: batch_sh for k in ("tokens", "targets", "positions", "weights")}
    jitted = jax.jit(
        step,
        in_shardings=(param_sh, opt_sh, batch_shardings),
        out_shardings=(param_sh, opt_sh, None),
        donate_argnums=(0, 1),
    )
    return PlainRun(cfg, mesh, mode, jitted, param_sh, opt_sh, batch_sh, tx, compute_dtype)
