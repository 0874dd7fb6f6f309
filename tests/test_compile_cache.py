"""The persistent compilation cache is turned off for ring attention on the CPU backend (where a
step loaded from it deadlocks) and left alone otherwise."""

import jax
import pytest

from colossal_jax.runtime.compile_cache import cache_safe_for


@pytest.fixture
def cache_dir(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", before)


def test_ring_on_cpu_turns_the_cache_off_and_back_on(cache_dir):
    assert jax.config.jax_enable_compilation_cache
    with cache_safe_for("ring", "cpu") as note:
        assert not jax.config.jax_enable_compilation_cache
        assert "compiles afresh" in note
    assert jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize(
    ("seq_mode", "platform"), [("ulysses", "cpu"), ("none", "cpu"), ("ring", "gpu")]
)
def test_other_runs_keep_the_cache(cache_dir, seq_mode, platform):
    with cache_safe_for(seq_mode, platform) as note:
        assert note is None
        assert jax.config.jax_enable_compilation_cache


def test_without_a_cache_nothing_changes():
    assert not jax.config.jax_compilation_cache_dir
    with cache_safe_for("ring", "cpu") as note:
        assert note is None
