"""The Python API: exports, simulated devices, train() results, held-out evaluation."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import colossal_jax as cj
from colossal_jax.data.corpus import Batches, load_corpus, split_corpus

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, **env_over) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env.update(env_over)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=ROOT,
    )


def test_exports_exist_with_docstrings():
    for name in cj.__all__:
        obj = getattr(cj, name)
        if name == "MODELS":
            assert "gpt2-tiny" in obj
            continue
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
    assert cj.TrainResult is cj.Summary
    assert cj.model_config("gpt2-tiny", n_layer=3).n_layer == 3
    assert cj.parse_mesh("tensor=4", 8, tensor_mode="1d") == {"tensor_row": 4, "data": 2}


def test_import_is_lazy_and_simulate_cpu_devices_works_after_it():
    proc = _python(
        """
        import sys
        import colossal_jax as cj
        assert "jax" not in sys.modules, "import colossal_jax imported jax"
        cj.simulate_cpu_devices(4)
        import jax
        print("devices", jax.device_count())
        try:
            cj.simulate_cpu_devices(16)
        except cj.ConfigError as e:
            print("late:", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "devices 4" in proc.stdout
    assert "late: simulate_cpu_devices(16) came too late" in proc.stdout
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=16" in proc.stdout


def test_too_few_devices_names_simulate_cpu_devices():
    proc = _python(
        """
        import colossal_jax as cj
        for cfg in (cj.TrainConfig(devices=8, steps=1),
                    cj.TrainConfig(steps=1, parallel=cj.ParallelConfig(data=8))):
            try:
                cj.train(cfg, progress=False)
            except cj.ConfigError as e:
                print("error:", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("error:")]
    assert len(lines) == 2, proc.stdout
    assert "--devices 8 but only 1 are available" in lines[0]
    for line in lines:
        assert "colossal_jax.simulate_cpu_devices(8)" in line, line


SMALL = dict(model_overrides={"n_layer": 2, "n_embd": 64, "n_head": 4}, batch_size=8, seq_len=32)


def test_train_returns_state_and_eval_loss_decreases(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cfg = cj.TrainConfig(
        steps=30,
        eval_every=10,
        eval_batches=2,
        peak_tflops=1.0,
        metrics_file=str(metrics),
        parallel=cj.ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
        **SMALL,
    )
    lines: list[str] = []
    result = cj.train(cfg, progress=False, log=lines.append)
    assert isinstance(result, cj.TrainResult) and len(result.losses) == 30
    got = jax.tree.map(lambda x: x.shape, result.params)
    want = jax.tree.map(lambda x: x.shape, result.run.abstract_params)
    assert got == want
    assert jax.tree.structure(result.opt_state) is not None and result.mfu is not None
    assert [s for s, _ in result.eval_losses] == [0, 10, 20, 30]
    assert result.final_eval_loss < 0.9 * result.first_eval_loss
    records = [json.loads(x) for x in metrics.read_text().splitlines()]
    evals = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    assert sorted(evals) == [0, 10, 20, 30]
    assert evals[30] == pytest.approx(result.final_eval_loss)
    assert any("eval loss" in x for x in lines)
    # the returned state evaluates to the same held-out loss
    assert cj.evaluate(result.run, result.params) == pytest.approx(result.final_eval_loss, 1e-5)


def test_pipelined_run_evaluates():
    cfg = cj.TrainConfig(
        steps=2,
        eval_every=1,
        eval_batches=1,
        parallel=cj.ParallelConfig(data=4, pipe=2, pipeline="1f1b", microbatches=2),
        **SMALL,
    )
    result = cj.train(cfg, progress=False, log=lambda _: None)
    assert len(result.eval_losses) == 3 and all(np.isfinite(v) for _, v in result.eval_losses)


def test_held_out_split_is_disjoint_from_training_batches(tmp_path):
    path = tmp_path / "positions.npy"
    np.save(path, np.arange(20_000, dtype=np.int32))  # each token id is its own position
    corpus = load_corpus(str(path))
    train, held = split_corpus(corpus, seq_len=16)
    boundary = len(train.tokens)
    assert boundary + len(held.tokens) == 20_000 and len(held.tokens) >= 0.05 * 20_000
    assert held.tokens[0] == boundary and train.vocab_size == held.vocab_size == 20_000
    tb = Batches(train, 32, 16, seed=0, vocab_size=20_000)
    eb = Batches(held, 32, 16, seed=0, vocab_size=20_000)
    for step in range(200):
        b = tb.batch(step)
        assert b["tokens"].max() < boundary and b["targets"].max() < boundary
    for i in range(4):
        assert eb.batch(i)["tokens"].min() >= boundary
    # the run itself trains on the training split only
    run = cj.build(cj.TrainConfig(steps=1, parallel=cj.ParallelConfig(data=8), **SMALL))
    full = load_corpus("stdlib").tokens
    n_train = len(run.batches.corpus.tokens)
    assert n_train < len(full) and len(run.eval_batches.corpus.tokens) == len(full) - n_train


def test_small_corpus_has_at_least_a_few_eval_sequences_or_none(tmp_path):
    t = tmp_path / "a.txt"
    t.write_text("x" * 200)
    train, held = split_corpus(load_corpus(str(t)), seq_len=16)
    assert len(held.tokens) == 4 * 17 and len(train.tokens) == 200 - 68
    _, none = split_corpus(load_corpus(str(t)), seq_len=120)
    assert none is None
    _, synthetic = split_corpus(load_corpus("synthetic"), seq_len=16)
    assert synthetic is None


def test_repeating_corpus_gets_one_note(tmp_path):
    t = tmp_path / "small.txt"
    t.write_text("the quick brown fox jumps over the lazy dog\n" * 10)
    cfg = cj.TrainConfig(steps=3, data=str(t), eval_every=0, devices=1, **SMALL)
    lines: list[str] = []
    result = cj.train(cfg, progress=False, log=lines.append)
    notes = [x for x in lines if x.startswith("note:")]
    assert len(notes) == 1 and "epochs" in notes[0], lines
    assert result.eval_losses == [] and result.final_eval_loss is None


def test_bad_eval_and_peak_values():
    with pytest.raises(cj.ConfigError, match="--eval-every -1"):
        cj.TrainConfig(eval_every=-1).validate()
    with pytest.raises(cj.ConfigError, match="--peak-tflops"):
        cj.TrainConfig(peak_tflops=0.0).validate()
