"""Per-device training-state memory of every ZeRO stage, offload and remat mode, read from XLA's
compiled memory analysis (nothing executes), next to the docs/formulas.md section 4 formula.

Two programs are compiled per configuration, with abstract inputs (``jax.ShapeDtypeStruct`` in
the run's shardings), and every byte figure below is a field of ``compiled.memory_analysis()``:

- the value-and-grad function of the run (``steps.value_and_grad_fn``: the all-manual
  ``shard_map`` step with the stage's gathers and reductions), jitted with
  ``in_shardings=(run.device_param_shardings, batch)`` and
  ``out_shardings=(None, run.grad_shardings)``;

  * ``param_bytes`` = its ``argument_size_in_bytes`` − ``batch_bytes``;
  * ``grad_bytes`` = its ``output_size_in_bytes`` − 4 (the fp32 loss) − ``8·(leaves + 1)``: the
    CPU compiler counts the output tuple's table of buffer pointers, 8 bytes per output, in the
    output size (checked: the remainder is exactly ``8·(leaves+1)`` bytes at every stage);

- the train step (``train.make_train_step(run)``: value-and-grad, global-norm clip, AdamW update,
  parameters and optimizer state donated), lowered with ``checkpoint.abstract_like`` inputs in
  ``run.param_shardings`` / ``run.opt_shardings``:

  * ``opt_bytes`` = its ``argument_size_in_bytes`` − ``param_bytes`` − ``batch_bytes``;
  * ``temp_bytes`` = its ``temp_size_in_bytes`` (activations kept for the backward pass, the
    gradients inside the step, ZeRO-3's gathered layer, the optimizer's intermediates);
  * ``step_bytes`` = ``argument + output + temp − alias`` (the per-device footprint of one step,
    as :mod:`colossal_jax_benchmarks.seqbench` defines it) and ``peak_bytes``
    (``peak_memory_in_bytes``
    where the backend reports it, else 0).

``batch_bytes`` is itself read from the memory analysis of an identity on the batch compiled in
the batch's sharding (its ``argument_size_in_bytes``).

The formula (fp32 AdamW: parameters 4 B, gradients 4 B, m and v 8 B per element) is evaluated
per leaf: a leaf ZeRO shards (``zero.zero_dim`` not None) counts ``1/N_d`` of its elements in the
sharded parts of the state, a leaf ZeRO leaves replicated
(:func:`colossal_jax.parallel.zero.leftovers`)
counts whole. ``formula_bytes`` is the state wherever it lives; with ``--offload`` the state moved
to ``pinned_host`` should leave device memory on a backend that honours memory kinds, but on the
CPU backend the compiler ignores the placement (host-resident arguments are still counted in
``argument_size_in_bytes`` and the ``host_*`` fields are 0), so offload savings cannot be
measured here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jax

from colossal_jax.config import ParallelConfig, TrainConfig, param_count
from colossal_jax.parallel.sharding import is_variable
from colossal_jax.parallel.zero import leftovers, zero_dim
from colossal_jax.training.checkpoint import abstract_like

BATCH_KEYS = ("tokens", "targets", "positions", "weights")
TUPLE_ENTRY_BYTES = 8
"""Bytes per output the CPU compiler counts for the output tuple's pointer table."""


@dataclass(frozen=True)
class Model:
    """A GPT (``gpt2-tiny`` with overrides: byte vocabulary 256, learned positions, block 256)."""

    n_layer: int = 4
    n_embd: int = 256
    batch: int = 8
    seq: int = 256

    @property
    def n_head(self) -> int:
        return max(1, self.n_embd // 64)

    def describe(self) -> str:
        return (
            f"gpt2-tiny n_layer={self.n_layer} n_embd={self.n_embd} n_head={self.n_head} "
            f"vocab=256 block=256, batch {self.batch} x seq {self.seq}, fp32 AdamW"
        )


def config(
    model: Model, zero: int, offload: str = "none", remat: str = "full", devices: int = 8
) -> TrainConfig:
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides={"n_layer": model.n_layer, "n_embd": model.n_embd, "n_head": model.n_head},
        batch_size=model.batch,
        seq_len=model.seq,
        data="synthetic",
        remat=remat,
        offload=offload,
        devices=devices,
        eval_every=0,
        parallel=ParallelConfig(data=devices, zero=zero),
    )


