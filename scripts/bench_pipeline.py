#!/usr/bin/env python
"""Compile-only pipeline benchmark: memory and compute of every schedule, from compiled programs.

For the GPT (8 layers, 128 wide, 8 heads, byte vocabulary, sequence 128, batch 32, fp32) at
``p=4, M=8`` and ``p=2, M=4`` (the rest of the devices on ``data``), each schedule's train step is
compiled (never run) and measured:

- ``temp_bytes``: per-device temporary bytes of the compiled step (``memory_analysis``);
- ``flops_per_device``: matmul FLOPs the busiest device executes in one step, read from the
  compiled HLO (:func:`colossal_jax.analysis.hlo.matmul_flops`: loops times their trip counts, the
  tick
  switch's branches times how often the table runs them on that stage);
- ``xla_cost_flops``: XLA's own ``cost_analysis()`` figure for comparison (it counts a loop body
  once and a conditional as its costliest branch, so it is not a per-step count);
- ``model_flops``: the model's training FLOPs per step, ``(6·N + 12·L·s·h)·tokens`` for the
  global batch; one pipeline replica (of ``data``) processes ``model_flops/data`` of it, so a
  stage's share is ``model_flops/(data·p)``;
- ``bubble_fraction``, ``ticks``, ``busy_ticks`` from the tick table, and
  ``bound = 1.05 · model_flops/(data·p) · ticks/busy_ticks`` with ``flops_per_device / bound``.

A reference row compiles the unpipelined step on ``data = devices`` with the same model and
batch: its ``flops_per_device`` against ``model_flops/devices`` checks the HLO count itself.

Example:
  python scripts/bench_pipeline.py --devices 8 --json pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

CASES = [(4, 8), (2, 4)]
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]
MODEL = {"n_layer": 8, "n_embd": 128, "n_head": 8, "block_size": 128}


def _config(p: int, schedule: str, m: int, v: int, devices: int, batch: int, seq: int):
    from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

    if p == 1:
        parallel = ParallelConfig(data=devices)
    else:
        parallel = ParallelConfig(
            data=devices // p, pipe=p, pipeline=schedule, microbatches=m, virtual_stages=v
        )
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides=dict(MODEL),
        steps=10,
        batch_size=batch,
        seq_len=seq,
        devices=devices,
        optim=OptimConfig(),
        parallel=parallel,
    )


def measure(schedule: str, p: int, m: int, v: int, devices: int, batch: int, seq: int) -> dict:
    import jax

    from colossal_jax.analysis.hlo import matmul_flops
    from colossal_jax.pipeline.schedule import BRANCHES
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.checkpoint import abstract_like
    from colossal_jax.training.run import build
    from colossal_jax.training.steps import make_train_step

    run = build(_config(p, schedule, m, v, devices, batch, seq))
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
        "xla_cost_flops": float(cost.get("flops", 0.0)),
        "model_flops": model_flops,
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
        }
    per_stage = [matmul_flops(text, {len(BRANCHES): sched.branch_counts(s)}) for s in range(p)]
    busiest = max(range(p), key=lambda s: per_stage[s])
    busy = sched.busy_ticks(busiest)
    bound = 1.05 * model_flops / (data * p) * sched.ticks / busy
    return record | {
        "flops_per_device": per_stage[busiest],
        "flops_per_stage": per_stage,
        "bubble_fraction": sched.idle_fraction(),
        "ticks": sched.ticks,
        "busy_ticks": busy,
        "bound": bound,
        "flops_over_bound": per_stage[busiest] / bound,
        "residual_slots": sched.slots["residual"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--json", default=None, help="write the records here")
    args = parser.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    records = []
    header = (
        f"{'schedule':12s} {'p':>2s} {'M':>2s} {'V':>2s} {'temp MiB':>9s} {'GFLOP/dev':>10s} "
        f"{'share':>8s} {'bound':>8s} {'/bound':>7s} {'bubble':>7s}"
    )
    print(header)
    cases = [("none", 1, 1, 1)] + [(n, p, m, v) for p, m in CASES for n, v in SCHEDULES]
    for name, p, m, v in cases:
        r = measure(name, p, m, v, args.devices, args.batch_size, args.seq_len)
        records.append(r)
        share = r["model_flops"] / (r["data"] * p)
        print(
            f"{name:12s} {p:2d} {m:2d} {v:2d} {r['temp_bytes'] / 2**20:9.2f} "
            f"{r['flops_per_device'] / 1e9:10.3f} {share / 1e9:8.3f} "
            f"{r['bound'] / 1e9:8.3f} {r['flops_over_bound']:7.3f} "
            f"{r['bubble_fraction']:7.4f}"
        )
    for p, m in CASES:
        by = {r["schedule"]: r for r in records if r["stages"] == p}
        ratio = by["1f1b"]["temp_bytes"] / by["gpipe"]["temp_bytes"]
        print(f"p={p} M={m}: 1F1B temp bytes / GPipe = {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
