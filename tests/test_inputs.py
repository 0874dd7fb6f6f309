"""Careless inputs of issue 22 ("Nothing lost, one line"): sizes that would take the host down,
the Python API's types and devices, contradictions between a flag and ``--set``, strict mesh
presets, a metrics file that would be overwritten, and the notes a run owes its user.

Each test names the item of the issue it guards. The command line runs in-process through
``cli.main`` with compilation replaced by a failure (``nothing_compiles``) wherever the answer
must come before compiling; a few run as real processes, as a user meets them.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from colossal_jax import OptimConfig, ParallelConfig, TrainConfig, cli
from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Fail where the run would first compile."""
    import colossal_jax.training.run as run_module

    def compile_(*_, **__):
        raise AssertionError("reached init_state: nothing refused this input")

    monkeypatch.setattr(run_module, "init_state", compile_)


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _refused(argv: list[str], capsys) -> str:
    assert cli.main([*argv, "--no-progress"]) == 2
    return _one_error(capsys.readouterr().err)


def _train_process(
    argv: list[str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *argv, "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return proc, time.time() - t0


# ---- item 2: sizes that would take the host down ------------------------------------------------


def test_item2_learning_rates_are_computed_in_bounded_windows():
    """The learning rate of each step equals the whole table's, yet no more than a window of
    steps is held, whatever ``--steps`` (the table of 10**7 steps would be 80 MB)."""
    from colossal_jax.training.optim import schedule_values
    from colossal_jax.training.records import LearningRates

    optim = OptimConfig(warmup_steps=3)
    lr = LearningRates(optim, 10, window=4)
    table = schedule_values(optim, 10, 0, 10)
    assert [lr(s) for s in range(10)] == list(table)
    big = LearningRates(optim, 10**7)
    assert big(0) == 0.0 and big(5) > 0 and big(10**7 - 1) > 0
    assert len(big._values) <= big.window


def test_item2_steps_past_the_optimizer_counter_are_refused(nothing_compiles, capsys):
    line = _refused(["--steps", "3000000000"], capsys)
    assert "--steps 3000000000" in line and "2_147_483_647" in line


@pytest.mark.slow
def test_item2_a_batch_larger_than_the_host_exits_2_in_one_line_under_5s():
    proc, seconds = _train_process(["--batch-size", "1000000000"])
    assert proc.returncode == 2, proc.stderr
    line = _one_error(proc.stderr)
    assert "--batch-size 1000000000" in line and "TiB on the host" in line
    assert seconds < 5 or os.getloadavg()[0] > 4, seconds  # the machine's load, not the rule


def test_item2_the_python_api_refuses_a_batch_larger_than_the_host():
    with pytest.raises(ConfigError, match="--batch-size 1000000000 .* on the host"):
        resolve(TrainConfig(batch_size=10**9), 8)


# ---- item 8: the Python API checks its types and sizes the mesh as the command line ------------


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"steps": "10"}, "TrainConfig(steps='10'): steps (--steps) must be an int, not str"),
        ({"seq_len": 64.5}, "seq_len (--seq-len) must be an int, not float"),
        ({"batch_size": 16.0}, "batch_size (--batch-size) must be an int, not float"),
        ({"steps": True}, "steps (--steps) must be an int, not bool"),
        ({"parallel": {"dta": 8}}, "ParallelConfig has no field 'dta'; did you mean 'data'?"),
        ({"parallel": 8}, "parallel must be a ParallelConfig (or a dict of its fields)"),
        ({"optim": {"lr": "big"}}, "OptimConfig(lr='big'): lr (--lr) must be a float"),
        ({"checkpoint_dir": 3}, "checkpoint_dir (--checkpoint-dir) must be a str or None"),
    ],
)
def test_item8_a_wrong_type_is_one_config_error_on_construction(fields, message):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**fields)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_item8_friendly_values_are_converted():
    cfg = TrainConfig(steps=np.int64(3), parallel={"data": 8}, optim={"lr": 1})
    assert type(cfg.steps) is int and cfg.parallel == ParallelConfig(data=8)
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float


