"""``resolve(config, devices) -> Plan``: the plan derives what today's code derives, refuses what
today's rules refuse with the same message, reads each file once, imports no JAX, and is fast."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from colossal_jax import cli
from colossal_jax.checks import preflight
from colossal_jax.checks import resolve as resolve_module
from colossal_jax.checks.resolve import resolve
from colossal_jax.checks.validate import size_model
from colossal_jax.config import MESH_ORDER, ConfigError, OptimConfig, ParallelConfig, TrainConfig
from colossal_jax.config.families import MODELS, family_of, task_of
from colossal_jax.config.model_rules import check_memory, check_with_model, grad_accum_of
from colossal_jax.config.parallel_rules import check_parallel, uses_zigzag
from colossal_jax.config.plan import Devices, Plan
from colossal_jax.config.tensor_split import batch_shards, split_of
from colossal_jax.config.train_rules import check_train, host_overlap
from colossal_jax.data.tasks import data_vocab, load_text
from colossal_jax.hf.checks import check_init_from_hf, model_overrides
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parent.parent
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64}
HF_GPT2 = {"model_type": "gpt2", "vocab_size": 300, "n_positions": 64, "n_embd": 64,
           "n_layer": 2, "n_head": 4}  # fmt: skip


def _hf_dir(path: Path, config: dict = HF_GPT2, weights: bool = True) -> str:
    """A Hugging Face ``save_pretrained`` directory as the rules see it: config.json, weights."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return str(path)


def _cli_config(argv: list[str]) -> TrainConfig:
    """The config the command line builds from ``argv`` on 8 devices (``devices`` set, as
    ``cli.main`` passes it to ``train``)."""
    cfg = cli.config_from_args(cli.build_parser().parse_args(argv), 8)
    return dataclasses.replace(cfg, devices=8)


RUNS = {  # scripts/same_losses.py's reference runs, and more modes
    "default": [],
    "2d": ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d"],
    "1f1b-device-batch": ["--mesh", "pipe=2,data=4", "--set", "model.n_layer=4",
                          "--batch-size", "64", "--device-batch", "2"],
    "zero3-accum": ["--zero", "3", "--grad-accum", "2"],
    "bert-tiny": ["--model", "bert-tiny"],
    "vit-tiny": ["--model", "vit-tiny"],
    "ring": ["--mesh", "data=2,seq=4", "--seq-mode", "ring"],
    "bert-ring": ["--model", "bert-tiny", "--mesh", "data=2,seq=4"],
    "interleaved": ["--mesh", "pipe=2,data=4", "--pipeline", "interleaved",
                    "--virtual-stages", "2", "--set", "model.n_layer=4"],
}  # fmt: skip


def _assert_derived_as_today(plan: Plan, cfg: TrainConfig) -> None:
    """Every value of ``plan`` equals what the functions today's ``build`` and CLI use give."""
    par = cfg.parallel
    corpus = load_text(task_of(cfg.model), cfg.data)  # what build reads
    vocab = corpus.vocab_size if corpus is not None else None
    model = size_model(cfg, model_overrides(cfg), vocab)
    assert plan.config == cfg
    assert plan.model == model
    assert plan.data_vocab == vocab == data_vocab(task_of(cfg.model), cfg.data)
    assert (plan.family, plan.task) == (family_of(cfg.model).name, task_of(cfg.model))
    assert plan.mesh_shape == tuple(getattr(par, a) for a in MESH_ORDER)
    assert (plan.tensor_mode, plan.seq_mode, plan.zero) == (par.tensor_mode, par.seq_mode, par.zero)
    assert (plan.pipeline, plan.virtual_stages) == (par.pipeline, par.virtual_stages)
    assert plan.microbatches == par.num_microbatches
    assert plan.grad_accum == grad_accum_of(cfg)
    assert plan.schedule_microbatches == par.num_microbatches * grad_accum_of(cfg)
    assert plan.batch_shards == batch_shards(par)
    assert plan.tensor_split == split_of(par)
    assert plan.zigzag == uses_zigzag(par, model)
    assert plan.host_overlap == host_overlap(cfg.host_overlap, "cpu")
    assert (plan.remat, plan.precision, plan.offload) == (cfg.remat, cfg.precision, cfg.offload)
    assert plan.layer_entry == ("pipe" if par.pipelined else None)
    assert plan.n_devices == 8


