"""The throughput harness's baseline computes what the library computes, and its JSON record.

``scripts/bench_throughput.py`` on the GSPMD 2D mesh (data=2, tensor 2×2) at a tiny size, two
timed steps, in-process: the record has every field; the plain-JAX GPT
(``benchmarks/plain_jax_gpt.py``), started from the library's parameters, has the library's
loss on the first batch (equal parameters: a baseline computing something else would make every
ratio meaningless), and its next losses follow the library's (the same gradients, the same
optax optimizer).
"""

from __future__ import annotations

import json

import pytest

from colossal_jax_benchmarks.throughput import main as bench_main
from colossal_jax_benchmarks.throughput import neighbour_ratios
from tests.helpers import TINY_MODEL

SMALL = {**TINY_MODEL, "n_layer": 1, "n_head": 8, "n_embd": 32, "block_size": 16}


def test_bench_throughput_record(tmp_path):
    out = tmp_path / "bench.json"
    flags = ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d", "--batch-size", "8"]
    flags += ["--seq-len", "16", "--steps", "2", "--timed-steps", "2", "--bench-warmup", "0"]
    flags += ["--loop-repeats", "2"]
    flags += [f"--set=model.{k}={v}" for k, v in SMALL.items()]
    assert bench_main([*flags, "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    for key in (
        "flags",
        "baseline",
        "library_step_s",
        "baseline_step_s",
        "ratio",
        "outside_step_fraction",
        "tokens_per_s",
        "mfu",
        "model_tflops_per_device",
        "library_peak_memory",
        "library_compile_s",
        "baseline_compile_s",
        "loop",
    ):
        assert key in record, key
    assert record["baseline"] == "plain-jax" and record["flags"][:2] == flags[:2]
    for side in ("library_step_s", "baseline_step_s"):
        assert 0 < record[side]["min"] <= record[side]["median"]
    assert record["ratio"] > 0 and record["tokens_per_s"] > 0
    assert record["mfu"] is None  # a CPU has no known peak
    assert record["library_peak_memory"]["peak"] > 0
    assert record["first_loss_diff"] < 1e-5, "the baseline's loss at the library's parameters"
    assert record["max_loss_diff"] < 1e-4, "the baseline's next steps (gradients, optimizer)"
    assert record["outside_step_fraction"] < 1
    assert record["loop"]["steps"] == 2 and record["loop"]["sync_loop_tokens_per_s"] > 0
    assert record["loop"]["repeats"] == 2 and len(record["loop"]["windows"]["sync"]["host"]) == 3
    assert 0 <= record["outside_step_fraction"] < 1
    assert record["loop"]["loop_step_s_source"].startswith("mean of Summary.step_times")
    assert len(record["loop"]["vs_sync_windows"]) == 2 and record["loop"]["vs_sync"] > 0

    from scripts.perf_tables import loop_table, throughput_table

    row = throughput_table([record]).splitlines()[2]
    assert row.startswith(f"| `{flags[1]}`") and f"**{record['ratio']:.3f}**" in row
    row = loop_table([record]).splitlines()[2]
    assert f"**{100 * record['outside_step_fraction']:.1f}%**" in row
    assert row.endswith(f"**{record['loop']['vs_sync']:.3f}** (2) |")


def test_neighbour_ratios():
    # train() windows of 10 and 8 ms per step between old-loop windows of 9, 11 and 12 ms:
    # 10 ms against (9 + 11) / 2 is equal speed, 8 ms against 11.5 is 1.4375x the tokens/s
    assert neighbour_ratios([0.010, 0.008], [0.009, 0.011, 0.012]) == pytest.approx([1, 1.4375])
    with pytest.raises(ValueError, match="2 train\\(\\) windows need 3 old-loop windows"):
        neighbour_ratios([0.01, 0.01], [0.01, 0.01])


def test_bench_refuses_what_its_baseline_cannot_mirror(tmp_path, capsys):
    out = str(tmp_path / "bench.json")
    cases = [
        (["--baseline", "tf"], "--baseline 'tf' is not one of plain-jax, torch, none"),
        (["--timed-steps", "1"], "--timed-steps 1"),
        (["--mesh", "seq=8"], "not seq=8; e.g. --mesh data=2,tensor=4 --tensor-mode 2d"),
        (["--zero", "1"], "not --zero 1"),
        (["--baseline", "torch", "--optimizer", "sgd"], "AdamW only, not --optimizer sgd"),
    ]
    for flags, message in cases:
        assert bench_main([*flags, "--json", out]) == 2, flags
        assert message in capsys.readouterr().err, flags
    assert not (tmp_path / "bench.json").exists()
