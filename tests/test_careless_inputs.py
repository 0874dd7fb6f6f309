"""Careless inputs: each is answered before anything compiles, with exit status 2 and exactly one
stderr line ``error: ...`` that names the bad value and a valid alternative; no traceback.

One table, ``CASES``: ``(argv, bad, fix)`` where ``bad`` names the bad value as the message must
quote it and ``fix`` is (part of) the valid alternative it must offer. ``{name}`` in an argument
is a file made by the ``files`` fixture. Every case runs in-process through ``cli.main``, with the
step that would first compile (``train.init_state``) replaced by a failure; a few run again as
real processes (``slow``) to prove there is no traceback and the answer takes under 20 s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from colossal_jax import cli
from colossal_jax.checks import preflight
from colossal_jax.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PROC = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")


def case(argv, bad, fix, *marks):
    return pytest.param(argv, bad, fix, marks=marks, id=" ".join(argv) or "(none)")


CASES = [
    # ---- output paths: checked for writability before JAX is imported
    case(["--tensorboard-dir", "/proc/tb"], "/proc/tb", "e.g. --tensorboard-dir", PROC),
    case(["--tensorboard-dir", "{file}"], "{file}", "name a new or existing directory"),
    case(["--metrics-file", "/proc/x.jsonl"], "/proc/x.jsonl", "e.g. --metrics-file", PROC),
    case(["--checkpoint-dir", "/proc/ckpt"], "/proc/ckpt", "e.g. --checkpoint-dir", PROC),
    case(["--checkpoint-dir", "{file}"], "{file}", "name a new or existing directory"),
    case(["--metrics-file", "{file}/m.jsonl"], "{file}", "is a file, not a directory"),
    case(["--metrics-file", "{dir}"], "{dir}", "name a file, e.g. --metrics-file {dir}/"),
    case(["--metrics-file", ""], "--metrics-file ''", "omit --metrics-file"),
    case(["--set", "metrics_file=/proc/m.jsonl"], "/proc/m.jsonl", "e.g. --metrics-file", PROC),
    # ---- data files
    case(["--data", "{negative}"], "negative token id -3", "must be 0 or more"),
    case(["--data", "{objects}"], "dtype object", "np.save(path, ids.astype(np.int32))"),
    case(["--data", "{halves}"], "0.5 at index 1", "ids.astype(np.int32)"),
    case(["--data", "{scalar}"], "shape ()", "ids.reshape(-1)"),
    case(["--data", "{matrix}"], "shape (10, 10)", "ids.reshape(-1)"),
    case(["--data", "{no_ids}"], "holds no tokens", "np.save"),
    case(["--data", "{bools}"], "dtype bool", "np.save"),
    case(["--data", "{huge}"], "token id 1099511627776", "below 2147483648"),
    case(["--data", "{not_npy}"], "is not a .npy file", "np.save"),
    case(["--data", "{empty_txt}"], "{empty_txt} is empty", "--data stdlib"),
    case(["--data", "{raw_bin}"], ".bin files are not read", "np.fromfile"),
    case(["--data", "nosuch.txt"], "'nosuch.txt' is not a file", "use stdlib"),
    case(
        ["--data", "{ids300}", "--set", "model.vocab_size=256"],
        "model.vocab_size=256",
        "--set model.vocab_size=300",
    ),
    case(["--set", "model.vocab_size=100"], "model.vocab_size=100", "model.vocab_size=256"),
    case(["--data", "{short_txt}"], "has 10 tokens", "use --seq-len 8 or a longer file"),
    # ---- mesh and modes
    case(["--mesh", ""], "--mesh ''", "omit --mesh or give e.g. data=8"),
    case(["--mesh", "data=8,data=2"], "data=2", "give each axis once, e.g. data=8"),
    case(["--mesh", "tensor=2,tensor=4", "--tensor-mode", "1d"], "tensor=4", "e.g. tensor=2"),
    case(["--mesh", "tensor=8"], "--mesh tensor=8", "--tensor-mode 1d"),
    case(["--seq-mode", "ring"], "--seq-mode ring", "--mesh data=2,seq=4"),
    case(["--tensor-mode", "1d"], "--tensor-mode 1d", "--mesh tensor=4 --tensor-mode 1d"),
    case(["--tensor-depth", "0"], "--tensor-depth 0", "--tensor-depth 2"),
    case(
        ["--mesh", "tensor=4", "--tensor-mode", "1d", "--tensor-depth", "2"],
        "--tensor-depth 2",
        "--tensor-mode 2.5d",
    ),
    case(["--mesh", "data=2,seq=4", "--seq-mode", "rign"], "'rign'", "did you mean 'ring'?"),
    case(["--mesh", "tensor=4", "--tensor-mode", "2D"], "'2D'", "did you mean '2d'?"),
    case(["--zero", "4"], "--zero 4", "use 0, 1, 2 or 3"),
    case(["--collective-matmul", "on"], "--tensor-mode is none", "--collective-matmul off"),
    case(["--collective-matmul", "yes"], "'yes' is not on or off", "--collective-matmul on"),
    case(["--set", "parallel.collective_matmul=on"], "--tensor-mode is none", "--tensor-mode 1d"),
    case(["--remat", "ful"], "--remat", "full"),
    case(["--xla-preset", "gpu-fast"], "'gpu-fast'", "gpu-perf"),
    case(["--profile-steps", "3:5"], "--profile-steps 3:5", "--profile-dir"),
    case(["--profile-dir", "{dir}", "--profile-steps", "5"], "--profile-steps 5", "3:5"),
    case(["--profile-dir", "{dir}", "--steps", "10", "--profile-steps", "9:30"], "9:30", "3:5"),
    case(["--profile-dir", "{file}"], "{file}", "name a new or existing directory"),
    case(["--offload", "params"], "--offload params", "--zero 3"),
    case(["--mesh", "data=4,pipe=2", "--remat", "offload"], "--remat offload", "--remat full"),
    case(["--grad-accum", "0"], "--grad-accum 0", "--grad-accum 4"),
    case(["--grad-accum", "3", "--batch-size", "16"], "--grad-accum 3", "--batch-size"),
    case(["--precision", "fp8"], "--precision", "fp16"),
    case(["--devices", "0"], "--devices 0", "--devices 8"),
    case(["--mesh", "data=3"], "data=3", "e.g. data=8"),
    # ---- optimizer and schedule
    case(["--clip-norm", "-1"], "--clip-norm -1", "--clip-norm 1.0"),
    case(["--weight-decay", "-1"], "--weight-decay -1", "--weight-decay 0.01"),
    case(["--lr", "0"], "--lr 0", "--lr 3e-3"),
    case(["--lr", "nan"], "--lr nan", "--lr 3e-3"),
    case(["--lr", "fast"], "'fast' is not a number", "e.g. --lr 0.003"),
    case(["--warmup-steps", "-1"], "--warmup-steps -1", "--warmup-steps 20"),
    case(["--optimizer", "adam"], "'adam'", "did you mean 'adamw'?"),
    case(["--set", "optim.b2=1.5"], "optim.b2=1.5", "--set optim.b2=0.95"),
    case(["--set", "optim.lrr=3"], "'lrr'", "did you mean 'lr'?"),
    # ---- run sizes and the rest of the run
    case(["--steps", "0"], "--steps 0", "--steps 100"),
    case(["--steps", "1e9x"], "'1e9x' is not an integer", "e.g. --steps 200"),
    case(["--batch-size", "0"], "--batch-size 0", "--batch-size 16"),
    case(["--batch-size", "7"], "--batch-size 7", "--batch-size 8"),
    case(["--seq-len", "1"], "--seq-len 1", "--seq-len 128"),
    case(["--seq-len", "512"], "--seq-len 512", "--seq-len 256"),
    case(["--checkpoint-every", "0"], "--checkpoint-every 0", "--checkpoint-every 50"),
    case(["--seed", "-1"], "--seed -1", "--seed 0"),
    case(["--precision", "fp8"], "'fp8'", "fp32, bf16"),
    case(["--attention", "flash"], "'flash'", "auto, xla, cudnn"),
    case(["--set", "log_every=0"], "log_every=0", "--set log_every=10"),
    # ---- the model
    case(["--model", "GPT2-TINY"], "'GPT2-TINY'", "did you mean 'gpt2-tiny'?"),
    case(["--model", "gpt3-175b"], "--model gpt3-175b", "use e.g. --model gpt"),
    case(["--set", "model.n_layer=0"], "model.n_layer=0", "--set model.n_layer=2"),
    case(["--set", "model.n_head=0"], "model.n_head=0", "--set model.n_head=8"),
    case(["--set", "model.block_size=-1"], "model.block_size=-1", "model.block_size=256"),
    case(
        ["--set", "model.n_layer=abc"],
        "--set model.n_layer=abc: 'abc' is not a valid int",
        "e.g. --set model.n_layer=",
    ),
    case(["--set", "model.n_embd=100"], "model.n_embd=100", "--set model.n_embd=96 or 104"),
    case(["--set", "model.n_head=6"], "model.n_head=6", "--set model.n_head=4 or 8"),
    case(
        ["--set", "model.position=rope", "--set", "model.n_embd=120"],
        "120/8 = 15",
        "--set model.n_embd=128",
    ),
    case(["--set", "model.position=alibi"], "'alibi'", "learned, rope"),
    case(["--set", "model.n_layer"], "'model.n_layer' is not KEY=VALUE", "model.n_layer=2"),
    case(["--set", "nosuchkey=1"], "--set nosuchkey", "use model.*, optim.*, parallel.*"),
    case(["--set", "stesp=3"], "--set stesp", "did you mean 'steps'?"),
    # ---- --device-batch: the accumulation count derived from the mesh (default data=8, batch 16)
    case(["--device-batch", "3"], "--device-batch 3", "use --device-batch 2, or --batch-size 24"),
    case(["--device-batch", "1", "--grad-accum", "4"], "--grad-accum 4", "use --grad-accum 2"),
    case(["--device-batch", "0"], "--device-batch 0", "e.g. --device-batch 2"),
    # ---- resuming a checkpoint directory with another model, optimizer or seed
    case(
        ["--checkpoint-dir", "{ckpt}"],
        "model.n_layer=1, not model.n_layer=2",
        "use --set model.n_layer=1 to resume it, or another --checkpoint-dir",
    ),
    case(
        ["--checkpoint-dir", "{ckpt}", "--set", "model.n_layer=1", "--optimizer", "sgd"],
        "--optimizer adamw, not sgd",
        "use --optimizer adamw to resume it",
    ),
    case(
        ["--checkpoint-dir", "{ckpt}", "--set", "model.n_layer=1", "--seed", "3"],
        "--seed 0, not 3",
        "use --seed 0 to resume it",
    ),
    # ---- flags
    case(["--step", "10"], "--step", "did you mean '--steps'?"),
    case(["--mesh"], "--mesh", "e.g. --mesh data=8"),
    case(["10"], "'10'", "--steps 100"),
    # ---- multi-process launch, checked before jax.distributed.initialize
    case(["--coordinator", "localhost:1234"], "--coordinator localhost:1234", "--num-processes 2"),
    case(["--process-id", "2", "--num-processes", "2"], "--process-id 2", "--process-id 1"),
    case(["--coordinator", "notaport"], "'notaport'", "--coordinator 10.0.0.1:1234"),
    case(["--num-processes", "0"], "--num-processes 0", "--num-processes 2"),
    case(["--num-processes", "2"], "--num-processes 2", "needs --coordinator"),
    case(
        ["--coordinator", "localhost:99999", "--num-processes", "2", "--process-id", "0"],
        "'localhost:99999'",
        "port in 1..65535",
    ),
]


@pytest.fixture
def files(tmp_path):
    """The bad files the table names, by name; ``{file}`` is a regular file, ``{dir}`` a dir."""
    arrays = {
        "negative": np.array([1, 2, -3, 4] * 100),
        "halves": np.arange(1000) * 0.5,
        "scalar": np.array(5),
        "matrix": np.ones((10, 10), np.int32),
        "no_ids": np.array([], np.int32),
        "bools": np.ones(100, bool),
        "huge": np.array([1, 2**40] * 100),
        "ids300": np.arange(1000) % 300,
    }
    out = {"dir": str(tmp_path)}
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
        out[name] = str(tmp_path / f"{name}.npy")
    np.save(tmp_path / "objects.npy", np.array([1, "a", None] * 10, dtype=object))
    out["objects"] = str(tmp_path / "objects.npy")
    for name, fname, content in (
        ("file", "a_file", b"x"),
        ("not_npy", "text.npy", b"hello"),
        ("empty_txt", "empty.txt", b""),
        ("raw_bin", "train.bin", b"ab" * 100),
        ("short_txt", "short.txt", b"0123456789"),
    ):
        (tmp_path / fname).write_bytes(content)
        out[name] = str(tmp_path / fname)
    meta = tmp_path / "ckpt" / "2" / "meta"  # what checkpoint.py writes, as far as it is read
    meta.mkdir(parents=True)
    config = {"model": "gpt2-tiny", "model_overrides": {"n_layer": 1}, "seed": 0}
    config["optim"] = {"name": "adamw", "clip_norm": 1.0}
    (meta / "metadata").write_text(json.dumps({"step": 2, "seed": 0, "config": config}))
    out["ckpt"] = str(tmp_path / "ckpt")
    return out


def _fill(items, files):
    return [x.format(**files) for x in items]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Fail where the run would first compile, or would start a multi-process runtime."""
    import jax

    import colossal_jax.training.run as run_module

    def compile_(*_, **__):
        raise AssertionError("reached init_state: nothing refused this input")

    monkeypatch.setattr(run_module, "init_state", compile_)
    monkeypatch.setattr(jax.distributed, "initialize", compile_)


