"""Sampling from a checkpoint (scripts/generate.py): a tiny GPT trained for a few steps here,
sampled twice with one seed (the same text), greedily on one device (each token the argmax of
the plain forward) and on a sequence- and tensor-parallel mesh through the command line (the
same text: the window's zigzag layout and the layout's kernels change nothing)."""

from __future__ import annotations

import dataclasses

import pytest

from colossal_jax.config import ConfigError
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from colossal_jax.training.trainer import train

    directory = tmp_path_factory.mktemp("gen") / "ckpt"
    cfg = dataclasses.replace(
        tiny_config(steps=3, batch_size=4, devices=1), checkpoint_dir=str(directory), eval_every=0
    )
    train(cfg, progress=False, log=lambda _: None)
    return str(directory)


def test_sampling_decodes_and_is_deterministic_for_a_seed(checkpoint):
    from colossal_jax.generate import Sampler, Sampling

    sampler = Sampler(checkpoint, devices=1)
    first = sampler.sample_ids("def ", Sampling(max_new_tokens=24, seed=3, top_k=50))
    again = sampler.sample_ids("def ", Sampling(max_new_tokens=24, seed=3, top_k=50))
    other = sampler.sample_ids("def ", Sampling(max_new_tokens=24, seed=4, top_k=50))
    assert first == again and first != other
    (ids,) = first
    assert ids[:4] == list(b"def ") and len(ids) == 28 and all(0 <= t < 256 for t in ids)
    text = sampler.sample("def ", Sampling(max_new_tokens=24, seed=3, top_k=50))[0]
    assert isinstance(text, str) and text.startswith("def ")
    assert text == bytes(ids).decode("utf-8", errors="replace")
    with pytest.raises(ConfigError, match="--temperature -1.0 must be"):
        sampler.sample("def ", Sampling(temperature=-1.0))


def test_greedy_on_a_ring_and_tensor_mesh_matches_one_device(checkpoint, capsys):
    import jax
    import numpy as np

    from colossal_jax.generate import Sampler, Sampling, forward, main

    greedy = Sampling(max_new_tokens=12, temperature=0.0)
    sampler = Sampler(checkpoint, devices=1)
    (ids,) = sampler.sample_ids("import ", greedy)
    # each greedy token is the argmax of the plain forward's logits at the token before it
    run, params, _ = sampler._build(1, len(ids), greedy)
    tokens = np.asarray([ids], np.int32)
    logits = jax.jit(forward(run))(params, tokens, np.arange(len(ids), dtype=np.int32)[None])
    assert np.asarray(logits)[0, 6:-1].argmax(-1).tolist() == ids[7:]
    want = sampler.sample("import ", greedy)[0]
    argv = ["--checkpoint-dir", checkpoint, "--prompt", "import ", "--max-new-tokens", "12"]
    mesh = ["--devices", "4", "--mesh", "seq=2,tensor=2", "--tensor-mode", "1d"]
    assert main([*argv, "--temperature", "0", *mesh]) == 0
    assert capsys.readouterr().out == want + "\n"
    assert main([*argv, "--top-k", "0"]) == 2
    assert "--top-k 0 must be between 1 and the vocabulary size 256" in capsys.readouterr().err