@pytest.mark.parametrize("name", RUNS)
def test_plan_derives_what_today_derives(name):
    cfg = _cli_config(RUNS[name])
    _assert_derived_as_today(resolve(cfg, 8), cfg)


def test_plan_values_of_the_modes():
    """The numbers the story of each mode needs, spelled out."""
    default = resolve(_cli_config([]), 8)
    assert (default.batch_shards, default.grad_accum, default.data_vocab) == (8, 1, 256)
    assert default.mesh_shape == (8, 1, 1, 1, 1, 1) and not default.host_overlap
    pipe = resolve(_cli_config(RUNS["1f1b-device-batch"]), 8)
    # 64 sequences over 4 shards × M=4 microbatches is 4 per piece: 2 of --device-batch 2
    assert (pipe.pipeline, pipe.microbatches, pipe.grad_accum) == ("1f1b", 4, 2)
    assert (pipe.schedule_microbatches, pipe.microbatch_sequences) == (8, 2)
    assert pipe.layer_entry == "pipe"
    two_d = resolve(_cli_config(RUNS["2d"]), 8)
    assert two_d.batch_shards == 4 and two_d.tensor_split.divisor("hidden size") == 2
    assert resolve(_cli_config(RUNS["zero3-accum"]), 8).grad_accum == 2
    assert resolve(_cli_config(RUNS["bert-tiny"]), 8).model.vocab_size == 320  # 256 + 4, padded
    vit = resolve(_cli_config(RUNS["vit-tiny"]), 8)
    assert (vit.task, vit.data_vocab, vit.model.seq_len) == ("image_classification", None, 5)
    assert resolve(_cli_config(RUNS["ring"]), 8).zigzag  # causal: zigzag
    assert not resolve(_cli_config(RUNS["bert-ring"]), 8).zigzag  # bidirectional: contiguous
    gpu = resolve(_cli_config([]), Devices(count=8, platform="gpu"))
    assert gpu.host_overlap


def test_init_from_hf_plan(tmp_path):
    directory = _hf_dir(tmp_path / "gpt2")
    cfg = _cli_config(["--init-from-hf", directory, "--seq-len", "32"])
    plan = resolve(cfg, 8)
    _assert_derived_as_today(plan, cfg)
    assert (plan.model.vocab_size, plan.model.block_size, plan.model.n_embd) == (300, 64, 64)


def test_plan_matches_the_built_run():
    """What ``build`` derives with JAX agrees with the plan (mesh, model, schedule, shards)."""
    from colossal_jax.training.run import build

    for name in ("1f1b-device-batch", "2d"):
        cfg = _cli_config(RUNS[name])
        plan, run = resolve(cfg, 8), build(cfg)
        assert run.mesh.axis_names == MESH_ORDER
        assert tuple(run.mesh.devices.shape) == plan.mesh_shape
        assert run.model == plan.model
        assert run.layout.batch_divisor() == plan.batch_shards
        if run.schedule is not None:
            assert run.schedule.microbatches == plan.schedule_microbatches