def test_item8_data_takes_the_remaining_devices_as_on_the_command_line():
    from colossal_jax.cli.configure import config_from_args
    from colossal_jax.cli.parser import build_parser

    api = resolve(TrainConfig(steps=2), 8)
    assert api.config.parallel.data == 8
    args = build_parser().parse_args(["--steps", "2"])
    assert resolve(config_from_args(args, 8), 8).mesh_shape == api.mesh_shape
    two_d = ParallelConfig(tensor_row=2, tensor_col=2, tensor_mode="2d")
    assert resolve(TrainConfig(parallel=two_d), 8).config.parallel.data == 2
    assert resolve(TrainConfig(parallel=ParallelConfig(data=1), devices=1), 8).mesh_shape[0] == 1
    with pytest.raises(ConfigError, match="does not divide the 8 devices"):
        resolve(TrainConfig(parallel=ParallelConfig(tensor_row=3, tensor_mode="1d")), 8)


# ---- item 9: contradictions are errors ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv,both",
    [
        (["--steps", "2", "--set", "steps=3"], ("--steps 2", "--set steps=3")),
        (["--zero", "2", "--set", "parallel.zero=1"], ("--zero 2", "--set parallel.zero=1")),
        (["--lr", "0.1", "--set", "optim.lr=0.2"], ("--lr 0.1", "--set optim.lr=0.2")),
        (["--set", "train.steps=4", "--steps=5"], ("--steps 5", "--set train.steps=4")),
        (["--mesh", "data=8", "--set", "parallel.data=4"], ("--mesh data=8", "parallel.data=4")),
    ],
)
def test_item9_a_flag_and_a_set_that_disagree_are_one_error(argv, both, nothing_compiles, capsys):
    line = _refused(argv, capsys)
    assert all(b in line for b in both) and "contradict" in line, line


def test_item9_the_same_value_twice_is_no_contradiction():
    from colossal_jax.cli.configure import config_from_args
    from colossal_jax.cli.parser import build_parser

    argv = ["--steps", "2", "--set", "steps=2", "--zero", "1", "--set", "parallel.zero=1"]
    cfg = config_from_args(build_parser().parse_args(argv), 8)
    assert cfg.steps == 2 and cfg.parallel.zero == 1
    alone = config_from_args(build_parser().parse_args(["--set", "steps=3"]), 8)
    assert alone.steps == 3


def test_item9_resuming_with_other_data_is_refused_like_another_seed(tmp_path):
    from helpers import tiny_config

    from colossal_jax.training.trainer import train

    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    other = tmp_path / "b.txt"
    other.write_text("pack my box with five dozen liquor jugs! " * 200)
    cfg = dataclasses.replace(
        tiny_config(steps=1, batch_size=8, seq_len=16),
        data=str(text),
        checkpoint_dir=str(tmp_path / "ckpt"),
        eval_every=0,
    )
    train(cfg, progress=False, log=lambda _: None)
    again = dict(steps=2, checkpoint_dir=cfg.checkpoint_dir)
    same = dataclasses.replace(cfg, **again, data=str(tmp_path / "." / "a.txt"))
    resolve(same, 8)  # the same file by another spelling resumes
    for change, flag in (({"data": str(other)}, "--data"), ({"seed": 1}, "--seed")):
        with pytest.raises(ConfigError) as e:
            resolve(dataclasses.replace(cfg, **again, **change), 8)
        assert flag in str(e.value) and "the data order would change" in str(e.value)


# ---- item 7: a new run does not overwrite an earlier run's metrics ------------------------------


def test_item7_a_new_run_refuses_a_metrics_file_with_records(tmp_path, nothing_compiles, capsys):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 5.0}\n' * 31)
    line = _refused(["--metrics-file", str(metrics)], capsys)
    assert str(metrics) in line and "--overwrite-metrics on" in line
    assert len(metrics.read_text().splitlines()) == 31  # untouched
    fresh = tmp_path / "ckpt"  # a new checkpoint directory starts a new run too
    line = _refused(["--metrics-file", str(metrics), "--checkpoint-dir", str(fresh)], capsys)
    assert "holds the records of an earlier run" in line


