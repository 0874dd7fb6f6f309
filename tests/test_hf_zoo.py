"""The Hugging Face bridge for the zoo's other families (LLaMA, BERT, ViT): a randomly initialised
tiny ``transformers`` model imported into ours gives its logits (fp32, 1e-4) on one device and
in a ``tensor=4 --tensor-mode 2d`` mesh; our checkpoint of it exported by ``export_hf`` holds the
HF tensors bit for bit and imports back bit for bit. No hub download: models are made here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
import pytest

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face bridge tests need transformers (pip install .[hf])"
)
torch = pytest.importorskip("torch", reason="the Hugging Face bridge tests need torch")

from colossal_jax.config import ParallelConfig, TrainConfig  # noqa: E402

BATCH = 4
MESHES = {
    "one-device": ParallelConfig(),
    "tensor4-2d": ParallelConfig(tensor_row=2, tensor_col=2, tensor_mode="2d"),
}


@dataclass(frozen=True)
class Case:
    """One family: our model name, its HF model, the data its run takes, a batch for both."""

    model: str
    data: str
    seq: int
    hf_model: Callable[[], object]
    batch: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray, dict]]
    """rng -> (our tokens, our positions, HF forward kwargs)"""
    compare: Callable[[np.ndarray], np.ndarray] = lambda logits: logits
    """our logits -> the part HF computes"""


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.LlamaForCausalLM(config)


def _text_batch(vocab: int, seq: int):
    def batch(rng):
        tokens = rng.integers(0, vocab, (BATCH, seq), np.int32)
        positions = np.broadcast_to(np.arange(seq, dtype=np.int32), tokens.shape)
        return tokens, positions, {"input_ids": torch.from_numpy(tokens).long()}

    return batch


def _bert():
    config = transformers.BertConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        type_vocab_size=2,
    )
    return transformers.BertForMaskedLM(config)


def _bert_batch(rng):
    """``[CLS] A [SEP] B [SEP]`` with our special ids (the last four of 128); HF is given the
    token types our model computes from the ``[SEP]`` tokens."""
    from colossal_jax.data.masked_lm import SpecialTokens

    special = SpecialTokens.of(128)
    tokens = rng.integers(0, special.cls, (BATCH, 16), np.int32)
    tokens[:, 0], tokens[:, 6], tokens[:, 15] = special.cls, special.sep, special.sep
    tokens[1, 3] = special.mask
    types = (np.cumsum(tokens == special.sep, axis=1) - (tokens == special.sep)).clip(max=1)
    positions = np.broadcast_to(np.arange(16, dtype=np.int32), tokens.shape)
    inputs = {
        "input_ids": torch.from_numpy(tokens).long(),
        "token_type_ids": torch.from_numpy(types).long(),
    }
    return tokens, positions, inputs


def _vit():
    config = transformers.ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )
    return transformers.ViTForImageClassification(config)


def _image_batch(rng):
    from colossal_jax.data.images import patchify

    images = rng.standard_normal((BATCH, 8, 8, 3)).astype(np.float32)
    patches = patchify(images, 4)
    tokens = np.concatenate([np.zeros_like(patches[:, :1]), patches], axis=1)  # class slot first
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape[:2])
    return tokens, positions, {"pixel_values": torch.from_numpy(images.transpose(0, 3, 1, 2))}


CASES = {
    "bert": Case("bert-tiny", "synthetic", 16, _bert, _bert_batch),
    "llama": Case("llama-tiny", "synthetic", 16, _llama, _text_batch(128, 16)),
    "vit": Case("vit-tiny", "shapes", 5, _vit, _image_batch, lambda x: x[:, 0, :10]),
}


def _perturb(model) -> None:
    """Norm weights and biases away from 1/0, so each map is exercised."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower() or "token" in name:
                p.add_(0.2 * torch.randn_like(p))


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    """(case, HF directory, our batch, HF logits) of one family."""
    case = CASES[request.param]
    torch.manual_seed(0)
    model = case.hf_model().eval()
    _perturb(model)
    path = tmp_path_factory.mktemp("hf") / request.param
    model.save_pretrained(path)
    tokens, positions, inputs = case.batch(np.random.default_rng(0))
    with torch.no_grad():
        logits = model(**inputs).logits.numpy()
    return case, path, (tokens, positions), logits