def abstract_batch(run, *, train_step: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
    """The run's batch as abstract arrays in its sharding: the shapes and dtypes of its task's
    batches (``[b, s]``; image tokens carry a feature dimension); with ``train_step`` also the
    per-device stop flags the train step takes (``batches.stop_flags``: one int32 per device)."""
    from colossal_jax.training.batches import stop_sharding

    host = run.batches.batch(0)
    batch = {
        k: jax.ShapeDtypeStruct(host[k].shape, host[k].dtype, sharding=run.batch_sharding)
        for k in BATCH_KEYS
    }
    if train_step:
        stop = stop_sharding(run.mesh)
        batch["stop"] = jax.ShapeDtypeStruct((run.mesh.size,), "int32", sharding=stop)
    return batch


def formula_bytes(run, *, include_opt_scalars: bool = False) -> dict[str, int]:
    """docs/formulas.md section 4 for ``run``'s stage, per leaf: ``4·P + 4·G + 8·O`` where each
    of P, G, O is a leaf's whole element count or ``1/N_d`` of it (ZeRO-sharded leaves in the
    stage's sharded parts; leftovers always whole)."""
    stage = run.cfg.parallel.zero
    n = run.mesh.shape.get("data", 1)
    whole = sharded = 0.0
    for v in jax.tree.leaves(run.abstract_params, is_leaf=is_variable):
        if not is_variable(v):
            continue
        size = math.prod(v.get_value().shape)
        whole += size
        d = zero_dim(v, run.layout, layer_entry=None)
        sharded += size if d is None else size / n
    params = 4 * (sharded if stage >= 3 else whole)
    grads = 4 * (sharded if stage >= 2 else whole)
    opt = 8 * (sharded if stage >= 1 else whole)
    return {
        "formula_param_bytes": int(params),
        "formula_grad_bytes": int(grads),
        "formula_opt_bytes": int(opt),
        "formula_bytes": int(params + grads + opt),
    }


def _stats(compiled) -> Any:
    ma = compiled.memory_analysis()
    return ma[0] if isinstance(ma, list | tuple) else ma


def measure(
    model: Model, zero: int, offload: str = "none", remat: str = "full", devices: int = 8
) -> dict:
    """Compile the value-and-grad and the train step of ``model`` at ``data=devices`` and return
    the per-device byte figures described in the module docstring."""
    from colossal_jax.training.run import build
    from colossal_jax.training.steps import make_train_step, value_and_grad_fn

    t0 = time.perf_counter()
    run = build(config(model, zero, offload, remat, devices))
    batch = abstract_batch(run)
    batch_shardings = {k: run.batch_sharding for k in BATCH_KEYS}

    ident = jax.jit(lambda b: b, in_shardings=(batch_shardings,)).lower(batch).compile()
    batch_bytes = int(_stats(ident).argument_size_in_bytes)

    vg = value_and_grad_fn(run)
    vg_jit = jax.jit(
        lambda p, b: vg(p, b),
        in_shardings=(run.device_param_shardings, batch_shardings),
        out_shardings=(None, run.grad_shardings),
    )
    device_params = abstract_like(run.abstract_params, run.device_param_shardings)
    vg_stats = _stats(vg_jit.lower(device_params, batch).compile())
    n_leaves = len(jax.tree.leaves(run.abstract_params))
    param_bytes = int(vg_stats.argument_size_in_bytes) - batch_bytes
    grad_bytes = int(vg_stats.output_size_in_bytes) - 4 - TUPLE_ENTRY_BYTES * (n_leaves + 1)

    params = abstract_like(run.abstract_params, run.param_shardings)
    opt = abstract_like(jax.eval_shape(run.tx.init, run.abstract_params), run.opt_shardings)
    step_batch = abstract_batch(run, train_step=True)
    step_stats = _stats(make_train_step(run).lower(params, opt, step_batch).compile())
    stop_bytes = 4  # the step's one int32 stop flag per device
    opt_bytes = int(step_stats.argument_size_in_bytes) - param_bytes - batch_bytes - stop_bytes
    formula = formula_bytes(run)
    measured = param_bytes + grad_bytes + opt_bytes
    return {
        "model": model.describe(),
        "n_layer": model.n_layer,
        "n_embd": model.n_embd,
        "n_params": param_count(run.model),
        "n_devices": run.mesh.size,
        "backend": jax.default_backend(),
        "zero": zero,
        "offload": offload,
        "remat": remat,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "opt_bytes": opt_bytes,
        "temp_bytes": int(step_stats.temp_size_in_bytes),
        "batch_bytes": batch_bytes,
        "step_bytes": step_footprint(step_stats),
        "peak_bytes": int(getattr(step_stats, "peak_memory_in_bytes", 0) or 0),
        "host_bytes": int(
            step_stats.host_argument_size_in_bytes + step_stats.host_temp_size_in_bytes
        ),
        **formula,
        "ratio": measured / formula["formula_bytes"],
        "leftovers": leftovers(run.abstract_params, run.layout),
        "compile_s": round(time.perf_counter() - t0, 2),
    }


def step_footprint(stats) -> int:
    """``argument + output + temp − alias`` bytes of a compiled program (per device)."""
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )


def step_bytes(run) -> dict:
    """Only the train step's footprint of a built run (for the budget search): one compile."""
    from colossal_jax.training.steps import make_train_step

    params = abstract_like(run.abstract_params, run.param_shardings)
    opt = abstract_like(jax.eval_shape(run.tx.init, run.abstract_params), run.opt_shardings)
    stats = _stats(
        make_train_step(run).lower(params, opt, abstract_batch(run, train_step=True)).compile()
    )
    return {
        "step_bytes": step_footprint(stats),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "peak_bytes": int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
        "formula_bytes": formula_bytes(run)["formula_bytes"],
        "n_params": param_count(run.model),
    }


def largest_fitting(
    zero: int,
    budget: int,
    *,
    depths: Iterable[int],
    widths: Iterable[int],
    batch: int,
    seq: int,
    devices: int = 8,
    remat: str = "full",
    log=None,
) -> dict:
    """The largest GPT of the ``depths × widths`` grid whose compiled train step fits ``budget``
    bytes per device at ``zero``. Pruning, none of which can hide a larger fitting model (the
    footprint grows with depth and with width): a candidate whose state formula alone exceeds the
    budget, or that the run's own host-memory check refuses, is not compiled (it cannot fit); a
    candidate with no more parameters than a fitting one already found is not compiled (it cannot
    be the answer); for each width depth grows until a compiled candidate does not fit; when the
    shallowest depth of a width does not fit, wider ones are not tried."""
    from colossal_jax.config import ConfigError
    from colossal_jax.training.run import build

    tried: list[dict] = []
    best: dict | None = None
    depths, widths = sorted(depths), sorted(widths)
    for h in widths:
        for L in depths:
            model = Model(n_layer=L, n_embd=h, batch=batch, seq=seq)
            rec: dict = {"n_layer": L, "n_embd": h}
            t0 = time.perf_counter()
            try:
                run = build(config(model, zero, "none", remat, devices))
            except ConfigError as e:
                rec |= {"fits": False, "compiled": False, "why": f"refused: {e}"}
            else:
                formula = formula_bytes(run)["formula_bytes"]
                rec |= {"n_params": param_count(run.model), "formula_bytes": formula}
                if formula > budget:
                    rec |= {"fits": False, "compiled": False, "why": "state formula > budget"}
                elif best is not None and rec["n_params"] <= best["n_params"]:
                    rec |= {"fits": None, "compiled": False, "why": "smaller than a fitting one"}
                else:
                    rec |= step_bytes(run)
                    rec |= {"fits": rec["step_bytes"] <= budget, "compiled": True}
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            tried.append(rec)
            if log is not None:
                log(rec)
            if rec["fits"]:
                best = rec
            elif rec["fits"] is False:
                break
        if tried[-1]["n_layer"] == depths[0] and tried[-1]["fits"] is False:
            break
    return {"zero": zero, "budget_bytes": budget, "best": best, "tried": tried}


def remat_temporaries(seq: int = 1024, *, devices: int = 8, n_layer: int = 4) -> list[dict]:
    """The train step's compiled temporary bytes per ``--remat`` mode for gpt2-tiny (hidden 128,
    8 heads) with ``n_layer`` layers at sequence ``seq`` (block size ``seq``), batch 8, ZeRO-0 on
    ``data=devices``: what activation checkpointing removes."""
    import dataclasses

    from colossal_jax.parallel.remat import REMAT_MODES
    from colossal_jax.training.run import build

    out = []
    for remat in REMAT_MODES:
        cfg = dataclasses.replace(
            config(
                Model(n_layer=n_layer, n_embd=128, batch=8, seq=seq),
                0,
                remat=remat,
                devices=devices,
            ),
            model_overrides={"n_layer": n_layer, "block_size": seq},
        )
        out.append({"remat": remat, "seq": seq, **step_bytes(build(cfg))})
    return out
