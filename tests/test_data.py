"""The embedded corpus, user files, and deterministic resumable batches."""

import numpy as np
import pytest

from colossal_jax.config import ConfigError
from colossal_jax.data.corpus import Batches, decode, encode, load_corpus


def test_embedded_corpus_needs_no_download():
    c = load_corpus("stdlib")
    assert c.vocab_size == 256 and len(c.tokens) > 1_000_000
    assert "def " in decode(c.tokens[:5000])


def test_batches_are_a_function_of_seed_and_step():
    c = load_corpus("stdlib")
    a = Batches(c, 4, 16, seed=1, vocab_size=256)
    b = Batches(c, 4, 16, seed=1, vocab_size=256)
    np.testing.assert_array_equal(a.batch(7)["tokens"], b.batch(7)["tokens"])
    assert not np.array_equal(a.batch(7)["tokens"], a.batch(8)["tokens"])
    x = a.batch(3)
    np.testing.assert_array_equal(x["tokens"][:, 1:], x["targets"][:, :-1])


def test_layout_order_permutes_everything_alike():
    c = load_corpus("stdlib")
    order = np.array([0, 7, 1, 6, 2, 5, 3, 4])
    plain = Batches(c, 2, 8, seed=0, vocab_size=256).batch(0)
    perm = Batches(c, 2, 8, seed=0, vocab_size=256, layout_order=order).batch(0)
    for k in plain:
        np.testing.assert_array_equal(perm[k], plain[k][:, order])


def test_text_and_npy_files(tmp_path):
    t = tmp_path / "a.txt"
    t.write_text("hello world " * 100)
    assert decode(load_corpus(str(t)).tokens[:5]) == "hello"
    n = tmp_path / "a.npy"
    np.save(n, np.arange(1000) % 300)
    c = load_corpus(str(n))
    assert c.vocab_size == 300
    with pytest.raises(ConfigError, match="vocab_size=300"):
        Batches(c, 2, 8, seed=0, vocab_size=256)
    assert list(encode("ab")) == [97, 98]


def test_synthetic_tokens_stay_in_vocab():
    b = Batches(load_corpus("synthetic"), 2, 8, seed=0, vocab_size=50).batch(0)
    assert b["tokens"].max() < 50
