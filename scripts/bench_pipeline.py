#!/usr/bin/env python
"""Compile-only pipeline benchmark: memory and compute of every schedule, from compiled programs.

For the GPT (8 layers, 128 wide, 8 heads, byte vocabulary, sequence 128, batch 32, fp32) at
``p=4, M=8`` and ``p=2, M=4`` (the rest of the devices on ``data``), each schedule's train step is
compiled (never run) and measured:

- ``temp_bytes``: per-device temporary bytes of the compiled step (``memory_analysis``);
- ``flops_per_device``: matmul FLOPs the busiest device executes in one step, read from the
  compiled HLO (:func:`colossal_jax.analysis.compute.matmul_flops`: loops times their trip
  counts, the tick switch's branches times how often the table runs them on that stage);
- ``xla_cost_flops``: XLA's own ``cost_analysis()`` figure for comparison (it counts a loop body
  once and a conditional as its costliest branch, so it is not a per-step count);
- ``model_flops``: the model's training FLOPs per step, ``(6·N + 12·L·s·h)·tokens`` for the
  global batch; one pipeline replica (of ``data``) processes ``model_flops/data`` of it, so a
  stage's share is ``model_flops/(data·p)``;
- ``bubble_fraction``, ``ticks``, ``busy_ticks`` from the tick table, and
  ``bound = 1.05 · model_flops/(data·p) · ticks/busy_ticks`` with ``flops_per_device / bound``;
- ``branch_flops``: matmul FLOPs of one run of each branch of the tick switch (the busiest
  stage's table with that branch alone, minus the idle branch alone, over the ticks), and from
  them (:mod:`colossal_jax.pipeline.timing`, every operation weighed by its branch's FLOPs):
  ``weighted_idle`` (each stage running its order as soon as its input is there),
  ``lockstep_time`` and ``lockstep_idle`` (every tick as long as its costliest operation: the
  one-program executor), in FLOPs;
- ``bytes_per_device``: bytes every collective moves per device in one step (ring model,
  :func:`colossal_jax.analysis.hlo.bytes_moved`), the busiest stage's, each branch of the tick
  switch and of the message switch counted on the ticks that run it;
- ``state_bytes``: the step's argument bytes per device (parameters, optimizer state, batch;
  ``memory_analysis``), and ``rest_state_bytes``: the part of the parameters and optimizer state
  that is the embedding, final norm and head (a pipeline stores them split over ``pipe``;
  ``--vocab 50257`` shows it at GPT-2's vocabulary).

A reference row compiles the unpipelined step on ``data = devices`` with the same model and
batch: its ``flops_per_device`` against ``model_flops/devices`` checks the HLO count itself.

Example:
  python scripts/bench_pipeline.py --devices 8 --json pipeline.json
  python scripts/bench_pipeline.py --cases 4x8 --schedules 1f1b,zb-h1,zb-v   # a subset
  python scripts/bench_pipeline.py --cases 4x8 --schedules 1f1b,zb-h1,zb-v --remat none
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

CASES = [(4, 8), (2, 4)]
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-v", 2)]
MODEL = {"n_layer": 8, "n_embd": 128, "n_head": 8, "block_size": 128}


def _config(
    p: int,
    schedule: str,
    m: int,
    v: int,
    devices: int,
    batch: int,
    seq: int,
    vocab: int = 0,
    remat: str = "dots",
):
    from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

    if p == 1:
        parallel = ParallelConfig(data=devices)
    else:
        parallel = ParallelConfig(
            data=devices // p, pipe=p, pipeline=schedule, microbatches=m, virtual_stages=v
        )
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides=dict(MODEL) | ({"vocab_size": vocab} if vocab else {}),
        steps=10,
        batch_size=batch,
        seq_len=seq,
        devices=devices,
        optim=OptimConfig(),
        parallel=parallel,
        remat=remat,
    )


def _bytes(text: str, sched) -> float:
    """Bytes every collective moves per device in one step; for a pipeline, its busiest
    stage's, each branch of the tick switch and of the message switch counted on the ticks the
    table runs it (a ring's ``ppermute`` runs only on ticks that carry a message)."""
    from colossal_jax.analysis.hlo import bytes_moved

    if sched is None:
        return bytes_moved(text)
    rings = sched.ring_counts()
    return max(
        bytes_moved(text, {len(sched.branches): sched.branch_counts(s), len(rings): rings})
        for s in range(sched.stages)
    )


def measure(
    schedule: str, p: int, m: int, v: int, devices: int, batch: int, seq: int, **options
) -> dict:
    """One schedule's compiled figures (module docstring); ``options``: ``vocab``, ``remat``."""
    import jax

    from colossal_jax.analysis.compute import matmul_flops
    from colossal_jax.pipeline.timing import weigh
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.checkpoint import abstract_like
    from colossal_jax.training.run import build
    from colossal_jax.training.steps import make_train_step

    run = build(_config(p, schedule, m, v, devices, batch, seq, **options))
    abstract_params = abstract_like(run.abstract_params, run.param_shardings)
    opt_shapes = jax.eval_shape(run.tx.init, run.abstract_params)
    abstract_opt = abstract_like(opt_shapes, run.opt_shardings)
    compiled = (
        make_train_step(run).lower(abstract_params, abstract_opt, global_batch(run, 0)).compile()
    )
    text = compiled.as_text()
    sched = run.schedule
    data = run.cfg.parallel.data
    model_flops = run.model.flops_per_token(seq) * batch * seq
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    record = {
        "schedule": schedule,
        "stages": p,
        "data": data,
        "microbatches": m,
        "virtual_stages": v,
        "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
        "state_bytes": int(compiled.memory_analysis().argument_size_in_bytes),
        "rest_state_bytes": _rest_state_bytes(run),
        "xla_cost_flops": float(cost.get("flops", 0.0)),
        "model_flops": model_flops,
        "bytes_per_device": _bytes(text, sched),
    }
    if sched is None:
        flops = matmul_flops(text)
        return record | {
            "flops_per_device": flops,
            "flops_per_stage": [flops],
            "bubble_fraction": 0.0,
            "ticks": 1,
            "busy_ticks": 1,
            "bound": 1.05 * model_flops / data,
            "flops_over_bound": flops / (1.05 * model_flops / data),
            "residual_slots": 0,
            "weighted_idle": 0.0,
            "lockstep_idle": 0.0,
        }
    n = len(sched.branches)
    per_stage = [matmul_flops(text, {n: sched.branch_counts(s)}) for s in range(p)]
    busiest = max(range(p), key=lambda s: per_stage[s])
    busy = sched.busy_ticks(busiest)
    bound = 1.05 * model_flops / (data * p) * sched.ticks / busy
    branch_flops = _branch_flops(text, sched.ticks, sched.branches)
    timing = weigh(sched, branch_flops)
    return record | {
        "flops_per_device": per_stage[busiest],
        "flops_per_stage": per_stage,
        "bubble_fraction": sched.idle_fraction(),
        "ticks": sched.ticks,
        "busy_ticks": busy,
        "bound": bound,
        "flops_over_bound": per_stage[busiest] / bound,
        "residual_slots": sched.slots["residual"],
        "slots": sched.slots,
        "branch_flops": branch_flops,
        "weighted_idle": timing.idle_fraction,
        "weighted_step_flops": timing.step_time,
        "lockstep_time": timing.lockstep_time,
        "lockstep_idle": timing.lockstep_idle_fraction,
    }


def _rest_state_bytes(run) -> int:
    """Bytes per device of the unstacked parameters (embedding, final norm, head) and of their
    optimizer state, from the run's shardings (a pipeline stores them split over ``pipe``)."""
    import math

    import jax
    from jax.sharding import NamedSharding

    from colossal_jax.layers.stack import is_stacked
    from colossal_jax.parallel.sharding import is_variable

    def per_device(tree, shardings) -> int:
        leaves, treedef = jax.tree.flatten(tree, is_leaf=is_variable)
        where = treedef.flatten_up_to(shardings)
        total = 0
        for leaf, sh in zip(leaves, where, strict=True):
            if is_variable(leaf) and not is_stacked(leaf) and isinstance(sh, NamedSharding):
                a = leaf.get_value()
                total += math.prod(sh.shard_shape(a.shape)) * a.dtype.itemsize
        return total

    opt = jax.eval_shape(run.tx.init, run.abstract_params)
    return per_device(run.abstract_params, run.param_shardings) + per_device(opt, run.opt_shardings)


def _branch_flops(text: str, ticks: int, branches: tuple[str, ...]) -> dict[str, float]:
    """Matmul FLOPs of one run of each tick-switch branch (the switch run ``ticks`` times)."""
    from colossal_jax.analysis.compute import matmul_flops

    n = len(branches)

    def alone(i: int) -> float:
        return matmul_flops(text, {n: [int(j == i) for j in range(n)]})

    idle = alone(branches.index("idle"))
    return {b: (alone(i) - idle) / ticks for i, b in enumerate(branches) if b != "idle"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--cases", default="4x8,2x4", help="pipe x microbatches, e.g. 4x8")
    parser.add_argument("--schedules", default=",".join(n for n, _ in SCHEDULES))
    parser.add_argument("--json", default=None, help="write the records here")
    parser.add_argument(
        "--vocab", type=int, default=0, help="vocabulary size (default: the bytes, 256)"
    )
    parser.add_argument(
        "--remat",
        default="dots",
        choices=("none", "dots", "full", "selective", "offload"),
        help="remat policy of every step (default: dots, the library's default)",
    )
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    wanted = args.schedules.split(",")
    records = []
    print(
        f"{'schedule':12s} {'p':>2s} {'M':>2s} {'V':>2s} {'temp MiB':>9s} {'GFLOP/dev':>10s} "
        f"{'/bound':>7s} {'bubble':>7s} {'w.idle':>7s} {'ls.idle':>7s} {'MiB moved':>9s} "
        f"{'state MiB':>9s} {'rest MiB':>8s}"
    )
    runs = [("none", 1, 1, 1)] + [
        (n, p, m, v) for p, m in cases for n, v in SCHEDULES if n in wanted
    ]
    for name, p, m, v in runs:
        r = measure(
            name,
            p,
            m,
            v,
            args.devices,
            args.batch_size,
            args.seq_len,
            vocab=args.vocab,
            remat=args.remat,
        )
        records.append(r)
        print(
            f"{name:12s} {p:2d} {m:2d} {v:2d} {r['temp_bytes'] / 2**20:9.2f} "
            f"{r['flops_per_device'] / 1e9:10.3f} {r['flops_over_bound']:7.3f} "
            f"{r['bubble_fraction']:7.4f} {r['weighted_idle']:7.4f} {r['lockstep_idle']:7.4f} "
            f"{r['bytes_per_device'] / 2**20:9.2f} {r['state_bytes'] / 2**20:9.2f} "
            f"{r['rest_state_bytes'] / 2**20:8.2f}",
            flush=True,
        )
    _summary(records, cases)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")
    return 0


def _summary(records: list[dict], cases: list[tuple[int, int]]) -> None:
    """Each schedule against 1F1B at the same ``p, M``: FLOPs, temporaries, idle, bytes."""
    for p, m in cases:
        by = {r["schedule"]: r for r in records if r["stages"] == p and r["microbatches"] == m}
        base = by.get("1f1b")
        if base is None:
            continue
        for name, r in by.items():
            if name == "1f1b":
                continue
            flops = r["flops_per_device"] / base["flops_per_device"]
            print(
                f"p={p} M={m} {name} / 1f1b: FLOPs/dev {flops:.4f}, "
                f"temp {r['temp_bytes'] / base['temp_bytes']:.3f}, weighted idle "
                f"{r['weighted_idle'] / base['weighted_idle']:.3f}, lockstep idle "
                f"{r['lockstep_idle'] / base['lockstep_idle']:.3f}, lockstep time "
                f"{r['lockstep_time'] / base['lockstep_time']:.3f}, bytes "
                f"{r['bytes_per_device'] / base['bytes_per_device']:.3f}"
            )


if __name__ == "__main__":
    sys.exit(main())