def test_plan_is_frozen_and_hashable():
    plan = resolve(_cli_config([]), 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.zero = 3  # type: ignore[misc]
    again = resolve(_cli_config([]), 8)
    assert plan == again and hash(plan) == hash(again) and len({plan, again}) == 1
    assert resolve(_cli_config([]), Devices(8)) == resolve(_cli_config([]), 8)


def test_runtime_devices_give_todays_memory_capacity():
    """:func:`current_devices` fills a :class:`Devices` from JAX: the host's memory shared by
    the simulated CPU devices (what the memory floor was measured with before the plan), and the
    memory floor refuses alike through the plan."""
    import os

    import jax

    from colossal_jax.runtime.devices import current_devices

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    devices = Devices(
        count=jax.device_count(),
        platform=jax.default_backend(),
        memory_bytes=host,
        memory_shared_by=jax.local_device_count(),
    )
    assert current_devices() == devices
    for size in (1, 4, 8):
        assert devices.capacity(size) == (host, min(size, jax.local_device_count()))
    cfg = dataclasses.replace(_cli_config(["--model", "gpt3-175b"]), seq_len=128)
    small = Devices(count=8, memory_bytes=4 * 2**30, memory_shared_by=8)
    with pytest.raises(ConfigError) as today:
        check_memory(cfg, size_model(cfg, model_overrides(cfg), 256), *small.capacity(8))
    with pytest.raises(ConfigError) as now:
        resolve(cfg, small)
    assert str(now.value) == str(today.value) and "needs at least" in str(now.value)


@pytest.mark.parametrize(
    "fields",
    [
        {"devices": 16},  # --devices beyond the devices
        {"devices": None, "parallel": ParallelConfig(data=16)},  # a mesh beyond them
        {"devices": None, "parallel": ParallelConfig(data=4)},  # a mesh of fewer
    ],
    ids=["devices", "mesh-too-large", "mesh-too-small"],
)
def test_device_count_errors_are_builds(fields):
    from colossal_jax.training.run import build

    cfg = dataclasses.replace(_cli_config([]), **fields)
    with pytest.raises(ConfigError) as today:
        build(cfg)
    with pytest.raises(ConfigError) as now:
        resolve(cfg, 8)
    assert str(now.value) == str(today.value)


# ---- every refusal of today, through resolve, with the same message ----------------------------


def _base(**fields) -> TrainConfig:
    """A small valid run on 8 devices; ``parallel`` and ``optim`` given as dicts of changes."""
    par = ParallelConfig(**{"data": 8, **fields.pop("parallel", {})})
    optim = OptimConfig(**fields.pop("optim", {}))
    tiny = TINY if fields.get("model", "gpt2-tiny").startswith("gpt") else {}
    over = {**tiny, **fields.pop("model_overrides", {})}
    base = dict(batch_size=16, seq_len=32, devices=8, steps=10, eval_every=0)
    return TrainConfig(**{**base, **fields}, model_overrides=over, optim=optim, parallel=par)


def _today(cfg: TrainConfig) -> None:
    """The refusals of the rules composed by hand, in the command line's order before the plan:
    its flags' file checks (``preflight.check_args``), the parallel, training and
    ``--init-from-hf`` rules (``config_from_args``), the model sized for the data and its rules,
    then ``check_resume`` (``cli.main``)."""
    for name in preflight.CHECKS:
        preflight.check_field(name, getattr(cfg, name))
    check_parallel(cfg.parallel, cfg.devices)
    check_train(cfg)
    check_init_from_hf(cfg)
    vocab = data_vocab(task_of(cfg.model), cfg.data) if cfg.model in MODELS else None
    check_with_model(cfg, size_model(cfg, model_overrides(cfg), vocab))
    preflight.check_resume(cfg)


def _checkpoint(root: Path, **fields) -> str:
    """A directory holding step 5 of ``_base(**fields)`` as ``train`` records it."""
    cfg = _base(**fields)
    model = size_model(cfg, model_overrides(cfg), 256)
    meta = {
        "step": 5,
        "seed": cfg.seed,
        "model": cfg.model,
        "config": dataclasses.asdict(cfg),
        "architecture": dataclasses.asdict(model),
    }
    (root / "5" / "meta").mkdir(parents=True)
    (root / "5" / "meta" / "metadata").write_text(json.dumps(meta))
    return str(root)


@pytest.fixture
def files(tmp_path) -> SimpleNamespace:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "tokens.bin").write_bytes(b"\0" * 8)
    np.save(tmp_path / "ids.npy", np.arange(400, dtype=np.int32))
    (tmp_path / "no_config").mkdir()
    return SimpleNamespace(
        root=tmp_path,
        file=str(tmp_path / "a_file"),
        hf=_hf_dir(tmp_path / "hf"),
        t5=_hf_dir(tmp_path / "t5", {**HF_GPT2, "model_type": "t5"}),
        unweighted=_hf_dir(tmp_path / "unweighted", weights=False),
        other_model=_checkpoint(tmp_path / "ck_bert", model="bert-tiny"),
        other_seed=_checkpoint(tmp_path / "ck_seed", seed=1),
        other_layers=_checkpoint(tmp_path / "ck_layers", model_overrides={"n_layer": 4}),
    )


