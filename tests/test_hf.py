"""The Hugging Face bridge (GPT-2): a randomly initialised ``transformers.GPT2LMHeadModel``
imported into our GPT gives its logits on one device and in tensor-parallel meshes; our
checkpoint exported and imported again is bit for bit the same, and ``transformers`` computes
our logits from the export. No hub download: models are made here and saved to temp dirs."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face bridge tests need transformers (pip install .[hf])"
)
torch = pytest.importorskip("torch", reason="the Hugging Face bridge tests need torch")

from colossal_jax.checks.validate import size_model  # noqa: E402
from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig  # noqa: E402
from colossal_jax.hf.checks import check_init_from_hf, model_overrides  # noqa: E402

HF_SHAPE = {"vocab_size": 128, "n_positions": 32, "n_embd": 64, "n_layer": 2, "n_head": 4}
SEQ = 16


def _config(directory, parallel: ParallelConfig | None = None, **kw) -> TrainConfig:
    parallel = parallel or ParallelConfig()
    return TrainConfig(
        init_from_hf=str(directory),
        data="synthetic",
        batch_size=4,
        seq_len=SEQ,
        devices=parallel.size,
        parallel=parallel,
        **kw,
    )


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random GPT-2 (biases and norms perturbed away from 0/1, so each map is exercised),
    saved with save_pretrained, and its logits on a fixed batch."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(**HF_SHAPE, bos_token_id=None, eos_token_id=None)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf") / "gpt2"
    model.save_pretrained(path)
    tokens = np.random.default_rng(0).integers(0, HF_SHAPE["vocab_size"], (4, SEQ), np.int32)
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long()).logits.numpy()
    return path, tokens, logits


def _flat(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(tree)}


def _logits(run, params, tokens):
    from colossal_jax.generate import forward

    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    place = lambda x: jax.device_put(np.ascontiguousarray(x), run.batch_sharding)
    return np.asarray(jax.jit(forward(run))(params, place(tokens), place(positions)))


@pytest.mark.parametrize(
    "parallel",
    [
        ParallelConfig(),
        ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
        ParallelConfig(tensor_row=2, tensor_mode="1d"),
    ],
    ids=["one-device", "tensor4-2d", "tensor2-1d"],
)
def test_imported_gpt2_logits_match_transformers(hf_dir, parallel):
    from colossal_jax.hf.load import load_params
    from colossal_jax.training.run import build, init_state

    path, tokens, want = hf_dir
    run = build(_config(path, parallel))
    assert run.model.n_layer == 2 and run.model.block_size == 32 and run.model.vocab_size == 128
    if parallel.size == 1:
        params, opt_state = init_state(run)  # the training hook: init_state reads the directory
        assert jax.tree.leaves(opt_state)
    else:
        params = load_params(run)
    for leaf, sharding in zip(
        jax.tree.leaves(params), jax.tree.leaves(run.param_shardings), strict=True
    ):
        assert leaf.sharding == sharding  # placed straight into the run's shardings
    got = _logits(run, params, tokens)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    mesh = f"{parallel.size} devices, tensor mode {parallel.tensor_mode}"
    print(f"gpt2 {mesh}: max |logit difference| {np.abs(got - want).max():.3g}")


def test_export_then_import_is_bit_exact_and_transformers_agrees(hf_dir, tmp_path):
    """Our own random init (untied head ≠ embedding) saved as a checkpoint, exported, loaded by
    transformers (same logits) and imported again (same bits)."""
    from colossal_jax.hf.load import load_params
    from colossal_jax.hf_export import main as export_main
    from colossal_jax.training.checkpoint import Checkpointer
    from colossal_jax.training.hooks.checkpoint import checkpoint_meta as _meta
    from colossal_jax.training.run import build, init_state

    _, tokens, _ = hf_dir
    arch = {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 32, "vocab_size": 128}
    cfg = TrainConfig(model_overrides=arch, data="synthetic", batch_size=4, seq_len=SEQ, devices=1)
    run = build(cfg)
    params, opt_state = init_state(run)
    ckpt = Checkpointer(tmp_path / "ckpt", 1)
    ckpt.save(3, {"params": params, "opt_state": opt_state}, _meta(cfg, 3, run.model), force=True)
    ckpt.close()

    out = tmp_path / "exported"
    assert export_main([str(tmp_path / "ckpt"), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["colossal_jax"]["step"] == 3

    back = load_params(build(dataclasses.replace(cfg, model_overrides={}, init_from_hf=str(out))))
    mine, again = _flat(params), _flat(back)
    assert mine.keys() == again.keys()
    for k in mine:
        assert mine[k].dtype == again[k].dtype and np.array_equal(mine[k], again[k]), k

    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert isinstance(model, transformers.GPT2LMHeadModel)
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens).long()).logits.numpy()
    np.testing.assert_allclose(_logits(run, params, tokens), theirs, atol=1e-4, rtol=0)


def test_other_file_layouts_load_the_same_parameters(hf_dir, tmp_path):
    """Shards with an index, a base-model ``pytorch_model.bin`` (no ``transformer.`` prefix,
    with the causal-mask buffers old checkpoints hold) and bf16 weights (cast up)."""
    import shutil

    from colossal_jax.hf.load import load_params
    from colossal_jax.training.run import build

    path, _, _ = hf_dir
    model = transformers.GPT2LMHeadModel.from_pretrained(path)
    model.save_pretrained(tmp_path / "shards", max_shard_size="100KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    (tmp_path / "bin").mkdir()
    shutil.copy(path / "config.json", tmp_path / "bin")
    base = dict(model.transformer.state_dict())
    base["h.0.attn.bias"] = torch.tril(torch.ones(32, 32))[None, None]
    torch.save(base, tmp_path / "bin" / "pytorch_model.bin")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")

    def flat(directory):
        params = load_params(build(_config(directory)))
        return {
            jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(params)
        }

    want = flat(path)
    for name in ("shards", "bin"):
        got = flat(tmp_path / name)
        assert all(np.array_equal(got[k], want[k]) for k in want), name
    import ml_dtypes

    got = flat(tmp_path / "bf16")
    for k in want:
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], want[k].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_directory_rules(hf_dir, tmp_path):
    path, _, _ = hf_dir
    # the directory sets the architecture; --set may repeat it, not contradict it
    assert model_overrides(_config(path, model_overrides={"n_layer": 2}))["n_embd"] == 64
    with pytest.raises(ConfigError, match=r"--set model.n_layer=3 contradicts --init-from-hf"):
        check_init_from_hf(_config(path, model_overrides={"n_layer": 3}))
    with pytest.raises(ConfigError, match="is not a directory"):
        check_init_from_hf(_config(tmp_path / "missing"))

    other = tmp_path / "relu"
    other.mkdir()
    config = json.loads((path / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ConfigError, match="activation_function='relu'.*'gelu_new'"):
        check_init_from_hf(_config(other))
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no weights"):
        check_init_from_hf(_config(other))
    (other / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    with pytest.raises(ConfigError, match="'t5' model.*mapped families are bert, gpt2"):
        check_init_from_hf(_config(other))
    with pytest.raises(ConfigError, match="has token ids up to 255.*vocabulary of 128"):
        cfg = dataclasses.replace(_config(path), data="stdlib")
        size_model(cfg, model_overrides(cfg), 256)


def test_cli_flag_reports_a_bad_directory(tmp_path, capsys):
    from colossal_jax.cli import main

    assert main(["--init-from-hf", str(tmp_path), "--devices", "8", "--steps", "1"]) == 2
    assert "has no config.json" in capsys.readouterr().err
