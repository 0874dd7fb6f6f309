"""Markdown tables of ``scripts/bench_throughput.py`` records (docs/performance.md's tables).

    python scripts/perf_tables.py docs/throughput_bench.json

prints the library-against-baseline table (step medians and mins, the median of paired ratios,
tokens/s, peak memory) and the training-loop table (the share of ``train()``'s loop and of
the old synchronous loop spent outside the compiled step, the differential figure against the
step dispatched back to back, both loops' tokens/s), one row per record.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def config_label(r: dict[str, Any]) -> tuple[str, str]:
    """(mesh and mode, model) of a record, from its flags and model."""
    flags = r["flags"]
    mesh = _flag(flags, "--mesh") or f"data={r['devices_used']}"
    mode = _flag(flags, "--tensor-mode")
    m = r["model"]
    model = f"{m['n_layer']} layers, h={m['n_embd']}, seq {r['seq_len']}, batch {r['batch_size']}"
    return (f"`{mesh}`" + (f" {mode}" if mode else ""), model)


def ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def throughput_table(records: list[dict[str, Any]]) -> str:
    rows = [
        "| mesh | model | library ms (median / min) | baseline ms (median / min) | "
        "ratio (median of pairs) | tokens/s | peak MB/device (library / baseline) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        mesh, model = config_label(r)
        lib, base = r["library_step_s"], r.get("baseline_step_s")
        peak = r.get("library_peak_memory") or {}
        bpeak = r.get("baseline_peak_memory") or {}
        rows.append(
            f"| {mesh} | {model} | {ms(lib['median'])} / {ms(lib['min'])} | "
            + (f"{ms(base['median'])} / {ms(base['min'])} ({r['baseline']})" if base else "—")
            + f" | **{r['ratio']:.3f}** | {r['tokens_per_s']:,.0f} | "
            + (
                f"{peak.get('peak', 0) / 2**20:.1f} / {bpeak.get('peak', 0) / 2**20:.1f}"
                if peak
                else "—"
            )
            + " |"
        )
    return "\n".join(rows)


def loop_table(records: list[dict[str, Any]]) -> str:
    rows = [
        "| mesh | model | outside the step: `train()` (old loop) | against back to back "
        "| `train()` tokens/s, mean / median step | old loop tokens/s, mean / median step "
        "| `train()` / old loop (windows) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lp = r.get("loop")
        if not lp:
            continue
        mesh, model = config_label(r)
        vs = r["vs_back_to_back"]["outside_step_fraction"]
        rows.append(
            f"| {mesh} | {model} | **{100 * r['outside_step_fraction']:.1f}%** "
            f"({100 * r['sync_outside_step_fraction']:.1f}%) | {100 * vs:+.1f}% | "
            f"{lp['loop_tokens_per_s']:,.0f} / {lp['median_tokens_per_s']:,.0f} | "
            f"{lp['sync_loop_tokens_per_s']:,.0f} / {lp['sync_median_tokens_per_s']:,.0f} | "
            + (f"**{lp['vs_sync']:.3f}** ({lp['repeats']}) |" if "vs_sync" in lp else "— |")
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", help="a JSON list written by scripts/bench_throughput.py --json")
    args = p.parse_args(argv)
    with open(args.json) as f:
        records = json.load(f)
    print(throughput_table(records))
    print()
    print(loop_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
