"""The throughput harness's baseline computes what the library computes, and its JSON record.

- The plain-JAX GPT (``benchmarks/plain_jax_gpt.py``), given the library's parameters, has the
  library's loss on the same batch (Megatron 1D sharding): a baseline computing something else
  would make every ratio meaningless.
- ``scripts/bench_throughput.py`` on the GSPMD 2D mesh at a tiny size: the record has every
  field, the baseline's first loss (same parameters, same batch) equals the library's, and its
  next losses follow (same gradients, same optax optimizer).
"""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

from benchmarks import plain_jax_gpt as pj
from benchmarks.throughput import main as bench_main
from tests.helpers import TINY_MODEL, tiny_config

T = importlib.import_module("colossal_jax.train")

SMALL = {**TINY_MODEL, "n_layer": 1, "n_head": 8, "n_embd": 32, "block_size": 16}


def test_plain_jax_loss_matches_library_1d():
    cfg = tiny_config(steps=2, batch_size=8, seq_len=16, tensor_row=8, tensor_mode="1d")
    cfg = dataclasses.replace(cfg, model_overrides=SMALL)
    run = T.build(cfg)
    params, _ = T.init_state(run)
    batch = {k: v for k, v in T.global_batch(run, 0).items() if k != "stop"}
    library_loss = float(T.make_eval_step(run)(params, batch)["loss"])

    plain = pj.build(run.model, run.tx, pj.make_mesh("1d", 1, 8, 1), "1d")
    plain_params, _ = plain.place(pj.from_library(params))
    loss = plain.loss(plain_params, plain.put_batch(run.batches.batch(0)))
    assert float(loss) == pytest.approx(library_loss, rel=1e-6)


def test_bench_throughput_record(tmp_path):
    out = tmp_path / "bench.json"
    flags = ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d", "--batch-size", "8"]
    flags += ["--seq-len", "16", "--steps", "2", "--timed-steps", "2", "--bench-warmup", "0"]
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
    assert record["first_loss_diff"] < 1e-5 and record["max_loss_diff"] < 1e-4
    assert record["outside_step_fraction"] < 1
    assert record["loop"]["steps"] == 2 and record["loop"]["sync_loop_tokens_per_s"] > 0
