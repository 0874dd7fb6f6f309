"""The model registry: every family's sizes listed with their task and parameter count (the
count the built module has), the README table generated from it, each family's training
defaults, and the task rules that refuse a misfit before JAX."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from colossal_jax import cli
from colossal_jax.checks.resolve import resolve
from colossal_jax.checks.validate import size_model
from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig
from colossal_jax.config import families as registry

ROOT = Path(__file__).resolve().parent.parent


def test_list_models_names_every_model_with_family_and_task(capsys):
    assert cli.main(["--list-models"]) == 0
    out = capsys.readouterr().out.splitlines()
    for name in registry.MODELS:
        family = registry.family_of(name)
        line = next(x for x in out if x.startswith(f"{name} "))
        assert f" {family.name} " in line and f" {family.task} " in line, line
    assert set(registry.FAMILIES) >= {"gpt", "bert", "vit", "llama"}
    vit = next(x for x in out if x.startswith("vit-base "))
    assert " 86.58M" in vit  # ViT-B/16, 86M in the paper


@pytest.mark.parametrize("name", ["bert-tiny", "bert-base", "vit-tiny", "vit-huge"])
def test_param_count_is_the_modules(name):
    family = registry.family_of(name)
    cfg = registry.MODELS[name]
    if name == "bert-tiny":
        cfg = dataclasses.replace(cfg, type_vocab_size=2, vocab_size=320)
    state = nnx.state(nnx.eval_shape(lambda: family.build(cfg, rngs=nnx.Rngs(0))))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state)) == cfg.param_count()


def test_readme_model_table_is_the_registrys():
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "model_table.py"))
    readme = (ROOT / "README.md").read_text()
    assert script["replaced"](readme, cli.model_table()) == readme, (
        "README's model table is stale: python scripts/model_table.py --write README.md"
    )


def test_family_training_defaults_apply_unless_given():
    args = cli.build_parser().parse_args(["--model", "vit-tiny"])
    cfg = cli.config_from_args(args, 8)
    assert (cfg.seq_len, cfg.data, cfg.batch_size, cfg.steps) == (5, "digits", 120, 200)
    args = cli.build_parser().parse_args(["--model", "vit-tiny", "--steps", "7", "--lr", "1e-3"])
    cfg = cli.config_from_args(args, 8)
    assert (cfg.steps, cfg.optim.lr, cfg.seq_len) == (7, 1e-3, 5)
    gpt = cli.config_from_args(cli.build_parser().parse_args([]), 8)
    assert (gpt.seq_len, gpt.data, gpt.steps) == (128, "stdlib", 200)
    cfg = TrainConfig.for_model("vit-base", steps=3)
    assert (cfg.seq_len, cfg.data, cfg.steps) == (197, "shapes", 3)
    args = cli.build_parser().parse_args(["--model", "vit-tiny", "--set", "model.n_layer=3"])
    assert cli.config_from_args(args, 8).model_overrides == {"n_layer": 3}


def _check(**fields) -> None:
    cfg = TrainConfig.for_model(**fields)
    resolve(cfg, cfg.parallel.size)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(model="vit-tiny", seq_len=17), "use --seq-len 5"),
        (dict(model="vit-base", data="digits"), "use --data shapes"),
        (dict(model="vit-tiny", data="stdlib"), "use --data digits"),
        (dict(model="gpt2-tiny", data="digits"), "trains on text"),
        (
            dict(
                model="bert-base",
                parallel=ParallelConfig(seq=4, seq_mode="ring"),
                seq_len=64,
            ),
            "model.type_vocab_size=0",
        ),
        (dict(model="bert-tiny", seq_len=4), "--seq-len 5"),
        (dict(model="vit-tiny", model_overrides={"patch_size": 3}), "patch_size=2 or 4"),
        (dict(model="bert-tiny", model_overrides={"type_vocab_size": -1}), "integer ≥ 0"),
    ],
)
def test_task_rules_name_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message):
        _check(**fields)


def test_runs_the_rules_accept():
    _check(model="vit-tiny")
    _check(model="bert-tiny", parallel=ParallelConfig(seq=4, seq_mode="ulysses"), seq_len=64)
    _check(model="bert-base", seq_len=64)  # 320-token vocabulary: splits 64 ways
    assert size_model(TrainConfig(model="bert-tiny"), {}, 256).vocab_size == 320


def test_register_refuses_a_taken_name():
    gpt = registry.FAMILIES["gpt"]
    with pytest.raises(ValueError, match="taken"):
        registry.register(dataclasses.replace(gpt, name="gpt-again"))
    with pytest.raises(KeyError, match="unknown"):
        registry.family_of("bert-huge")


def test_an_empty_registry_says_how_to_install(monkeypatch):
    """Run from a checkout that was never installed, no entry point registers the zoo: the
    message says how to install it instead of listing no models."""
    monkeypatch.setattr(registry.FAMILIES, "_table", {})
    monkeypatch.setattr(registry.MODELS, "_table", {})
    with pytest.raises(KeyError, match="no model family is registered.*pip install -e ."):
        registry.family_of("gpt2-tiny")


def test_gpt3_sizes_start_from_their_papers_learning_rate():
    """Brown et al. 2020, table 2.1 (1.3B: 2e-4); the command line's --lr still wins."""
    from colossal_jax.cli.configure import config_from_args
    from colossal_jax.cli.parser import build_parser
    from colossal_jax.config import TrainConfig

    assert TrainConfig.for_model("gpt3-xl").optim.lr == 2e-4
    assert TrainConfig.for_model("gpt3-175b").optim.lr == 6e-5
    assert TrainConfig.for_model("gpt2-small").optim.lr == 3e-3  # no paper figure: the default
    parse = build_parser().parse_args
    assert config_from_args(parse(["--model", "gpt3-xl"]), 8).optim.lr == 2e-4
    assert config_from_args(parse(["--model", "gpt3-xl", "--lr", "1e-3"]), 8).optim.lr == 1e-3
