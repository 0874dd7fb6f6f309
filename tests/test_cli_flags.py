"""The command line is generated from the config dataclasses: a field declared with ``flag()``
is a flag (spelling, type, default, help, choices and the example its errors offer), today's
flags keep their spelling, and ``train.py`` and ``generate.py`` read ``--mesh`` alike."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest

from colossal_jax import cli, generate
from colossal_jax.cli.configure import parallel_config
from colossal_jax.cli.parser import _Parser, add_config_flag
from colossal_jax.config import ConfigError, OptimConfig, ParallelConfig, TrainConfig, choices
from colossal_jax.config.flags import flag, flags_of, values_of

TRAIN_FLAGS = """
--help --set --no-progress --list-models --list-meshes
--model --steps --batch-size --seq-len --precision --remat --grad-accum --device-batch --offload
--seed --data --checkpoint-dir --checkpoint-every --keep-checkpoints --metrics-file
--overwrite-metrics --tensorboard-dir --attention --eval-every --peak-tflops --xla-preset
--profile-dir --profile-steps --init-from-hf
--optimizer --lr --warmup-steps --weight-decay --clip-norm --lr-schedule --lr-scaling --base-batch
--mesh --devices --tensor-mode --tensor-depth --seq-mode --zero --pipeline --microbatches
--virtual-stages --collective-matmul
--coordinator --num-processes --process-id --peer-timeout --no-cluster-detect
""".split()


def _flags(parser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def test_train_keeps_every_flag_of_today_each_once():
    flags = _flags(cli.build_parser())
    assert sorted(flags) == sorted(TRAIN_FLAGS)
    assert len(flags) == len(set(flags))


def test_every_config_flag_comes_from_one_field():
    generated = {
        f.option: f"{cls.__name__}.{f.field}"
        for cls in (TrainConfig, OptimConfig, ParallelConfig)
        for f in flags_of(cls)
    }
    assert generated["--optimizer"] == "OptimConfig.name"
    assert generated["--zero"] == "ParallelConfig.zero"
    assert set(generated) <= set(TRAIN_FLAGS)
    hand = set(TRAIN_FLAGS) - set(generated)
    assert hand == {
        "--help", "--set", "--no-progress", "--list-models", "--list-meshes", "--mesh",
        "--devices", "--tensor-depth", "--coordinator", "--num-processes", "--process-id",
        "--peer-timeout", "--no-cluster-detect",
    }  # fmt: skip


def test_family_flags_are_the_fields_marked_so():
    assert cli.FAMILY_FLAGS == {
        "steps": "steps",
        "batch_size": "batch_size",
        "seq_len": "seq_len",
        "data": "data",
        "eval_every": "eval_every",
        "optim.lr": "lr",
        "optim.warmup_steps": "warmup_steps",
    }


@dataclass(frozen=True)
class _Toy:
    """A config of one each: the generator knows nothing of the real ones."""

    depth: int = flag(3, "layers")
    rate: float | None = flag(None, "a rate", example="0.5")
    mode: str = flag("a", "one of {choices}", choices=lambda: ("a", "b"), name="--style")
    fast: bool = flag(False, "go fast")
    size: int = flag(7, "a size", default_from="family")
    hidden: int = 1


def _toy_parser() -> _Parser:
    p = _Parser(prog="toy", allow_abbrev=False)
    for f in flags_of(_Toy):
        add_config_flag(p, f)
    return p


def test_a_field_with_flag_metadata_is_a_flag():
    p = _toy_parser()
    assert _flags(p) == ["--help", "--depth", "--rate", "--style", "--fast", "--size"]
    args = p.parse_args(["--depth", "1e1", "--style", "b", "--fast", "on"])
    assert values_of(_Toy, args, {"size": 9}) == {
        "depth": 10, "rate": None, "mode": "b", "fast": True, "size": 9,
    }  # fmt: skip
    assert values_of(_Toy, p.parse_args([]))["size"] == 7  # no family: the field's default
    helps = {a.option_strings[-1]: a.help for a in p._actions}
    assert helps["--style"] == "one of a, b"
    assert helps["--size"] == "a size (default 7, or the model family's (--list-models))"
    with pytest.raises(
        ConfigError, match=r"^argument --rate: 'x' is not a number; e.g. --rate 0.5$"
    ):
        p.parse_args(["--rate", "x"])
    with pytest.raises(ConfigError, match=r"'1.5' is not a whole number; e.g. --depth 3$"):
        p.parse_args(["--depth", "1.5"])
    with pytest.raises(ConfigError, match=r"'yes' is not on or off; e.g. --fast off$"):
        p.parse_args(["--fast", "yes"])
    with pytest.raises(ConfigError, match=r"expected one argument; e.g. --size 7$"):
        p.parse_args(["--size"])


def test_choices_are_read_when_the_parser_is_built(monkeypatch):
    monkeypatch.setattr(choices, "TENSOR_MODES", (*choices.TENSOR_MODES, "4d"))
    action = next(a for a in cli.build_parser()._actions if "--tensor-mode" in a.option_strings)
    assert action.help == "one of none, 1d, 2d, 2.5d, 3d, 4d"


def test_generate_reads_the_mesh_as_train_does():
    train = cli.config_from_args(cli.build_parser().parse_args(["--mesh", "cpu8-zero1"]), 8)
    assert train.parallel.zero == 1
    args = types.SimpleNamespace(
        mesh="cpu8-zero1", tensor_mode=None, tensor_depth=None, seq_mode=None
    )
    sampling = generate.parallel_from_args(args, 8)
    assert sampling.axis_sizes == train.parallel.axis_sizes and sampling.zero == 0
    ring = parallel_config("data=2,seq=4", 8)
    assert ring.seq_mode == "ring" and ring.seq == 4
    assert parallel_config("cpu8-ring", 8, seq_mode="ulysses").seq_mode == "ulysses"
    gen = generate.build_parser().parse_args(
        ["--checkpoint-dir", "x", "--prompt", "p", "--mesh", "tensor=4", "--tensor-mode", "2d"]
    )
    assert generate.parallel_from_args(gen, 4).tensor_mode == "2d"
    assert set(_flags(generate.build_parser())) >= {"--mesh", "--devices", "--tensor-depth"}