REFUSALS = {  # name: (fields of _base, with {files.x} for paths; a fragment of the message)
    "axis": ({"parallel": {"data": 0}}, "mesh axis data=0"),
    "tensor-mode": ({"parallel": {"tensor_mode": "2x"}}, "--tensor-mode '2x'"),
    "seq-mode": ({"parallel": {"seq_mode": "rign"}}, "--seq-mode 'rign'"),
    "zero": ({"parallel": {"zero": 4}}, "not a ZeRO stage"),
    "pipeline-without-pipe": ({"parallel": {"pipeline": "gpipe"}}, "needs a pipe axis"),
    "microbatches": ({"parallel": {"data": 4, "pipe": 2, "microbatches": 1}}, "never fill"),
    "interleaved": ({"parallel": {"data": 4, "pipe": 2, "pipeline": "interleaved"}},
                    "--virtual-stages 2"),
    "virtual-stages": ({"parallel": {"data": 4, "pipe": 2, "virtual_stages": 2}},
                       "needs --pipeline interleaved"),
    "mesh-size": ({"parallel": {"data": 4}}, "has 4 devices but 8"),
    "tensor-axes-without-mode": ({"parallel": {"data": 4, "tensor_row": 2}},
                                 "--tensor-mode is none"),
    "2d-grid": ({"parallel": {"data": 4, "tensor_row": 2, "tensor_mode": "2d"}}, "square grid"),
    "3d-cube": ({"parallel": {"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "3d"}},
                "cube"),
    "collective-matmul": ({"parallel": {"collective_matmul": True}}, "--collective-matmul on"),
    "seq-without-mode": ({"parallel": {"data": 4, "seq": 2}}, "--seq-mode is none"),
    "steps": ({"steps": 0}, "--steps 0"),
    "batch-size": ({"batch_size": 0}, "--batch-size 0"),
    "seq-len": ({"seq_len": 1}, "--seq-len 1"),
    "precision": ({"precision": "fp8"}, "--precision 'fp8'"),
    "remat": ({"remat": "some"}, "--remat 'some'"),
    "offload": ({"offload": "disk"}, "--offload 'disk'"),
    "grad-accum": ({"grad_accum": 0}, "--grad-accum 0"),
    "device-batch": ({"device_batch": 0}, "--device-batch 0"),
    "offload-params": ({"offload": "params"}, "add --zero 3"),
    "remat-offload-pipeline": ({"remat": "offload", "parallel": {"data": 4, "pipe": 2}},
                               "--remat full"),
    "attention": ({"attention": "flash"}, "--attention 'flash'"),
    "cudnn-ring": ({"attention": "cudnn", "parallel": {"data": 4, "seq": 2, "seq_mode": "ring"}},
                   "--attention cudnn cannot run"),
    "optimizer": ({"optim": {"name": "adam"}}, "--optimizer 'adam'"),
    "lr": ({"optim": {"lr": 0.0}}, "--lr 0.0"),
    "warmup": ({"optim": {"warmup_steps": -1}}, "--warmup-steps -1"),
    "weight-decay": ({"optim": {"weight_decay": -1.0}}, "--weight-decay -1.0"),
    "b1": ({"optim": {"b1": 1.0}}, "optim.b1=1.0"),
    "lars-trust": ({"optim": {"lars_trust": 0.0}}, "optim.lars_trust=0.0"),
    "checkpoint-every": ({"checkpoint_every": 0}, "--checkpoint-every 0"),
    "keep-checkpoints": ({"keep_checkpoints": 0}, "--keep-checkpoints 0"),
    "xla-preset": ({"xla_preset": "cpu-perf"}, "--xla-preset 'cpu-perf'"),
    "profile-without-dir": ({"profile_steps": "1:2"}, "needs --profile-dir"),
    "profile-steps": ({"profile_steps": "9:3", "profile_dir": "{root}/prof"},
                      "--profile-steps 9:3"),
    "seed": ({"seed": -1}, "--seed -1"),
    "host-overlap": ({"host_overlap": "of"}, "did you mean 'off'"),
    "log-every": ({"log_every": 0}, "log_every=0"),
    "eval-every": ({"eval_every": -1}, "--eval-every -1"),
    "eval-batches": ({"eval_batches": 0}, "eval_batches=0"),
    "peak-tflops": ({"peak_tflops": 0.0}, "--peak-tflops 0.0"),
    "seq-mode-without-axis": ({"parallel": {"seq_mode": "ring"}}, "needs a seq axis"),
    "tensor-mode-without-axes": ({"parallel": {"tensor_mode": "1d"}}, "needs tensor axes"),
    "metrics-file-is-a-dir": ({"metrics_file": "{root}"}, "is a directory"),
    "checkpoint-dir-is-a-file": ({"checkpoint_dir": "{file}"}, "is not a directory"),
    "profile-dir-under-a-file": ({"profile_dir": "{file}/sub", "profile_steps": "1:2"},
                                 "cannot be created"),
    "data-missing": ({"data": "{root}/missing.txt"}, "is not a file"),
    "data-empty": ({"data": "{root}/empty.txt"}, "is empty"),
    "data-bin": ({"data": "{root}/tokens.bin"}, ".bin files are not read"),
    "data-blank": ({"data": " "}, "is empty; name a path"),
    "hf-missing": ({"init_from_hf": "{root}/nothing"}, "is not a directory"),
    "hf-no-config": ({"init_from_hf": "{root}/no_config"}, "has no config.json"),
    "hf-family": ({"init_from_hf": "{t5}"}, "holds a 't5' model"),
    "hf-weights": ({"init_from_hf": "{unweighted}"}, "no weights"),
    "hf-contradicted": ({"init_from_hf": "{hf}", "model_overrides": {"n_layer": 3}}, "contradicts"),
    "hf-other-family": ({"init_from_hf": "{hf}", "model": "bert-tiny"}, "is a BertConfig"),
    "hf-vocab-below-data": ({"init_from_hf": "{hf}", "data": "{root}/ids.npy"},
                            "token ids up to 399"),
    "model-unknown": ({"model": "gpt9"}, "--model 'gpt9' is unknown"),
    "model-field-unknown": ({"model_overrides": {"n_layers": 3}}, "--set model.*"),
    "model-field-bad": ({"model_overrides": {"position": "abs"}}, "--set model.*"),
    "n-head-zero": ({"model_overrides": {"n_head": 0}}, "model.n_head=0 must be"),
    "n-head-divides": ({"model_overrides": {"n_head": 3}}, "not divisible by model.n_head=3"),
    "rope-odd-head": ({"model_overrides": {"position": "rope", "n_embd": 60}}, "even head size"),
    "patch-size": ({"model": "vit-tiny", "data": "digits", "seq_len": 5, "batch_size": 120,
                    "model_overrides": {"patch_size": 3}}, "does not divide model.image_size"),
    "image-data-for-text": ({"data": "digits"}, "is an image set"),
    "text-data-for-images": ({"model": "vit-tiny", "seq_len": 5}, "classifies images"),
    "vit-seq-len": ({"model": "vit-tiny", "data": "digits"}, "does not fit --model vit-tiny"),
    "masked-lm-seq-len": ({"model": "bert-tiny", "seq_len": 4}, "too short for masked LM"),
    "bert-segments-with-seq": ({"model": "bert-tiny", "model_overrides": {"type_vocab_size": 2},
                                "parallel": {"data": 4, "seq": 2, "seq_mode": "ring"}},
                               "type_vocab_size=2"),
    "block-size": ({"seq_len": 128}, "exceeds the model's block_size"),
    "batch-shards": ({"batch_size": 12}, "not divisible by the 8 batch shards"),
    "device-batch-divides": ({"device_batch": 3}, "--device-batch 3 does not divide"),
    "device-batch-contradicts": ({"device_batch": 1, "grad_accum": 4}, "contradicts"),
    "grad-accum-divides": ({"grad_accum": 3}, "--grad-accum 3 microbatches"),
    "seq-split": ({"seq_len": 30, "parallel": {"data": 4, "seq": 2, "seq_mode": "ring"}},
                  "--seq-len 30 is not divisible by 4"),
    "pipeline-layers": ({"model_overrides": {"n_layer": 3}, "parallel": {"data": 4, "pipe": 2}},
                        "equal pipeline chunks"),
    "pipeline-batch": ({"batch_size": 8, "parallel": {"data": 4, "pipe": 2}}, "4 microbatches"),
    "ulysses-heads": ({"parallel": {"data": 1, "seq": 8, "seq_mode": "ulysses"}},
                      "ulysses needs the heads"),
    "tensor-vocab": ({"model_overrides": {"vocab_size": 255},
                      "parallel": {"data": 4, "tensor_row": 2, "tensor_mode": "1d"}},
                     "vocab size divisible by 2"),
    "kv-heads": ({"model": "llama-tiny", "model_overrides": {"n_kv_head": 2},
                  "parallel": {"data": 2, "tensor_row": 4, "tensor_mode": "1d"}},
                 "kv_heads=2 is not divisible by 4"),
    "embedding-split": ({"model_overrides": {"n_head": 8, "block_size": 60},
                         "parallel": {"data": 1, "tensor_row": 8, "tensor_mode": "1d"}},
                        "embedding split 8"),
    "resume-other-model": ({"checkpoint_dir": "{other_model}"}, "--model bert-tiny, not"),
    "resume-other-seed": ({"checkpoint_dir": "{other_seed}"}, "--seed 1, not 0"),
    "resume-other-layers": ({"checkpoint_dir": "{other_layers}"}, "model.n_layer=4, not"),
}  # fmt: skip


def _with_paths(fields: dict, files: SimpleNamespace) -> dict:
    paths = vars(files)
    return {k: v.format(**paths) if isinstance(v, str) else v for k, v in fields.items()}


@pytest.mark.parametrize("name", REFUSALS)
def test_every_refusal_of_today_is_resolves(name, files):
    fields, fragment = REFUSALS[name]
    cfg = _base(**_with_paths(fields, files))
    with pytest.raises(ConfigError) as today:
        _today(cfg)
    with pytest.raises(ConfigError) as now:
        resolve(cfg, 8)
    assert str(now.value) == str(today.value)
    assert fragment in str(now.value), str(now.value)


# ---- each rule once, each file read once, no JAX, fast ------------------------------------------


def test_each_rule_runs_once(monkeypatch, tmp_path):
    names = ["check_parallel", "check_train", "model_overrides", "size_model", "check_model",
             "check_task", "check_run", "check_resume", "check_memory"]  # fmt: skip
    calls = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(resolve_module, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(resolve_module, name, counted)
    cfg = dataclasses.replace(_base(), checkpoint_dir=str(tmp_path / "ckpt"))
    resolve(cfg, Devices(count=8, memory_bytes=2**40, memory_shared_by=8))
    assert calls == dict.fromkeys(names, 1)


def test_files_are_read_once_per_path_and_stat(monkeypatch, tmp_path):
    from colossal_jax import hf
    from colossal_jax.data import corpus

    reads = {"config.json": 0, "tokens": 0}
    read_config, load_corpus = hf.read_config, corpus.load_corpus

    def counted_config(*args, **kwargs):
        reads["config.json"] += 1
        return read_config(*args, **kwargs)

    def counted_corpus(*args, **kwargs):
        reads["tokens"] += 1
        return load_corpus(*args, **kwargs)

    monkeypatch.setattr(hf, "read_config", counted_config)
    monkeypatch.setattr(corpus, "load_corpus", counted_corpus)
    directory = _hf_dir(tmp_path / "hf")
    np.save(tmp_path / "ids.npy", np.arange(200, dtype=np.int32))
    cfg = dataclasses.replace(
        _base(init_from_hf=directory, data=str(tmp_path / "ids.npy")), model_overrides={}
    )
    first = resolve(cfg, 8)
    after_first = dict(reads)
    for _ in range(20):
        assert resolve(cfg, 8) == first
    assert reads == after_first and after_first["config.json"] == 1
    config = Path(directory) / "config.json"
    config.write_text(json.dumps({**HF_GPT2, "n_layer": 4, "n_inner": 256}))  # edited: read again
    assert resolve(cfg, 8).model.n_layer == 4
    assert reads["config.json"] == 2


def test_path_probes_repeat_only_when_the_path_changes(monkeypatch, tmp_path):
    """An output path is probed (a temporary entry created and removed) once; again when it, or
    the directory it would be created in, appears or changes owner or permissions."""
    probed = []
    check_field = resolve_module.check_field

    def counted(name, value):
        if name != "data":  # the data check is cached per file (test below)
            probed.append(name)
        return check_field(name, value)

    monkeypatch.setattr(resolve_module, "check_field", counted)
    ckpt = tmp_path / "ckpt"
    cfg = _base(checkpoint_dir=str(ckpt), metrics_file=str(tmp_path / "m.jsonl"))
    for _ in range(5):
        resolve(cfg, 8)
    assert sorted(probed) == ["checkpoint_dir", "metrics_file"]
    ckpt.mkdir()  # the directory a run created: probed again, where it now is
    resolve(cfg, 8)
    assert probed[2:] == ["checkpoint_dir"]
    ckpt.chmod(0o500)
    resolve(cfg, 8)
    assert probed[3:] == ["checkpoint_dir"]


def test_resolving_imports_no_jax():
    code = """
        import sys
        from colossal_jax.checks.resolve import resolve
        from colossal_jax.config import ParallelConfig, TrainConfig
        plan = resolve(TrainConfig(devices=8, parallel=ParallelConfig(data=8)), 8)
        print(plan.batch_shards, 'jax' in sys.modules, 'flax' in sys.modules)
    """
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "8 False False"


SIXTY_FOUR = dict(
    model_overrides={"n_layer": 4},
    batch_size=32,
    parallel=ParallelConfig(data=2, pipe=2, tensor_row=2, tensor_col=2, seq=4, tensor_mode="2d",
                            seq_mode="ring", zero=1),
)  # fmt: skip


def test_resolving_64_devices_takes_under_5ms():
    cfg = TrainConfig(**SIXTY_FOUR)
    devices = Devices(count=64, platform="gpu", memory_bytes=80 * 2**30)
    assert resolve(cfg, devices).mesh_shape == (2, 2, 4, 1, 2, 2)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        resolve(cfg, devices)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 5e-3, times


def test_the_memory_floor_counts_2p5d_parameters_once_per_depth_layer():
    """2.5D's depth layers hold the same q×q blocks: the floor splits the parameters by q² (not
    q²·d), within a few percent of what the run's shardings put on a device (a floor still)."""
    from colossal_jax.config.model_rules import state_bytes
    from colossal_jax.config.tensor_split import param_split
    from colossal_jax.training.run import build as build_run

    cfg = tiny_config(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d")
    run = build_run(cfg)
    assert param_split(cfg.parallel) == 4
    held = sum(
        math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
        for a, s in zip(
            jax.tree.leaves(run.abstract_params), jax.tree.leaves(run.param_shardings), strict=True
        )
    )
    floor = state_bytes(cfg, run.model)
    slots = 2  # adamw
    assert floor / (2 + slots) <= held <= 1.1 * floor / (2 + slots)
