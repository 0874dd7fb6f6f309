"""Masked-LM and image batches: a pure function of (seed, step), BERT's masking statistics, the
class-token loss weights, and held-out images kept apart and each scored once."""

import numpy as np
import pytest

from colossal_jax.config import ConfigError
from colossal_jax.data import images
from colossal_jax.data.corpus import Corpus, encode, load_corpus, split_corpus
from colossal_jax.data.masked_lm import MASK_RATE, MaskedBatches, SpecialTokens, vocab_size_for


@pytest.fixture(scope="module")
def corpus():
    return split_corpus(load_corpus("stdlib"), 64)[0]


def test_masked_vocabulary_appends_four_special_tokens():
    assert vocab_size_for(256) == 320
    sp = SpecialTokens.of(320)
    assert (sp.cls, sp.sep, sp.mask, sp.pad) == (316, 317, 318, 319)
    with pytest.raises(ConfigError, match="model.vocab_size=320"):
        MaskedBatches(Corpus("text", encode("some text " * 10), 256), 2, 16, 0, vocab_size=258)


def test_masked_batches_are_a_function_of_seed_and_step(corpus):
    a = MaskedBatches(corpus, 4, 32, seed=3, vocab_size=320)
    resumed = MaskedBatches(corpus, 4, 32, seed=3, vocab_size=320)  # a restarted run
    for k in ("tokens", "targets", "weights"):
        np.testing.assert_array_equal(a.batch(5)[k], resumed.batch(5)[k])
    assert not np.array_equal(a.batch(5)["weights"], a.batch(6)["weights"])
    other_seed = MaskedBatches(corpus, 4, 32, seed=4, vocab_size=320)
    assert not np.array_equal(a.batch(5)["tokens"], other_seed.batch(5)["tokens"])


def test_masked_sequences_and_bert_masking_statistics(corpus):
    b, s = 512, 64
    batch = MaskedBatches(corpus, b, s, seed=0, vocab_size=320).batch(0)
    sp = SpecialTokens.of(320)
    tgt, tok, w = batch["targets"], batch["tokens"], batch["weights"]
    # [CLS] A [SEP] B [SEP]: one [CLS] first, two [SEP], the last at the end, both segments used
    assert (tgt[:, 0] == sp.cls).all() and (tgt[:, -1] == sp.sep).all()
    assert ((tgt == sp.sep).sum(1) == 2).all() and (tgt[:, 1] != sp.sep).all()
    assert (tgt[:, -2] != sp.sep).all() and (tgt < 256)[:, 1:-1].sum(1).min() == s - 3
    # round(15%) of the text tokens predicted per sequence, never a special token
    assert (w.sum(1) == round(MASK_RATE * (s - 3))).all()
    assert not (w * (tgt >= 256)).any()
    # unweighted positions are the original tokens; of the predicted: 80/10/10
    np.testing.assert_array_equal(tok[w == 0], tgt[w == 0])
    picked_in, picked_tgt = tok[w == 1], tgt[w == 1]
    n = len(picked_in)
    as_mask = np.mean(picked_in == sp.mask)
    kept = np.mean(picked_in == picked_tgt)
    replaced = 1 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.03 and abs(replaced - 0.1) < 0.02, (as_mask, kept, n)
    assert abs(kept - 0.1) < 0.02 + 1 / 256  # a random token may equal the original
    assert (picked_in[picked_in != sp.mask] < 256).all()


def test_masked_batches_follow_a_layout_order(corpus):
    order = np.random.default_rng(0).permutation(16)
    plain = MaskedBatches(corpus, 2, 16, seed=0, vocab_size=320).batch(1)
    perm = MaskedBatches(corpus, 2, 16, seed=0, vocab_size=320, layout_order=order).batch(1)
    for k in plain:
        np.testing.assert_array_equal(perm[k], plain[k][:, order])


def test_synthetic_masked_tokens_leave_room_for_the_special_tokens():
    batch = MaskedBatches(load_corpus("synthetic"), 4, 16, 0, vocab_size=64).batch(0)
    assert batch["targets"][:, 1:-1].max() <= SpecialTokens.of(64).sep


def _source():
    found = images.digits()
    return found if found is not None else images.generated(8, 1, 10)


def test_image_batches_put_the_loss_on_the_class_token():
    source = _source()
    train, held = images.split(source)
    batches = images.ImageBatches(source, train, 6, seed=1, patch_size=4)
    x = batches.batch(2)
    assert x["tokens"].shape == (6, 5, 16) and x["tokens"].dtype == np.float32
    assert (x["tokens"][:, 0] == 0).all()  # the class token's slot
    imgs, labels = source.examples(train[:1])
    np.testing.assert_array_equal(images.patchify(imgs, 4)[0, 1], imgs[0, :4, 4:8, 0].reshape(-1))
    np.testing.assert_array_equal(x["weights"][:, 0], 1.0)
    assert x["weights"][:, 1:].sum() == 0 and (x["targets"] < 10).all()
    np.testing.assert_array_equal(x["tokens"], batches.batch(2)["tokens"])  # resumable
    assert not np.array_equal(x["tokens"], batches.batch(3)["tokens"])


def test_held_out_images_are_disjoint_and_each_scored_once():
    source = _source()
    train, held = images.split(source)
    assert not set(train) & set(held) and len(train) + len(held) == len(source)
    assert len(held) == pytest.approx(images.HELD_OUT_FRACTION * len(source), abs=1)
    ev = images.ImageBatches(source, held, 64, seed=0, patch_size=4, ordered=True)
    n = ev.evaluation_batches(requested=1)
    weights = sum(ev.batch(i)["weights"][:, 0].sum() for i in range(n))
    assert n == -(-len(held) // 64) and weights == len(held)


def test_generated_images_are_fixed_and_sized_for_any_model():
    gen = images.generated(16, 3, 5)
    a, la = gen.examples(np.arange(10))
    b, lb = gen.examples(np.arange(10))
    assert a.shape == (10, 16, 16, 3) and np.array_equal(a, b) and list(la[:5]) == [0, 1, 2, 3, 4]
    # the same class is the same pattern, shifted, at its own contrast and noise
    same = np.corrcoef(a[0].ravel(), a[5].ravel())[0, 1]
    other = np.corrcoef(a[0].ravel(), a[1].ravel())[0, 1]
    assert same > other


def test_digits_fall_back_to_generated_images(monkeypatch):
    monkeypatch.setattr(images, "digits", lambda: None)
    source, note = images.load_images("digits", 8, 1, 10)
    assert "scikit-learn is not installed" in note and source.shape == (8, 8, 1)
