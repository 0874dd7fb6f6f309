"""colossal_jax.config: one owner for every device-free rule, importable and run before JAX."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ConfigError, ParallelConfig
from colossal_jax.config.parallel_rules import check_grid
from colossal_jax.config.plan import Devices
from colossal_jax.config.tensor_split import batch_shards, check_kv_heads, model_divisors, split_of
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout

ROOT = Path(__file__).resolve().parent.parent


def _fresh_python(code: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_rules_imports_no_jax():
    code = """
        import sys
        import colossal_jax.config, colossal_jax.config.families as f; f.MODELS["gpt2-tiny"]
        print('jax' in sys.modules, 'flax' in sys.modules)
    """
    assert _fresh_python(code) == "False False"


@pytest.mark.parametrize(
    "argv",
    [
        ["--mesh", "data=2,tensor=4", "--tensor-mode", "1d", "--set", "model.n_head=6"],
        ["--batch-size", "7", "--mesh", "data=8"],
        [
            "--mesh",
            "data=2,seq=4",
            "--seq-mode",
            "ulysses",
            "--set",
            "model.n_head=6",
            "--set",
            "model.n_embd=96",
        ],
        ["--mesh", "data=2,tensor=4", "--tensor-mode", "1d", "--set", "model.vocab_size=250"],
        ["--devices", "8", "--mesh", "pipe=2", "--set", "model.n_layer=3"],
    ],  # fmt: skip
)
def test_cli_refuses_before_jax_starts(argv):
    code = f"""
        import sys
        from colossal_jax.cli import main
        rc = main({argv!r} + ["--no-progress"])
        print(rc, 'jax' in sys.modules)
    """
    assert _fresh_python(code) == "2 False"


MESHES = [
    ("none", dict(data=8)),
    ("none", dict(data=2, seq=4, seq_mode="ring")),
    ("1d", dict(data=2, tensor_row=4)),
    ("1d", dict(tensor_row=2, tensor_col=2, tensor_depth=2)),
    ("2d", dict(data=2, tensor_row=2, tensor_col=2)),
    ("2d", dict(data=1, tensor_row=2, tensor_col=2, seq=2, seq_mode="ring")),
    ("2.5d", dict(tensor_row=2, tensor_col=2, tensor_depth=2)),
    ("2.5d", dict(data=2, tensor_row=2, tensor_col=2, tensor_depth=1)),
    ("3d", dict(tensor_row=2, tensor_col=2, tensor_depth=2)),
    ("3d", dict(data=1, tensor_row=1, tensor_col=1, tensor_depth=1)),
]


@pytest.mark.parametrize("mode,axes", MESHES)
def test_rules_agree_with_the_layouts(mode, axes):
    """The layouts own the specs; the rules' numbers must be the ones those specs imply."""
    par = ParallelConfig(tensor_mode=mode, **axes)
    layout = make_layout(par, build_mesh(par, jax.devices()[: par.size]))
    split = split_of(par)
    assert batch_shards(par) == layout.batch_divisor()
    assert split.divisor("heads") == layout.axis_size(layout.wide_spec()[2])
    embedding = layout.embedding_spec()
    assert split.divisor("vocab size") == layout.axis_size(embedding[0] if embedding else None)
    assert split == layout.tensor_split()
    assert model_divisors(par) == split.divisors


@pytest.mark.parametrize(
    "mode,r,c,d,match",
    [
        ("2d", 2, 1, 1, "square grid"),
        ("2.5d", 2, 4, 2, "tensor_row == tensor_col"),
        ("3d", 2, 2, 1, "cube"),
    ],
)
def test_one_grid_rule_for_configs_and_layouts(mode, r, c, d, match):
    with pytest.raises(ConfigError, match=match):
        check_grid(mode, r, c, d)


def test_resolve_runs_the_run_rules_and_the_memory_floor_where_known():
    from colossal_jax.config import TrainConfig

    with pytest.raises(ConfigError, match="4 batch shards"):
        resolve(TrainConfig(batch_size=6, parallel=ParallelConfig(data=4)), 4)
    cfg = TrainConfig(batch_size=8, parallel=ParallelConfig(data=4))
    resolve(cfg, 4)  # a count alone: the memory is unknown, its floor not asked
    with pytest.raises(ConfigError, match="a device has 0.0 GB"):
        resolve(cfg, Devices(4, memory_bytes=1000))


@pytest.mark.parametrize(
    "mode,heads,kv,split,depth,match",
    [
        (
            "1d",
            8,
            4,
            8,
            1,
            r"1d splits attention heads 8 ways, but kv_heads=4 .*tensor ∈ \{1, 2, 4\}",
        ),
        ("2d", 8, 2, 4, 1, r"kv_heads=2 is not divisible by 4.*tensor \(q×q\) ∈ \{1, 4\}"),
        ("2.5d", 8, 1, 2, 2, r"kv_heads=1 .*depth=2\) ∈ \{2\}"),
        ("3d", 8, 1, 2, 1, r"kv_heads=1 .*tensor \(q×q×q\) ∈ \{1\}"),
        ("none", 8, 3, 1, 1, r"kv_heads=3 must divide heads=8 .*n_kv_head=2 or 4"),
    ],  # fmt: skip
)
def test_kv_heads_rule_names_the_value_and_valid_tensor_sizes(mode, heads, kv, split, depth, match):
    with pytest.raises(ConfigError, match=match):
        check_kv_heads(mode, heads, kv, split, depth)
    check_kv_heads(mode, heads, heads, split, depth)  # multi-head attention fits


def test_layout_validate_checks_kv_heads():
    par = ParallelConfig(tensor_row=8, tensor_mode="1d")
    layout = make_layout(par, build_mesh(par, jax.devices()[:8]))
    layout.validate(hidden=64, mlp=256, heads=8, vocab=256, kv_heads=8)
    with pytest.raises(ConfigError, match="kv_heads=2"):
        layout.validate(hidden=64, mlp=256, heads=8, vocab=256, kv_heads=2)
