"""The split backward's tape: what the stack's linears keep so that a zero-bubble pipeline can
form the weight gradients (W) apart from the activation gradients (B), recomputing nothing.

Zero-bubble schedules (Qi et al. 2024) split a chunk's backward into **B**, the gradient of its
input, and **W**, the gradient of its linears' weights (``dW = xᵀ·dy``, which nothing downstream
waits for). Without the tape, a W from the chunk's ``vjp`` would re-run B's whole chain to get
each linear's ``dy``. With it, every linear call of the layers (:class:`~colossal_jax.layers.
Dense`, fused Q/K/V and gate/up, :class:`~colossal_jax.layers.HiddenDense`, in any tensor mode)
goes through :func:`linear` / :func:`linears`, which in a chunk traced under :func:`chunk_tape`:

- ``"record"``: runs as usual and records the call's input and outputs (shapes for the slots);
- ``"forward"`` (the F of a split schedule): multiplies by ``stop_gradient`` of the weights and
  biases, so the chunk's ``vjp`` (B) computes no weight gradient, and adds a zero **probe** to
  each output, whose cotangent in B is that linear's ``dy``; the input ``x`` passes through
  :func:`tap` with an input probe, whose cotangent in B is ``x`` itself. So B hands W the
  inputs as well as the output gradients, and F keeps nothing beyond the chunk's residuals:
  under a remat policy that recomputes the layer's element-wise work (``dots``, ``full``) B
  recomputes ``x`` anyway, without the policy ``x`` is among the residuals once;
- ``"weights"`` (the W): multiplies the *saved* input by the weights and returns the outputs
  (under ``stop_gradient`` to the rest of the layer), so ``vjp`` of the chunk w.r.t. its
  parameters applied to the saved ``dy``'s is exactly ``Σ xᵀ·dy`` (and ``Σ dy`` for biases)
  through the layout's own kernel and collectives; the rest of the layer's forward is dead code
  (XLA removes it).

FLOPs: F as before, B = the fused backward without the ``xᵀ·dy`` products, W = those products:
B + W = the fused backward. Memory: from F to B the chunk's residuals (those of the fused
backward, less what only the weight gradients need), from B to W each linear's input and ``dy``.

:func:`~colossal_jax.layers.stack.apply_layers` scans the probes and saved values over the layers
with the layer parameters (:func:`active_chunk`, :func:`layer_tape`). Without a chunk tape the
linears call the layout exactly as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jax

from colossal_jax.layers.context import active
from colossal_jax.tensor.layout import LinearKind

MODES = ("record", "forward", "weights")


@dataclass
class ChunkTape:
    """One chunk's tape. ``inputs``: per layer (stacked over the layers), per linear call, the
    probes (``"forward"``) or the saved inputs (``"weights"``); None in ``"record"``.
    In ``"forward"`` a call's probes are ``(input probe, [output probes])``.
    ``outputs`` (set by the stack): ``"record"``: ``(inputs, outputs)`` of every call;
    ``"forward"``: nothing (an empty list per layer); ``"weights"``: the calls' outputs — each
    stacked over the layers, a list over calls (of lists over a call's outputs)."""

    mode: str
    inputs: Any = None
    outputs: Any = None
    used: bool = False


@dataclass
class _LayerTape:
    mode: str
    inputs: Any
    cursor: int = 0
    outputs: list = field(default_factory=list)

    def call(self, layout, x, ws, bs, kind, single: bool) -> list[jax.Array]:
        def run(xx, ww, bb):
            if single:
                return [layout.linear(xx, ww[0], None if bb is None else bb[0], kind)]
            return layout.linears(xx, ww, bb, kind)

        k = self.cursor
        self.cursor += 1
        if self.mode == "record":
            outs = run(x, ws, bs)
            self.outputs.append((x, outs))
            return outs
        if self.mode == "forward":
            stop = jax.lax.stop_gradient
            x_probe, y_probes = self.inputs[k]
            x = tap(x, x_probe)
            outs = run(x, [stop(w) for w in ws], None if bs is None else [stop(b) for b in bs])
            return [o + probe for o, probe in zip(outs, y_probes, strict=True)]
        outs = run(self.inputs[k], ws, bs)
        self.outputs.append(outs)
        return [jax.lax.stop_gradient(o) for o in outs]


@jax.custom_vjp
def tap(x: jax.Array, probe: jax.Array) -> jax.Array:
    """``x`` unchanged; in the backward pass the cotangent of ``probe`` (a zero of ``x``'s type)
    is ``x`` itself, so a ``vjp`` hands back the value a linear read, from wherever the
    backward has it (kept, or recomputed under a remat policy)."""
    del probe
    return x


def _tap_forward(x, probe):
    del probe
    return x, x


def _tap_backward(x, g):
    return g, x


tap.defvjp(_tap_forward, _tap_backward)


_CHUNK: contextvars.ContextVar[ChunkTape | None] = contextvars.ContextVar(
    "colossal_jax_chunk_tape", default=None
)
_LAYER: contextvars.ContextVar[_LayerTape | None] = contextvars.ContextVar(
    "colossal_jax_layer_tape", default=None
)


@contextlib.contextmanager
def chunk_tape(mode: str, inputs: Any = None) -> Iterator[ChunkTape]:
    """Trace one chunk (one :func:`~colossal_jax.layers.stack.apply_layers`) with a tape."""
    if mode not in MODES:
        raise ValueError(f"unknown tape mode {mode!r}; use one of {MODES}")
    tape = ChunkTape(mode, inputs)
    token = _CHUNK.set(tape)
    try:
        yield tape
    finally:
        _CHUNK.reset(token)
    if not tape.used:
        raise ValueError("a split backward needs the chunk to run its layers by apply_layers")


def active_chunk() -> ChunkTape | None:
    """The chunk tape being traced, if any (read by the stack)."""
    return _CHUNK.get()


@contextlib.contextmanager
def layer_tape(mode: str, inputs: Any) -> Iterator[_LayerTape]:
    """Trace one layer's linears with the tape ``inputs`` of that layer (the stack's scan body);
    the chunk tape is hidden meanwhile, so a nested stack would fail loudly."""
    tape = _LayerTape(mode, inputs)
    token, hidden = _LAYER.set(tape), _CHUNK.set(None)
    try:
        yield tape
    finally:
        _CHUNK.reset(hidden)
        _LAYER.reset(token)


def linear(x: jax.Array, w: jax.Array, b: jax.Array | None, kind: LinearKind) -> jax.Array:
    """``x @ w + b`` through the active layout (and the tape, inside a split chunk)."""
    tape = _LAYER.get()
    if tape is None:
        return active().layout.linear(x, w, b, kind)
    return tape.call(active().layout, x, [w], None if b is None else [b], kind, True)[0]


def linears(
    x: jax.Array, ws: list[jax.Array], bs: list[jax.Array] | None, kind: LinearKind
) -> list[jax.Array]:
    """Several linears reading ``x`` in one layout call (and the tape, inside a split chunk)."""
    tape = _LAYER.get()
    if tape is None:
        return active().layout.linears(x, ws, bs, kind)
    return tape.call(active().layout, x, ws, bs, kind, False)
