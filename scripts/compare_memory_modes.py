"""Loss curves of the memory modes against plain data parallelism (``--zero 0``, fp32).

Trains the same short run under each ZeRO stage, gradient accumulation, host offload, remat and
their combinations with tensor, sequence and pipeline parallelism, and prints the largest relative
difference of each loss curve from the ``--zero 0`` curve (the issue's acceptance is 1e-4); then
bf16 and fp16 (dynamic loss scaling) against fp32 over 50 steps of the default run (2%). Exit 1
if either bound fails.

    python scripts/compare_memory_modes.py --devices 8 --steps 10 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CASES: list[tuple[str, dict, dict]] = [
    *[
        (f"zero{z} accum{a}", {"data": 8, "zero": z}, {"grad_accum": a})
        for z in range(4)
        for a in (1, 4)
    ],
    ("zero3 1d", {"data": 2, "tensor_row": 4, "tensor_mode": "1d", "zero": 3}, {}),
    ("zero2 2d", {"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d", "zero": 2}, {}),
    ("zero3 offload optimizer", {"data": 8, "zero": 3}, {"offload": "optimizer"}),
    ("zero3 offload params", {"data": 8, "zero": 3}, {"offload": "params"}),
    ("zero1 1f1b", {"data": 4, "pipe": 2, "zero": 1}, {}),
    ("zero3 1f1b accum2", {"data": 4, "pipe": 2, "zero": 3}, {"grad_accum": 2}),
    ("zero3 ring", {"data": 2, "seq": 4, "seq_mode": "ring", "zero": 3}, {}),
    ("remat full", {"data": 8}, {"remat": "full"}),
    ("remat selective", {"data": 8}, {"remat": "selective"}),
    ("remat offload", {"data": 8}, {"remat": "offload"}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--precision-steps",
        type=int,
        default=50,
        help="steps of the default run (gpt2-tiny, batch 16×128), bf16/fp16 vs fp32; 0: skip",
    )
    args = ap.parse_args(argv)
    from colossal_jax.runtime.devices import simulate_cpu_devices

    simulate_cpu_devices(args.devices)
    import numpy as np

    from colossal_jax.config import ParallelConfig, TrainConfig
    from colossal_jax.training.trainer import train

    def curve(par: dict, extra: dict) -> tuple[np.ndarray, float]:
        cfg = TrainConfig(
            steps=args.steps,
            batch_size=32,
            seq_len=64,
            eval_every=0,
            parallel=ParallelConfig(**par),
            **extra,
        )
        t0 = time.perf_counter()
        losses = train(cfg, progress=False, log=lambda _: None).losses
        return np.asarray(losses), time.perf_counter() - t0

    base, _ = curve({"data": args.devices}, {})
    print(f"zero0 fp32 data={args.devices}: loss {base[0]:.4f} -> {base[-1]:.4f}")
    print("| case | mesh | max relative difference | wall s |\n|---|---|---|---|")
    rows = []
    for name, par, extra in CASES:
        losses, wall = curve(par, extra)
        rel = float(np.max(np.abs(losses - base) / base))
        mesh = ",".join(f"{k}={v}" for k, v in par.items() if k != "zero")
        print(f"| {name} | {mesh} | {rel:.1e} | {wall:.1f} |", flush=True)
        rows.append({"case": name, "parallel": par, **extra, "max_rel_diff": rel})
    ok = all(r["max_rel_diff"] < 1e-4 for r in rows)
    if args.precision_steps:
        runs = {}
        for precision in ("fp32", "bf16", "fp16"):
            cfg = TrainConfig(
                steps=args.precision_steps,
                eval_every=0,
                precision=precision,
                parallel=ParallelConfig(data=args.devices),
            )
            runs[precision] = np.asarray(train(cfg, progress=False, log=lambda _: None).losses)
        print(f"\ndefault run, {args.precision_steps} steps, data={args.devices}:")
        print("| precision | final loss | max relative difference from fp32 |\n|---|---|---|")
        for precision, losses in runs.items():
            rel = float(np.max(np.abs(losses - runs["fp32"]) / runs["fp32"]))
            print(f"| {precision} | {losses[-1]:.4f} | {rel:.2e} |")
            rows.append({"case": f"precision {precision}", "max_rel_diff_vs_fp32": rel})
            ok = ok and rel < 0.02
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