def test_item7_overwrite_empty_files_and_resumed_runs_are_allowed(tmp_path):
    from colossal_jax.checks.validate import check_metrics_file

    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1}\n')
    cfg = TrainConfig(metrics_file=str(metrics))
    with pytest.raises(ConfigError):
        check_metrics_file(cfg, resumes=False)
    check_metrics_file(cfg, resumes=True)  # a resumed run appends
    check_metrics_file(dataclasses.replace(cfg, overwrite_metrics=True), resumes=False)
    killed = tmp_path / "ckpt"  # an attempt killed before its first checkpoint left this
    (killed / "tmp").mkdir(parents=True)
    check_metrics_file(dataclasses.replace(cfg, checkpoint_dir=str(killed)), resumes=False)
    metrics.write_text("")
    check_metrics_file(cfg, resumes=False)


def test_item7_the_flag_replaces_and_a_resume_appends(tmp_path, capsys):
    import json

    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    small = ["--set", "model.n_layer=1", "--batch-size", "8", "--seq-len", "16",
             "--eval-every", "0", "--metrics-file", str(metrics), "--checkpoint-dir", str(ckpt),
             "--no-progress"]  # fmt: skip
    metrics.write_text('{"step": 1, "loss": 9.0}\n' * 31)
    assert cli.main([*small, "--steps", "1", "--overwrite-metrics", "on"]) == 0
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1]
    assert cli.main([*small, "--steps", "2"]) == 0, capsys.readouterr().err  # resumes: appends
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2]


# ---- item 6: mesh presets are parsed strictly ------------------------------------------------

PRESETS = {
    "zer0": (
        "[mesh]\ndata = 8\n[modes]\nzer0 = 1\n",
        "[modes] has no key 'zer0'; did you mean 'zero'?",
    ),
    "no_header": ("data = 8\n", "data = 8 is outside a section; put it under [mesh]"),
    "empty": ("# a preset\n", "sets no axis and no mode"),
    "zero_str": ('[mesh]\ndata = 8\n[modes]\nzero = "1"\n', 'zero = "1" must be an integer'),
    "zero_bool": ("[mesh]\ndata = 8\n[modes]\nzero = true\n", "zero = true must be an integer"),
    "meshes": ("[meshes]\ndata = 8\n", "unknown section [meshes]; did you mean 'mesh'?"),
    "dat": ("[mesh]\ndat = 8\n", "[mesh] has no key 'dat'; did you mean 'data'?"),
    "mode_int": ("[modes]\ntensor_mode = 2\n", "tensor_mode = 2 must be a string"),
}


@pytest.mark.parametrize("name", PRESETS)
def test_item6_a_preset_is_parsed_strictly(name, tmp_path, nothing_compiles, capsys):
    text, message = PRESETS[name]
    preset = tmp_path / f"{name}.toml"
    preset.write_text(text)
    line = _refused(["--mesh", str(preset)], capsys)
    assert str(preset) in line and message in line, line


def test_item6_every_shipped_preset_is_valid_and_a_good_one_still_reads(tmp_path):
    from colossal_jax.config import list_presets, parse_mesh
    from colossal_jax.config.mesh_spec import _meshes_dir, read_preset

    for name in list_presets():
        read_preset(_meshes_dir() / f"{name}.toml")
    good = tmp_path / "good.toml"
    good.write_text('[mesh]\ntensor = 4\n[modes]\ntensor_mode = "2d"\nzero = 1\n')
    assert parse_mesh(str(good), 8) == {
        "tensor_row": 2, "tensor_col": 2, "data": 2, "tensor_mode": "2d", "zero": 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    "total,mode,suggestion",
    [
        (8, "2d", "use tensor=4 (2×2), which divides 8, or --tensor-mode 2.5d --tensor-depth 2"),
        (2, "2d", "use --tensor-mode 1d for tensor=2"),
        (8, "2.5d", "--tensor-depth 2 makes tensor=8 a 2×2×2 grid"),
        (4, "3d", "use --tensor-mode 1d or 2d for tensor=4"),
        (16, "3d", "use tensor=8 (2×2×2), which divides 16"),
    ],
)
def test_item6_a_tensor_shorthand_suggests_a_grid_that_fits(total, mode, suggestion, capsys):
    line = _refused(["--mesh", f"tensor={total}", "--tensor-mode", mode], capsys)
    assert suggestion in line and "tensor=9" not in line, line