def _config(case: Case, directory, parallel: ParallelConfig) -> TrainConfig:
    return TrainConfig(
        model=case.model,
        init_from_hf=str(directory),
        data=case.data,
        batch_size=BATCH,
        seq_len=case.seq,
        devices=parallel.size,
        parallel=parallel,
    )


def _logits(run, params, tokens, positions):
    from colossal_jax.generate import forward

    place = lambda x: jax.device_put(np.ascontiguousarray(x), run.batch_sharding)
    return np.asarray(jax.jit(forward(run))(params, place(tokens), place(positions)))


def _flat(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree.leaves_with_path(tree)}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_imported_logits_match_transformers(family, mesh):
    from colossal_jax.hf.load import load_params
    from colossal_jax.training.run import build

    case, path, (tokens, positions), want = family
    run = build(_config(case, path, MESHES[mesh]))
    params = load_params(run)
    got = case.compare(_logits(run, params, tokens, positions))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    print(f"{case.model} {mesh}: max |logit difference| {np.abs(got - want).max():.3g}")


def test_export_round_trips_bit_for_bit(family, tmp_path):
    """Import, save as our checkpoint, export: the HF tensors come back bit for bit, and
    ``transformers`` loads the export as the family's architecture; importing the export gives
    our parameters bit for bit."""
    from colossal_jax.hf import family as hf_family
    from colossal_jax.hf.load import load_params
    from colossal_jax.hf.tensors import read_tensors
    from colossal_jax.hf_export import main as export_main
    from colossal_jax.training.checkpoint import Checkpointer
    from colossal_jax.training.hooks.checkpoint import checkpoint_meta as _meta
    from colossal_jax.training.run import build, init_state

    case, path, (tokens, positions), want = family
    cfg = _config(case, path, MESHES["one-device"])
    run = build(cfg)
    params, opt_state = init_state(run)
    ckpt = Checkpointer(tmp_path / "ckpt", 1)
    ckpt.save(2, {"params": params, "opt_state": opt_state}, _meta(cfg, 2, run.model), force=True)
    ckpt.close()
    out = tmp_path / "exported"
    assert export_main([str(tmp_path / "ckpt"), str(out)]) == 0

    original, exported = read_tensors(path), read_tensors(out)
    assert original.keys() == exported.keys()
    for name, value in original.items():
        assert np.array_equal(value, exported[name]), name

    back = load_params(build(dataclasses.replace(cfg, init_from_hf=str(out))))
    mine, again = _flat(params), _flat(back)
    assert mine.keys() == again.keys()
    for k in mine:
        assert mine[k].dtype == again[k].dtype and np.array_equal(mine[k], again[k]), k

    config = json.loads((out / "config.json").read_text())
    module = hf_family(config["model_type"])
    model = getattr(transformers, module.AUTO_CLASS).from_pretrained(out).eval()
    assert type(model).__name__ == module.ARCHITECTURE


def test_bert_sep_token_is_set_by_the_directory_or_by_set(tmp_path):
    """A BERT ``config.json`` without ``sep_token_id`` leaves ``model.sep_token`` to ``--set``
    (a WordPiece vocabulary's 102); one with it sets it, and a different ``--set`` is refused."""
    from colossal_jax.config import ConfigError
    from colossal_jax.hf.checks import model_overrides

    config = transformers.BertConfig(vocab_size=128, hidden_size=64).to_dict()
    config["model_type"] = "bert"
    (tmp_path / "model.safetensors").write_bytes(b"")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    cfg = TrainConfig(model="bert-tiny", init_from_hf=str(tmp_path))
    assert "sep_token" not in model_overrides(cfg)
    cfg = dataclasses.replace(cfg, model_overrides={"sep_token": 102})
    assert model_overrides(cfg)["sep_token"] == 102
    path.write_text(json.dumps({**config, "sep_token_id": 102}))
    assert model_overrides(dataclasses.replace(cfg, model_overrides={}))["sep_token"] == 102
    with pytest.raises(ConfigError, match="model.sep_token=3 contradicts"):
        model_overrides(dataclasses.replace(cfg, model_overrides={"sep_token": 3}))
