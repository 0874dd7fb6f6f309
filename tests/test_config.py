"""Mesh strings, presets and configuration errors, without compiling anything."""

import pytest

from colossal_jax.config import ConfigError, ParallelConfig, list_presets, parse_mesh


def test_mesh_string_fills_data_with_remaining_devices():
    assert parse_mesh("tensor_row=2,tensor-col=2", 8) == {
        "tensor_row": 2,
        "tensor_col": 2,
        "data": 2,
    }
    assert parse_mesh(None, 8) == {"data": 8}


@pytest.mark.parametrize(
    "mode,depth,expected",
    [
        ("1d", None, {"tensor_row": 4}),
        ("2d", None, {"tensor_row": 2, "tensor_col": 2}),
        ("2.5d", 2, {"tensor_row": 2, "tensor_col": 2, "tensor_depth": 2}),
        ("3d", None, {"tensor_row": 2, "tensor_col": 2, "tensor_depth": 2}),
    ],
)
def test_tensor_shorthand_is_factored_by_mode(mode, depth, expected):
    size = 8 if mode in ("2.5d", "3d") else 4
    sizes = parse_mesh(f"tensor={size}", 8, tensor_mode=mode, tensor_depth=depth)
    assert {k: v for k, v in sizes.items() if k != "data"} == expected


@pytest.mark.parametrize(
    "spec,match",
    [
        ("dta=8", "did you mean 'data'"),
        ("data=x", "must be an integer"),
        ("data=0", "at least 1"),
        ("tensor_row=3", "does not divide"),
        ("nosuchpreset", "presets"),
    ],
)
def test_bad_mesh_strings_name_the_value(spec, match):
    with pytest.raises(ConfigError, match=match):
        parse_mesh(spec, 8)


def test_shorthand_rejects_non_square_2d():
    with pytest.raises(ConfigError, match="not a square"):
        parse_mesh("tensor=8", 8, tensor_mode="2d")


@pytest.mark.parametrize(
    "cfg,match",
    [
        (ParallelConfig(data=3), "has 3 devices but 8"),
        (ParallelConfig(data=2, tensor_row=4), "--tensor-mode is none"),
        (
            ParallelConfig(data=2, tensor_row=2, tensor_col=1, tensor_depth=2, tensor_mode="2d"),
            "square grid",
        ),
        (
            ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=1, data=2, tensor_mode="3d"),
            "cube",
        ),
        (ParallelConfig(pipe=2, data=4, pipeline="none"), "needs a schedule"),
        (ParallelConfig(pipe=4, data=2, microbatches=2), "--microbatches 2"),
        (ParallelConfig(data=4, seq=2), "--seq-mode"),
        (ParallelConfig(data=8, zero=4), "--zero 4"),
    ],
)
def test_impossible_parallel_configs(cfg, match):
    with pytest.raises(ConfigError, match=match):
        cfg.validate(8)


def test_presets_parse():
    names = list_presets()
    assert names, "meshes/ ships presets"
    for name in names:
        sizes = parse_mesh(name, 8)
        axes = {k: v for k, v in sizes.items() if k not in ("tensor_mode", "seq_mode", "zero")}
        total = 1
        for v in axes.values():
            total *= v
        assert total == 8, name