# ---- item 10: what a run owes its user ----------------------------------------------------------


def test_item10_a_corpus_too_small_to_hold_out_says_evaluation_is_dropped(tmp_path):
    from types import SimpleNamespace

    from colossal_jax.data.corpus import load_corpus
    from colossal_jax.data.tasks import make_batches

    text = tmp_path / "tiny.txt"
    text.write_text("hello world, a tiny corpus! " * 4)  # 112 tokens
    cfg = TrainConfig(data=str(text), seq_len=64)
    model = SimpleNamespace(vocab_size=256)
    _, held, note = make_batches(cfg, "causal_lm", model, load_corpus(cfg.data))
    assert held is None and "too few to hold out" in note and "does not evaluate" in note
    assert "--seq-len 54 or less" in note
    quiet = dataclasses.replace(cfg, eval_every=0)  # evaluation off: nothing to say
    assert make_batches(quiet, "causal_lm", model, load_corpus(cfg.data))[2] is None
    roomy = dataclasses.replace(cfg, seq_len=16)
    _, held, note = make_batches(roomy, "causal_lm", model, load_corpus(cfg.data))
    assert held is not None and note is None


def test_item10_generated_images_in_place_of_the_digits_are_in_the_summary_line(monkeypatch):
    from types import SimpleNamespace

    import colossal_jax.data.images as images
    from colossal_jax.data.tasks import make_batches
    from colossal_jax.training.summary import summary_line

    monkeypatch.setattr(images, "digits", lambda: None)  # as without scikit-learn
    model = SimpleNamespace(image_size=8, channels=1, num_classes=10, patch_size=2)
    cfg = TrainConfig(model="vit-tiny", data="digits", seq_len=17)
    train, _, note = make_batches(cfg, "image_classification", model, None)
    assert "scikit-learn is not installed" in note and train.caveat == images.STAND_IN
    shapes = make_batches(dataclasses.replace(cfg, data="shapes"), "image_classification",
                          model, None)[0]  # fmt: skip
    assert shapes.caveat is None
    summary = SimpleNamespace(
        losses=[2.3, 1.0], start_step=0, final_step=2, first_loss=2.3, final_loss=1.0,
        eval_losses=[2.3, 1.9], first_eval_loss=2.3, final_eval_loss=1.9,
        first_eval_accuracy=0.1, final_eval_accuracy=0.31, tokens_per_s=1.0, mfu=None,
        compile_s=1.0, wall_s=2.0,
    )  # fmt: skip
    line = summary_line(summary, None, train.caveat)
    assert "eval accuracy 10.0% -> 31.0%; trained on generated images, not the digits" in line


def test_item10_the_hf_extra_does_not_pull_torch():
    """``pip install -e ".[hf]"`` pulled a CUDA build of torch and ~20 NVIDIA packages on a CPU
    machine: the extra holds transformers only (it needs no torch), and the docs say how to get
    the torch build that fits the machine."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    hf = extras["optional-dependencies"]["hf"]
    assert not any(r.lower().startswith(("torch", "nvidia")) for r in hf), hf
    assert any(r.startswith("transformers") for r in hf)
    doc = (ROOT / "docs" / "huggingface.md").read_text()
    assert "https://download.pytorch.org/whl/cpu" in doc and "several GB" in doc