@pytest.mark.parametrize("argv,bad,fix", CASES)
def test_careless_input_is_one_error_line(argv, bad, fix, files, nothing_compiles, capsys):
    argv, bad, fix = _fill(argv, files), bad.format(**files), fix.format(**files)
    assert cli.main(argv + ["--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert bad in line and fix in line, line


SUBPROCESS = [
    ["--tensorboard-dir", "/proc/tb"],
    ["--data", "{negative}"],
    ["--mesh", ""],
    ["--coordinator", "notaport"],
    ["--set", "model.n_layer=abc"],
    ["--step", "10"],
    ["--model", "gpt3-175b"],
]


def _run(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *argv, "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc, time.time() - t0


@pytest.mark.quiet
@pytest.mark.slow
@pytest.mark.parametrize("argv", SUBPROCESS, ids=[" ".join(a) for a in SUBPROCESS])
def test_real_process_answers_in_one_line_under_20s(argv, files):
    if "/proc/tb" in argv and not Path("/proc/self").exists():
        pytest.skip("needs Linux /proc")
    proc, seconds = _run(_fill(argv, files))
    assert proc.returncode == 2, proc.stderr
    _one_error_line(proc.stderr)
    assert seconds < 20


@pytest.mark.slow
def test_warmup_longer_than_the_run_is_one_note_and_runs():
    argv = ["--warmup-steps", "50", "--steps", "3", "--batch-size", "8", "--seq-len", "32"]
    proc, _ = _run(argv + ["--set", "model.n_layer=1"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: --warmup-steps 50"), lines
    assert "cut to 2 steps" in lines[0]
    assert "done: steps 0->3" in proc.stdout


def test_warmup_note_comes_after_every_check(nothing_compiles, capsys):
    """The note is printed once the run is valid, so a refused run prints only its error."""
    argv = ["--warmup-steps", "50", "--steps", "5", "--no-progress"]
    with pytest.raises(AssertionError, match="reached init_state"):
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: --warmup-steps 50 ") and "--steps 5" in err[0]
    assert cli.main(argv + ["--batch-size", "7"]) == 2
    _one_error_line(capsys.readouterr().err)


def test_every_flag_has_help():
    parser = cli.build_parser()
    missing = [a.option_strings[0] for a in parser._actions if not (a.help or "").strip()]
    assert not missing, missing


def test_list_models_counts_what_a_run_trains(capsys):
    from flax import nnx

    from colossal_jax.config.families import MODELS
    from colossal_jax_models.gpt import GPT

    assert cli.main(["--list-models"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "256-token byte vocabulary" in out[0]
    small = next(line for line in out if line.startswith("gpt2-small "))
    assert " 86.24M " in small, small  # what `train.py --model gpt2-small` prints
    for m in (
        dataclasses.replace(MODELS["gpt2-tiny"], n_layer=3),
        dataclasses.replace(MODELS["gpt2-tiny"], position="rope", mlp_ratio=2, vocab_size=77),
    ):
        params = nnx.state(nnx.eval_shape(lambda m=m: GPT(m, rngs=nnx.Rngs(0))))
        real = sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(params))
        assert cli.param_count(m) == real


def test_list_meshes_shows_axes_and_modes(capsys):
    assert cli.main(["--list-meshes"]) == 0
    out = capsys.readouterr().out
    assert "data=2 tensor_row=4" in out and "tensor_mode=1d" in out
    assert "data=rest tensor_row=2 tensor_col=2 tensor_depth=2" in out
    assert "seq_mode=ring" in out and "zero=1" in out


def test_preflight_leaves_no_trace_and_accepts_good_values(tmp_path):
    new = tmp_path / "a" / "b"
    preflight.check_writable_dir("--checkpoint-dir", str(new), "x")
    preflight.check_writable_file("--metrics-file", str(new / "m.jsonl"), "x")
    preflight.check_writable_file("--metrics-file", str(tmp_path / "m.jsonl"), "x")
    assert list(tmp_path.iterdir()) == []
    preflight.check_processes("localhost:1234", 2, 1)
    preflight.check_processes(None, None, None)
    np.save(tmp_path / "whole.npy", np.arange(100.0))
    preflight.check_data(str(tmp_path / "whole.npy"))  # whole-number floats are token ids
    with pytest.raises(ConfigError, match="--coordinator"):
        preflight.check_processes(None, None, 0)


def test_resume_check_accepts_the_same_run_on_another_mesh(files):
    from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

    cfg = TrainConfig(
        model_overrides={"n_layer": 1},
        checkpoint_dir=files["ckpt"],
        optim=OptimConfig(clip_norm=0.5),
        parallel=ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    )
    preflight.check_resume(cfg, preflight.architecture)
