#!/usr/bin/env python
"""Mesh invariance of the model families: a family's 10-step fp32 loss curve under every tensor
mode, the sequence modes (text families) and the 1F1B pipeline against ``--mesh data=8``.

  python scripts/compare_families.py --model bert-tiny --model vit-tiny \\
      --json docs/family_meshes.json

Each run is ``scripts/train.py`` in its own process on simulated CPU devices (``--devices``;
2.5D uses 16), with ``--precision fp32 --steps 10 --warmup-steps 2 --eval-every 0`` and the
family's default data. Prints the largest relative difference of each mode's losses from the
``data=8`` run's, step by step, writes every curve to ``--json``, and exits with status 1 if any
exceeds ``--rtol`` (1e-4).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REFERENCE = ["--mesh", "data=8"]
MODES: dict[str, list[str]] = {
    "1d": ["--mesh", "tensor=8", "--tensor-mode", "1d"],
    "2d": ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d"],
    "2.5d": [
        "--devices",
        "16",
        "--mesh",
        "tensor_row=2,tensor_col=2,tensor_depth=4",
        "--tensor-mode",
        "2.5d",
    ],
    "3d": ["--mesh", "tensor=8", "--tensor-mode", "3d"],
    "ring": ["--mesh", "seq=8", "--seq-mode", "ring"],
    "ulysses": ["--mesh", "data=2,seq=4", "--seq-mode", "ulysses"],
    "1f1b": ["--mesh", "pipe=2,data=4"],
}
SEQUENCE_MODES = ("ring", "ulysses")
"""Text families only: an image is a few tokens (5 for vit-tiny), not a sequence to split."""
BATCH = {"image_classification": 32}
"""Global batch per task (others: 16), divisible by every mode's batch shards × microbatches."""


def losses(model: str, flags: list[str], batch: int, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.jsonl"
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
        cmd = [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            "--model",
            model,
            "--steps",
            str(steps),
            "--batch-size",
            str(batch),
            "--precision",
            "fp32",
            "--warmup-steps",
            "2",
            "--eval-every",
            "0",
            "--no-progress",
            "--metrics-file",
            str(metrics),
            *flags,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        return [r["loss"] for r in records if "loss" in r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", action="append", help="a model (repeatable; default bert-tiny and vit-tiny)"
    )
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--json", type=Path, default=None, help="write the curves and differences here")
    args = p.parse_args(argv)
    from colossal_jax.config.families import task_of

    models = args.model or ["bert-tiny", "vit-tiny"]
    out: dict = {"steps": args.steps, "rtol": args.rtol, "reference": " ".join(REFERENCE)}
    ok = True
    print(f"{'model':10s} {'mode':8s} {'max rel diff':>12s}  flags")
    for model in models:
        task = task_of(model)
        batch = BATCH.get(task, 16)
        t0 = time.perf_counter()
        base = losses(model, REFERENCE, batch, args.steps)
        entry: dict = {"task": task, "batch_size": batch, "data=8": base, "modes": {}}
        for mode, flags in MODES.items():
            if mode in SEQUENCE_MODES and task == "image_classification":
                continue
            got = losses(model, flags, batch, args.steps)
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, base, strict=True))
            ok &= worst <= args.rtol
            entry["modes"][mode] = {"flags": " ".join(flags), "losses": got, "max_rel_diff": worst}
            print(f"{model:10s} {mode:8s} {worst:12.2e}  {' '.join(flags)}", flush=True)
        entry["wall_s"] = round(time.perf_counter() - t0, 1)
        out[model] = entry
        print(f"{model}: {base[0]:.4f} -> {base[-1]:.4f} over {args.steps} steps (data=8)")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print("all within rtol" if ok else f"some mode differs by more than {args.rtol}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
