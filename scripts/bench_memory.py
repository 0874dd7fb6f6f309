#!/usr/bin/env python
"""Compile-only memory benchmark: per-device training state of ZeRO 0-3 × offload × remat, read
from XLA's compiled memory analysis, and the largest GPT each ZeRO stage fits in a budget.

Nothing executes: every figure is a field of ``compiled.memory_analysis()`` of the run's own
programs (see colossal_jax/memorybench.py for exactly which program and field each comes from).

1. The fixed model: gpt2-tiny with n_layer=4, n_embd=256, n_head=4 (vocabulary 256, learned
   positions over block 256; 3,356,160 parameters), batch 8 × seq 256, fp32 AdamW, on
   ``data=8``. For every ZeRO stage × ``--offload none|optimizer`` (and ``params`` at stage 3)
   with ``--remat full``, and every ``--remat`` mode at stages 0 and 3: param, grad, optimizer
   and temporary bytes per device, next to docs/formulas.md section 4 (leftover parameters,
   which ZeRO leaves replicated, counted whole).
2. For each stage, the largest GPT of the grid n_layer ∈ {2,4,8,12,16,24,32} × n_embd ∈
   {128,256,384,512,768,1024} (n_head = n_embd/64; remat full; batch 8 × seq 256, i.e. one
   sequence per device) whose compiled train step fits ``--budget-mib`` per device, footprint
   ``argument + output + temp − alias`` bytes.

On the CPU backend the compiler ignores ``pinned_host`` placement: offloaded state is still
counted in the argument bytes and the ``host_*`` fields are 0, and the ``offload`` remat policy
compiles to the same temporaries as ``full``. Offload savings need a GPU (or TPU) to show.

Example:
  python scripts/bench_memory.py --devices 8 --json docs/memory_bench.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEPTHS = (2, 4, 8, 12, 16, 24, 32)
WIDTHS = (128, 256, 384, 512, 768, 1024)
MIB = 2**20


def cases() -> list[tuple[int, str, str]]:
    """(zero, offload, remat): every stage × offload at remat full, every remat at stages 0, 3."""
    out = []
    for zero in range(4):
        for offload in ("none", "optimizer") + (("params",) if zero == 3 else ()):
            out.append((zero, offload, "full"))
        if zero in (0, 3):
            out += [(zero, "none", r) for r in ("none", "selective", "offload")]
    return out


def mib(b: float) -> str:
    return f"{b / MIB:.2f}"


def state_table(records: list[dict]) -> str:
    head = (
        "| zero | offload | remat | param MiB | grad MiB | opt MiB | state MiB | formula MiB "
        "| ratio | temp MiB | step MiB |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in records:
        state = r["param_bytes"] + r["grad_bytes"] + r["opt_bytes"]
        lines.append(
            f"| {r['zero']} | {r['offload']} | {r['remat']} | {mib(r['param_bytes'])} | "
            f"{mib(r['grad_bytes'])} | {mib(r['opt_bytes'])} | {mib(state)} | "
            f"{mib(r['formula_bytes'])} | {r['ratio']:.4f} | {mib(r['temp_bytes'])} | "
            f"{mib(r['step_bytes'])} |"
        )
    return "\n".join(lines)


def budget_table(results: list[dict]) -> str:
    base = results[0]["best"]["n_params"] if results[0]["best"] else None
    lines = [
        "| zero | largest model | params | step MiB | formula state MiB | temp MiB | × stage 0 "
        "| compiled |",
        "|" + "---|" * 8,
    ]
    for res in results:
        b = res["best"]
        compiled = sum(1 for r in res["tried"] if r["compiled"])
        if b is None:
            lines.append(f"| {res['zero']} | none fits | | | | | | {compiled} |")
            continue
        ratio = f"{b['n_params'] / base:.2f}" if base else "n/a"
        lines.append(
            f"| {res['zero']} | n_layer={b['n_layer']} n_embd={b['n_embd']} | "
            f"{b['n_params'] / 1e6:.2f}M | {mib(b['step_bytes'])} | {mib(b['formula_bytes'])} | "
            f"{mib(b['temp_bytes'])} | {ratio} | {compiled} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated host devices, all on data")
    p.add_argument("--json", type=Path, help="write the records to this file")
    p.add_argument("--budget-mib", type=float, default=256.0, help="per-device budget (MiB)")
    p.add_argument("--batch-size", type=int, default=8, help="global batch of both parts")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (≤ 256)")
    p.add_argument("--skip-budget", action="store_true", help="skip the largest-model search")
    p.add_argument(
        "--remat-seq",
        type=int,
        default=1024,
        help="sequence length of the remat comparison (gpt2-tiny, 4 layers, batch 8); 0: skip",
    )
    args = p.parse_args(argv)
    if args.devices < 1:
        print(f"error: --devices {args.devices} must be at least 1", file=sys.stderr)
        return 2
    from colossal_jax.runtime.devices import simulate_cpu_devices

    simulate_cpu_devices(args.devices, force_cpu=True)
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from colossal_jax_benchmarks import memorybench as mb

    t_start = time.perf_counter()
    model = mb.Model(batch=args.batch_size, seq=args.seq_len)
    print(f"model: {model.describe()}; data={args.devices}; backend {jax.default_backend()}")
    records = []
    for zero, offload, remat in cases():
        r = mb.measure(model, zero, offload, remat, args.devices)
        records.append(r)
        print(
            f"  zero={zero} offload={offload:9s} remat={remat:9s} ratio {r['ratio']:.4f} "
            f"temp {mib(r['temp_bytes'])} MiB ({r['compile_s']:.1f}s)",
            flush=True,
        )
    print(f"n_params {records[0]['n_params']:,}; leftovers (replicated): {records[0]['leftovers']}")
    print(
        "\nPer-device bytes (MiB) from memory_analysis(); formula: docs/formulas.md §4 "
        f"(N_d={args.devices})\n"
    )
    print(state_table(records))

    output: dict = {
        "command": "python scripts/bench_memory.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "backend": jax.default_backend(),
        "n_devices": args.devices,
        "state": records,
    }
    if args.remat_seq:
        rows = mb.remat_temporaries(args.remat_seq, devices=args.devices)
        print(
            f"\nTrain-step temporaries per --remat at seq {args.remat_seq} (gpt2-tiny, 4 layers, "
            f"batch 8, zero 0, data={args.devices})\n\n| remat | temp MiB | × none |\n|---|---|---|"
        )
        none = rows[0]["temp_bytes"]
        for r in rows:
            print(f"| {r['remat']} | {mib(r['temp_bytes'])} | {r['temp_bytes'] / none:.2f} |")
        output["remat"] = rows
    if not args.skip_budget:
        budget = int(args.budget_mib * MIB)
        print(
            f"\nLargest GPT per stage under {args.budget_mib:g} MiB per device (train step "
            f"argument+output+temp−alias; remat full; batch {args.batch_size} × seq "
            f"{args.seq_len}; data={args.devices}); grid n_layer {DEPTHS} × n_embd {WIDTHS}\n"
        )
        results = []
        for zero in range(4):

            def log(rec, zero=zero):
                if rec["compiled"]:
                    print(
                        f"  zero={zero} L={rec['n_layer']:2d} h={rec['n_embd']:4d} "
                        f"{rec['n_params'] / 1e6:7.2f}M step {mib(rec['step_bytes']):>8s} MiB "
                        f"{'fits' if rec['fits'] else 'too big'} ({rec['seconds']:.1f}s)",
                        flush=True,
                    )

            results.append(
                mb.largest_fitting(
                    zero,
                    budget,
                    depths=DEPTHS,
                    widths=WIDTHS,
                    batch=args.batch_size,
                    seq=args.seq_len,
                    devices=args.devices,
                    log=log,
                )
            )
        print()
        print(budget_table(results))
        output["budget"] = {
            "budget_mib": args.budget_mib,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "remat": "full",
            "depths": DEPTHS,
            "widths": WIDTHS,
            "results": results,
        }
        if results[0]["best"] and results[3]["best"]:
            ratio = results[3]["best"]["n_params"] / results[0]["best"]["n_params"]
            output["budget"]["zero3_over_zero0"] = ratio
            print(f"\nstage 3 fits {ratio:.2f}× the parameters of stage 0")
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(output, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
